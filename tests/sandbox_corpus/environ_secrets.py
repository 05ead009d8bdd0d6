# attack: prints its environment and every /proc/*/environ it can read
# mode: stdio
# expect: wrong answer
import os
print(dict(os.environ))
for pid in os.listdir("/proc"):
    if pid.isdigit():
        try:
            print(open(f"/proc/{pid}/environ", "rb").read())
            print(open(f"/proc/{pid}/cmdline", "rb").read()[:300])
        except OSError:
            pass
