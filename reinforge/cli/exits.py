"""How the `reinforge` command ends, for the scripts and schedulers that run it (README, "How a
run ends").

    0      finished (any command that did its work)
    1      failed: an error ended the run or the command; status.json says "failed" and why
    2      refused before anything ran: bad usage or config (argparse's convention)
    128+N  stopped by signal N: 130 Ctrl-C (SIGINT), 143 SIGTERM, 129 SIGHUP; status.json says
           "interrupted" with the signal and the resume command

A stop by a signal ends the process *by that signal*, once the checkpoint and status.json are
written: the command restores the signal's default action and sends it to itself. That is the
convention for a program that catches a signal to clean up (Python does the same for a Ctrl-C no
handler caught; https://www.cons.org/cracauer/sigint.html): a shell reports $? = 128+N; a parent
process sees a death by the signal (Python's subprocess: returncode -N); a shell script or loop
stops at a Ctrl-C instead of going on to its next command; systemd counts it as a clean stop.
A code of its own for "stopped, resumable" would break all three, and tells a script nothing
128+N does not: every status above 128 (137, SIGKILL, included) means "resume it", and
status.json says from where.

Only the command line ends this way (``main()`` with no arguments, as the `reinforge` script and
``python -m reinforge.cli`` call it); ``main(argv)`` called from Python returns 128+N instead.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys

__all__ = ["FINISHED", "FAILED", "USAGE", "stopped_code", "end_process"]

FINISHED, FAILED, USAGE = 0, 1, 2


def stopped_code(signal_name: str | None) -> int:
    """128 + the signal's number ("SIGINT" when the name is None or not a signal's)."""
    try:
        return 128 + int(signal.Signals[signal_name])  # type: ignore[index]
    except KeyError:
        return 128 + int(signal.SIGINT)


def end_process(code: int) -> int:
    """End this process by the signal of ``code`` when it is 128+N for a signal that stops runs;
    otherwise return ``code`` (for ``sys.exit``). Before the signal: the output is flushed and the
    atexit handlers run (worker pools, learner ranks, exporters), as a normal exit would."""
    stops = {int(s) for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", signal.SIGTERM))}
    signum = code - 128
    if signum not in stops:
        return code
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a terminal that hung up, or a closed stream
            pass
    atexit._run_exitfuncs()
    signal.signal(signum, signal.SIG_DFL)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    return code  # not reached: the default action of these signals ends the process
