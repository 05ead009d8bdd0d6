# attack: reads the memory of every process it can see, looking for the expected outputs
# mode: function
# expect: wrong answer|runtime error|timeout
import os, re

def add(a, b):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            maps = open(f"/proc/{pid}/maps").read().splitlines()
            mem = open(f"/proc/{pid}/mem", "rb")
        except OSError:
            continue
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            try:
                mem.seek(lo)
                chunk = mem.read(min(hi - lo, 1 << 18))
            except (OSError, ValueError, OverflowError):
                continue
            found += re.findall(rb'"expected": ([0-9-]+)', chunk)
    return int(found[0]) if found else -12345
