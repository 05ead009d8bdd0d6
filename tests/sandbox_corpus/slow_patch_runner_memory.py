# attack: needs 1.3x the limit; opens its parent's and pid 1's /proc/<pid>/mem, at import and in the call, to overwrite the deadline there
# mode: function
# expect: test 0: timeout.*test 1: timeout
import os, time


def open_timer_memory():
    opened = []
    for pid in {os.getppid(), 1}:
        try:
            fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
            opened.append(pid)
            os.close(fd)
        except OSError:
            pass
    if opened:  # would be a hole: make it visible in the reason instead of a timeout
        raise SystemExit(f"opened the memory of {opened}")


open_timer_memory()

def add(a, b):
    open_timer_memory()
    time.sleep(1.3)
    return a + b
