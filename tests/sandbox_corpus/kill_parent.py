# attack: kills its parent and its process group
# mode: function
# expect: crashed|wrong answer|not run|runtime error
import os, signal

def add(a, b):
    os.kill(os.getppid(), signal.SIGKILL)
    os.killpg(os.getpgid(0), signal.SIGKILL)
    return 0
