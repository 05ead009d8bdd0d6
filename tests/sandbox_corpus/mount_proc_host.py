# attack: mounts file systems through ctypes
# mode: function
# expect: wrong answer
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)

def add(a, b):
    os.makedirs("m", exist_ok=True)
    rc1 = libc.mount(b"none", b"m", b"tmpfs", 0, None)
    rc2 = libc.mount(b"/", b"m", None, 4096, None)
    return [rc1, rc2, ctypes.get_errno()]
