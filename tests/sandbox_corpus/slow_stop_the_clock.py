# attack: needs 1.3x the limit; stops (SIGSTOP) every process it can find, its parent and pid 1 first, to freeze whatever times it
# mode: function
# expect: test 0: timeout.*test 1: timeout
import os, signal, time

for pid in [os.getppid(), 1] + [int(p) for p in os.listdir("/proc") if p.isdigit()]:
    if pid != os.getpid():
        try:
            os.kill(pid, signal.SIGSTOP)
        except OSError:
            pass

def add(a, b):
    time.sleep(1.3)
    return a + b
