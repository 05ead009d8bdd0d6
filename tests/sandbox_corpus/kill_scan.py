# attack: signals every pid that exists
# mode: function
# expect: wrong answer|crashed|not run
import os, signal

def add(a, b):
    hits = 0
    for pid in range(2, 70000):
        try:
            os.kill(pid, signal.SIGKILL)
            hits += 1
        except OSError:
            pass
    return -hits
