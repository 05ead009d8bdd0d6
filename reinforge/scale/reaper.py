"""The local Ray cluster a run starts dies with the run, however the run ends.

``ray.init()`` starts the cluster's own processes (GCS, raylet, dashboard, monitors) as children
of the driver, and Ray has the kernel kill them when the driver dies. The rollout workers and
Ray's two agents are the raylet's children: after a SIGKILL of the driver the workers noticed
within 2-3 s, but the agents kept running for a minute (measured: 61 s), each waiting out a 60 s
timeout to report the raylet's death to the GCS that died with it. So a run that starts a local
cluster also starts this watchdog (``watch``): a small process in a session of its own that notes,
once a second, every process of the cluster (the driver's children that name the Ray session on
their command line, and everything under them) and, once the driver is gone (the pipe whose only
writer is the driver reads end-of-file, or the watchdog's parent changes), stops those still
running: SIGTERM, then SIGKILL after a second. On a normal end the driver shuts Ray down first and
then closes the pipe, so the watchdog only stops what the shutdown left. A cluster joined with
``scale.ray_address`` is not the run's and is never watched.

Run as a script (``python reaper.py SESSION_NAME``) it imports only the standard library (Linux:
it reads ``/proc``).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 1.0
GRACE_S = 1.0


def watch(session_name: str) -> subprocess.Popen:
    """Start the watchdog of this process's Ray session ``session_name`` (call it right after
    ``ray.init`` started the cluster); ``stop`` it after ``ray.shutdown``."""
    return subprocess.Popen(
        [sys.executable, "-I", str(Path(__file__).resolve()), session_name], stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True,
        start_new_session=True,  # Ctrl-C reaches the terminal's process group: the driver's to handle
    )


def stop(proc: subprocess.Popen) -> None:
    """The driver shut its cluster down: the watchdog stops what is left of it and exits."""
    try:
        proc.stdin.close()
        proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process; None when it is gone or a zombie."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return None if fields[0] in "ZX" else (int(fields[1]), int(fields[19]))


def _processes() -> dict[int, tuple[int, int]]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            out[int(entry)] = st
    return out


def cluster(driver: int, session_name: str, known: dict[int, int]) -> dict[int, int]:
    """``known`` plus the session's processes now: the driver's children that name the session on
    their command line, and every process under them (pid -> start time, against pid reuse)."""
    procs = _processes()
    procs.pop(os.getpid(), None)  # (its own command line names the session too)
    key = session_name.encode()
    found = dict(known)
    for pid, (ppid, start) in procs.items():
        if ppid == driver and pid not in found:
            try:
                if key in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found[pid] = start
            except OSError:
                pass
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    todo = [p for p, start in found.items() if p in procs and procs[p][1] == start]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found[child] = procs[child][1]
                todo.append(child)
    return found


def _alive(known: dict[int, int]) -> list[int]:
    return [pid for pid, start in known.items() if (st := _stat(pid)) is not None and st[1] == start]


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def reap(known: dict[int, int]) -> None:
    """SIGTERM what is alive of ``known``, SIGKILL what is left after GRACE_S."""
    pids = _alive(known)
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while pids and time.monotonic() < deadline:
        time.sleep(0.05)
        pids = _alive(known)
    _signal(pids, signal.SIGKILL)


def main(argv: list[str]) -> None:
    session_name = argv[0]
    driver = os.getppid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd = sys.stdin.fileno()
    known: dict[int, int] = {}
    while os.getppid() == driver:
        known = cluster(driver, session_name, known)
        if select.select([fd], [], [], POLL_S)[0] and not os.read(fd, 65536):
            break  # end of file: the driver closed the pipe, or ended
    reap(known)


if __name__ == "__main__":
    main(sys.argv[1:])
