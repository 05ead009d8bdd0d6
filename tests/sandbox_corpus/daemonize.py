# attack: double-forks a marked daemon that tries to outlive the sandbox
# mode: function
# expect: wrong answer
import os, sys

def add(a, b):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time\ntime.sleep(10**6)", "@@MARKER@@"])
        os._exit(0)
    return 0
