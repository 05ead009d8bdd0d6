"""Stopping a run on Ctrl-C, SIGTERM or SIGHUP without losing it.

Clusters stop jobs with SIGTERM and a kill timeout (Slurm, Kubernetes and Ray send SIGTERM, then
SIGKILL 30 s later by default); a person stops one with Ctrl-C; a closed terminal or ssh session
sends SIGHUP (the commonest way a long run dies). All three are handled alike:

- **during start-up** (config, model load, restore): the first signal stops at once with one
  line; nothing was trained, the status says "interrupted".
- **first signal in a step**: the step goes on; once it is done, its checkpoint is written and the
  status says "interrupted" with the resume command. If the step is still generating or scoring
  after ``trainer.stop_grace_s`` seconds, it is *abandoned*: nothing it changed survives (the
  learner's weights are untouched until the update, and the RNG and curriculum states are put
  back as they were when it began), so the checkpoint written is that of the step before and a
  resume repeats the abandoned step exactly. Once the update has started the step is finished
  instead: an update is short, and a half-applied one cannot be undone.
- **second signal**: stops at once (KeyboardInterrupt), except while a checkpoint is being
  written, which is finished first: the previous complete checkpoint stays the latest either way.

The update and the held-out evaluation are abandonable too: the learner checks between two
micro-batches of its first optimiser step of the step (nothing is applied before that step), and
an evaluation changes nothing until it is written. So a stop takes effect within the grace period
plus one micro-batch, however slow the machine.

Python runs a signal handler only between two bytecodes of the main thread, so a signal that
arrives during one long native call (a backward pass) would wait for it to return. A watcher
thread reads the signal from ``signal.set_wakeup_fd`` as soon as it arrives and, if the handler
has not run within half a second, says at once that the stop is coming.

After a SIGHUP the terminal is usually gone, and every write to it fails with EIO, which would turn
the orderly stop into a crash: :func:`detach_lost_terminal` points standard output and error at
/dev/null first (status.json records how the run ended and the resume command). A process started
under ``nohup`` ignores SIGHUP, and keeps ignoring it: it was asked to outlive its terminal.

The controller only sets flags and raises exceptions from the signal handler; the trainer marks
where a step may be abandoned (:meth:`StopControl.abandonable`) and where it must not be
interrupted (:meth:`StopControl.critical`).
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["StopControl", "StepAbandoned", "StartupInterrupted", "STOP_SIGNALS", "detach_lost_terminal",
           "handled_signals"]

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM) + ((signal.SIGHUP,) if hasattr(signal, "SIGHUP") else ())


def detach_lost_terminal() -> list[int]:
    """Point file descriptors 1 and 2 at /dev/null where they are a terminal that hung up (its
    ioctls fail with EIO, as every write does); returns those moved. A live terminal (a SIGHUP
    sent by hand), a pipe or a file is left as it is."""
    try:
        import termios
    except ImportError:  # no terminals to lose (Windows)
        return []
    moved = []
    for fd in (1, 2):
        try:
            termios.tcgetattr(fd)
            continue  # a live terminal
        except termios.error as err:
            if err.args[0] != errno.EIO:  # not a terminal (ENOTTY), or closed (EBADF)
                continue
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, fd)
        os.close(null)
        moved.append(fd)
    return moved


def handled_signals(signals) -> list:
    """``signals`` less a SIGHUP this process ignores: under ``nohup`` (or ``trap '' HUP``) the
    run was asked to outlive its terminal, and does."""
    hup = getattr(signal, "SIGHUP", None)
    return [s for s in signals if not (s == hup and signal.getsignal(s) == signal.SIG_IGN)]


class StepAbandoned(BaseException):
    """The grace period ran out while the step was still generating or scoring. A BaseException,
    like KeyboardInterrupt, so that the reward side's ``except Exception`` (a failing verifier
    scores 0 and the run goes on) does not take it for a reward error."""


class StartupInterrupted(KeyboardInterrupt):
    """A stop signal arrived before the first step began (imports, model load, restore)."""


class StopControl:
    """Signal handling of one run (see the module docstring). ``grace_s``: how long the step
    under way may take after the first signal before it is abandoned."""

    def __init__(self, grace_s: float, *, out=None):
        self.grace_s = float(grace_s)
        self.requested = False          # a first signal came: stop after this step
        self.signal_name: str | None = None
        self._out = out
        self._phase = "startup"         # startup | step | abandonable | critical
        self._grace_over = False
        self._abort_after_critical = False
        self._timer: threading.Timer | None = None
        self._timer_fired = threading.Event()  # set by the grace timer just before its wake-up signal
        self._saved: dict[int, object] = {}
        self._lock = threading.Lock()
        self._handled = 0               # signals the Python-level handler has run for
        self._timer_sent = 0            # wake-up signals the grace timer sent
        self._wakeup: tuple[int, int, int] | None = None  # (read fd, write fd, the previous wakeup fd)

    # -- installation --------------------------------------------------------------------------
    @contextmanager
    def installed(self) -> Iterator["StopControl"]:
        """Handle SIGINT, SIGTERM and SIGHUP inside the block (a no-op outside the main thread, where
        Python cannot install handlers; SIGHUP stays ignored where it is, see :func:`handled_signals`)."""
        if threading.current_thread() is threading.main_thread():
            for sig in handled_signals(STOP_SIGNALS):
                self._saved[sig] = signal.signal(sig, self._on_signal)
            self._start_watcher()
        try:
            yield self
        finally:
            with self._lock:  # the grace timer never fires into a restored handler
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                for sig, old in self._saved.items():
                    signal.signal(sig, old)
                self._saved.clear()
                self._stop_watcher()

    def _start_watcher(self) -> None:
        r, w = os.pipe()
        os.set_blocking(w, False)
        try:
            previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:  # not the main thread after all
            os.close(r), os.close(w)
            return
        self._wakeup = (r, w, previous)
        threading.Thread(target=self._watch, args=(r,), name="reinforge-signal-watcher", daemon=True).start()

    def _stop_watcher(self) -> None:
        if self._wakeup is None:
            return
        r, w, previous = self._wakeup
        self._wakeup = None
        signal.set_wakeup_fd(previous)
        os.close(w)  # the watcher's read returns b"" and it ends; it closes the read end

    def _watch(self, r: int) -> None:
        received = timer_seen = 0
        try:
            while True:
                data = os.read(r, 64)
                if not data:
                    return
                for signum in data:
                    if signum not in STOP_SIGNALS:
                        continue
                    if signum == signal.SIGTERM and timer_seen < self._timer_sent:
                        timer_seen += 1
                        continue  # the grace timer's own wake-up
                    if signum == getattr(signal, "SIGHUP", None):
                        detach_lost_terminal()  # before anything else writes to a terminal that is gone
                    received += 1
                    deadline = time.monotonic() + 0.5
                    while self._handled < received and time.monotonic() < deadline:
                        time.sleep(0.02)
                    if self._handled < received:  # the main thread is inside one long native call
                        self._say(f"{signal.Signals(signum).name} received: the stop takes effect when the "
                                  "computation under way reaches a safe point (the next micro-batch or "
                                  "decode step)")
                        received = self._handled
        except OSError:
            return
        finally:
            try:
                os.close(r)
            except OSError:
                pass

    # -- phases --------------------------------------------------------------------------------
    def steps_begin(self) -> None:
        """Start-up is over: from now on a first signal stops after the step under way."""
        self._phase = "step"

    @contextmanager
    def abandonable(self) -> Iterator[None]:
        """The block changes nothing the step's start state cannot restore (collect, score,
        prepare): past the grace period it is abandoned with StepAbandoned."""
        if self.requested and self._grace_over:
            raise StepAbandoned
        self._phase = "abandonable"
        try:
            yield
        finally:
            self._phase = "step"

    def check_abandon(self) -> None:
        """Raise StepAbandoned if a stop was asked for and its grace period is over: called by
        work that is safe to abandon at this point but runs in native calls the signal handler
        cannot interrupt (the learner, between two micro-batches before its optimiser step)."""
        if self.requested and self._grace_over:
            raise StepAbandoned

    @contextmanager
    def critical(self) -> Iterator[None]:
        """The block (a checkpoint write) is finished even if a second signal comes; the stop
        then happens when it ends."""
        previous, self._phase = self._phase, "critical"
        try:
            yield
        finally:
            self._phase = previous
            if self._abort_after_critical:
                self._abort_after_critical = False
                raise KeyboardInterrupt

    # -- the handler ---------------------------------------------------------------------------
    def _say(self, text: str) -> None:
        try:
            print(f"\nreinforge: {text}", file=self._out if self._out is not None else sys.stderr, flush=True)
        except OSError:  # a terminal that went away: the stop goes on, status.json says it
            pass

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if signum == getattr(signal, "SIGHUP", None):
            detach_lost_terminal()
        if self._grace_over and signum == signal.SIGTERM and self._timer_fired.is_set():
            self._timer_fired.clear()  # the grace timer's own wake-up, not a second signal
            if self._phase == "abandonable":
                raise StepAbandoned
            return  # the update is under way: it checks between micro-batches (check_abandon)
        self._handled += 1
        if self._phase == "startup":
            self.requested, self.signal_name = True, name
            raise StartupInterrupted(name)
        if self.requested:
            if self._phase == "critical":
                self._abort_after_critical = True
                self._say(f"{name} again: stopping as soon as the checkpoint being written is complete")
                return
            raise KeyboardInterrupt(name)
        self.requested, self.signal_name = True, name
        again = "Ctrl-C" if signum == signal.SIGINT else name
        if self.grace_s > 0:
            self._say(f"{name}: stopping after this step and writing a checkpoint (a step still generating "
                      f"after {self.grace_s:g} s is abandoned; {again} again stops at once)")
            self._start_timer()
        else:
            self._say(f"{name}: stopping and writing a checkpoint ({again} again stops at once)")
            self._grace_over = True
            if self._phase == "abandonable":
                raise StepAbandoned

    def _start_timer(self) -> None:
        def expire() -> None:
            with self._lock:
                if not self._saved:  # the handlers are gone: the run is over
                    return
                self._grace_over = True
                self._timer_fired.set()
                self._timer_sent += 1
                # A real signal, so that a main thread blocked in a wait wakes up (EINTR) and
                # runs the handler; the lock keeps the handlers installed until it is sent.
                signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)

        self._timer = threading.Timer(self.grace_s, expire)
        self._timer.daemon = True
        self._timer.start()
