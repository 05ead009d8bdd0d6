# attack: needs 1.3x the limit; stops (SIGSTOP) every other process it can find, its parent and pid 1 first, at import and again in the call, to freeze whatever times it
# mode: function
# expect: test 0: timeout.*test 1: timeout
import os, signal, time


def stop_all():
    for pid in [os.getppid(), 1] + [int(p) for p in os.listdir("/proc") if p.isdigit()]:
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGSTOP)
            except OSError:
                pass


stop_all()

def add(a, b):
    stop_all()
    time.sleep(1.3)
    return a + b
