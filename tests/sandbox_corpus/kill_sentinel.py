# attack: kills a host process by its pid
# mode: function
# expect: wrong answer|runtime error
import os, signal

def add(a, b):
    os.kill(@@SENTINEL_PID@@, signal.SIGKILL)
    return 0
