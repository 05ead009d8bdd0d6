# attack: locks the interpreter's own read-only files (bound from the host) to block the host's locks, and watches them with inotify
# mode: function
# expect: wrong answer
import ctypes, fcntl, os

def add(a, b):
    got = []
    with open(os.__file__, "rb") as f:
        for op in (fcntl.LOCK_EX | fcntl.LOCK_NB, fcntl.LOCK_SH | fcntl.LOCK_NB):
            try:
                fcntl.flock(f, op)
                got.append("flock")
            except OSError:
                pass
        try:
            fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            got.append("lockf")
        except OSError:
            pass
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.inotify_init1(0) >= 0:
        got.append("inotify")
    if got:  # a hole: make it visible in the reason
        raise SystemExit(f"got {got}")
    return 0
