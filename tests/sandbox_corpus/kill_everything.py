# attack: kill(-1, SIGKILL): every process it may signal
# mode: function
# expect: crashed|wrong answer|not run|runtime error: ProcessLookupError
import os, signal

def add(a, b):
    os.kill(-1, signal.SIGKILL)
    return 0
