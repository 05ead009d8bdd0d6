"""One writer per run directory.

A process that writes a run (``reinforge train``, ``train --resume``, a sweep's runs, ``reproduce``,
``eval`` of a bare model) holds an exclusive ``flock`` on ``<run>/writer.lock`` for as long as it
writes. The kernel drops the lock when the process ends, however it ends (SIGKILL, OOM, a power
cut), so a dead writer never leaves a stale lock behind and the run can be resumed at once. A
second writer is refused with one line naming the pid and host that hold the lock; the holder
writes those into the lock file after taking the lock.

Readers (``eval`` of a run, ``compare``, ``runs``) never take the lock: every file of a run is
written atomically or appended line by line, so they never see a torn state. :func:`lock_holder`
tells them whether a writer is active, by a non-blocking probe that holds nothing.

The lock is re-entrant within a process (a count per directory): the CLI takes it before it
prints a resume's config changes, and the trainer takes it again for the run itself.

On a network file system the lock is only as good as the file system's ``flock`` (NFS emulates
it with byte-range locks on Linux; some FUSE file systems ignore it).
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinforge.tracking.io import DamagedRunError

__all__ = ["LOCK_FILE", "RunLockedError", "acquire", "release", "lock_holder", "holds_lock", "describe_holder"]

LOCK_FILE = "writer.lock"
# A writer that finds the lock taken tries again for this long: a reader's probe holds it for
# microseconds, and must not make a starting writer give up.
_RETRY_S = 1.0


class RunLockedError(RuntimeError):
    """Another process is writing this run directory."""

    def __init__(self, path: Path, holder: dict[str, Any] | None):
        self.path, self.holder = Path(path), holder or {}
        super().__init__(
            f"run directory {str(path)!r} is being written by {describe_holder(self.holder)}; "
            "wait for that process to end or stop it, then resume (its checkpoints stay intact)"
        )


@dataclass
class _Held:
    fd: int
    count: int
    info: dict[str, Any]


_held: dict[str, _Held] = {}
_registry = threading.Lock()


def _key(run_path: str | os.PathLike) -> str:
    return os.path.realpath(run_path)


def describe_holder(holder: dict[str, Any] | None) -> str:
    """``pid 1234 on host gpu-7 since 2025-01-01T10:00:00+00:00`` (what is known of it)."""
    holder = holder or {}
    if holder.get("pid") is None:
        return "another process (it has not written its pid yet)"
    text = f"pid {holder['pid']} on host {holder.get('hostname', '?')}"
    if holder.get("since"):
        text += f" since {holder['since']}"
    return text


def _read_info(fd: int) -> dict[str, Any] | None:
    # The holder truncates and rewrites the file right after locking; a read in between sees it
    # empty, so try a few times before reporting the holder as unknown.
    for _ in range(20):
        try:
            data = os.pread(fd, 4096, 0)
            info = json.loads(data.decode("utf-8")) if data else None
        except (OSError, ValueError):
            info = None
        if isinstance(info, dict):
            return info
        time.sleep(0.01)
    return None


def acquire(run_path: str | os.PathLike, *, retry_s: float = _RETRY_S) -> dict[str, Any]:
    """Take the writer lock of the run at ``run_path`` (again, if this process holds it); returns
    the holder record. Raises RunLockedError naming the holder when another process has it."""
    key = _key(run_path)
    with _registry:
        held = _held.get(key)
        if held is not None:
            held.count += 1
            return held.info
        try:
            fd = os.open(Path(key) / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except (IsADirectoryError, PermissionError) as err:  # a damaged run: say which file, and the fix
            raise DamagedRunError(
                Path(run_path) / LOCK_FILE, f"cannot be opened for writing ({err.strerror})",
                "it must be a file this user can write, and holds no data: delete it (a new one is made) or fix "
                "its permissions") from None
        deadline = time.monotonic() + retry_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read_info(fd)
                    os.close(fd)
                    raise RunLockedError(Path(run_path), holder) from None
                time.sleep(0.05)
            except BaseException:
                os.close(fd)
                raise
        info = {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "since": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "argv": list(sys.argv),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode("utf-8"), 0)
        _held[key] = _Held(fd, 1, info)
        return info


def release(run_path: str | os.PathLike) -> None:
    """Give back one acquisition; the lock is released when the last one is given back."""
    key = _key(run_path)
    with _registry:
        held = _held.get(key)
        if held is None:
            return
        held.count -= 1
        if held.count > 0:
            return
        del _held[key]
        try:
            os.ftruncate(held.fd, 0)  # no stale holder record for readers to show
        except OSError:
            pass
        fcntl.flock(held.fd, fcntl.LOCK_UN)
        os.close(held.fd)


def holds_lock(run_path: str | os.PathLike) -> bool:
    """Whether this process holds the writer lock of ``run_path``."""
    return _key(run_path) in _held


def lock_holder(run_path: str | os.PathLike) -> dict[str, Any] | None:
    """The holder record (pid, hostname, since, argv) of the run's writer lock, or None when no
    process holds it. Never blocks and never keeps the lock."""
    key = _key(run_path)
    with _registry:
        held = _held.get(key)
        if held is not None:
            return dict(held.info)
    try:
        fd = os.open(Path(key) / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # never locked (a run made before locks existed, or a read-only copy)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_info(fd) or {"pid": None}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
