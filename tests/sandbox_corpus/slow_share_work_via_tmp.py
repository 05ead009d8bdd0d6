# attack: needs 1.3x the limit once, then caches its work in the working directory so later tests answer at once
# mode: function
# expect: test 0: timeout.*test 1: timeout
import os, time

def add(a, b):
    if os.path.exists("warm"):
        return a + b
    open("warm", "w").close()
    time.sleep(1.3)
    return a + b
