# attack: lists everything it can see and prints it (looks for secrets)
# mode: stdio
# expect: wrong answer
import os, sys
skip = ("/proc", "/usr", "/dev", sys.prefix)
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if not os.path.join(root, d).startswith(skip)]
    for name in files:
        path = os.path.join(root, name)
        try:
            print(path, open(path, errors="replace").read()[:200])
        except OSError:
            pass
