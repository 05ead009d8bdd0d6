# attack: needs 1.6x the limit; demotes the runner (pid 1, the same uid) to SCHED_IDLE, renices it and pins the runner to one CPU, then keeps every CPU busy so the runner notices the exit late, and exits 0
# mode: function
# expect: test 0: timeout.*test 1: timeout
import os, threading, time

for attempt in (
    lambda: os.sched_setscheduler(1, os.SCHED_IDLE, os.sched_param(0)),
    lambda: os.setpriority(os.PRIO_PROCESS, 1, 19),
    lambda: os.sched_setaffinity(1, {min(os.sched_getaffinity(0))}),
):
    try:
        attempt()
    except OSError:
        pass


def spin(until):
    while time.monotonic() < until:
        pass


def add(a, b):
    until = time.monotonic() + 1.6
    for _ in range(len(os.sched_getaffinity(0))):
        threading.Thread(target=spin, args=(until,), daemon=True).start()
    time.sleep(1.6)
    return a + b
