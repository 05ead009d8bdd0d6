# attack: attaches to another process with ptrace
# mode: function
# expect: wrong answer
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)

def add(a, b):
    return [libc.ptrace(16, 1, 0, 0), libc.ptrace(16, os.getppid(), 0, 0), ctypes.get_errno()]
