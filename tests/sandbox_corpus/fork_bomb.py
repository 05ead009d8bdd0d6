# attack: fork bomb: every process forks forever
# mode: function
# expect: timeout|runtime error|not run|crashed
import os

def add(a, b):
    while True:
        try:
            os.fork()
        except OSError:
            pass
