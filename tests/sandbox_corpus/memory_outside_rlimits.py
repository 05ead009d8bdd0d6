# attack: holds memory that no per-process limit counts: anonymous files, System V shared memory and message queues, socket buffers
# mode: function
# expect: wrong answer
import ctypes, os, socket

def add(a, b):
    held = []
    try:
        fd = os.memfd_create("m")
        os.ftruncate(fd, 1 << 30)
        held.append("memfd")
    except OSError:
        pass
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.shmget(0, 1 << 28, 0o1000 | 0o600) >= 0:
        held.append("shm")
    if libc.msgget(0, 0o1000 | 0o600) >= 0:
        held.append("msg")
    try:
        a_, b_ = socket.socketpair()
        held.append("socketpair")
    except OSError:
        pass
    if held:  # a hole: make it visible in the reason
        raise SystemExit(f"held {held}")
    return 0
