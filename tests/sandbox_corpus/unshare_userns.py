# attack: creates a user namespace to regain capabilities
# mode: function
# expect: wrong answer
import ctypes
libc = ctypes.CDLL(None, use_errno=True)

def add(a, b):
    return [libc.unshare(0x10000000), libc.unshare(0x00020000), ctypes.get_errno()]
