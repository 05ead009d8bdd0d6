# attack: kills itself
# mode: function
# expect: crashed: killed by SIGKILL
import os, signal

def add(a, b):
    os.kill(os.getpid(), signal.SIGKILL)
