# attack: dereferences a bad pointer through ctypes
# mode: function
# expect: crashed: killed by SIGSEGV
import ctypes

def add(a, b):
    return ctypes.cast(8, ctypes.POINTER(ctypes.c_int))[0]
