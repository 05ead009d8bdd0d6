# attack: searches the harness's memory, its files and stdin for the expected outputs
# mode: function
# expect: wrong answer
import gc, os, re, sys

def add(a, b):
    for obj in gc.get_objects():
        if isinstance(obj, dict) and "expected" in obj:
            return obj["expected"]
    f = sys._getframe()
    while f:
        for v in f.f_locals.values():
            if isinstance(v, dict) and "expected" in v:
                return v["expected"]
        f = f.f_back
    texts = []
    for name in os.listdir("."):
        if name != "solution.py":
            texts.append(open(name, errors="replace").read())
    for path in ("/proc/self/fd/0", "/proc/1/cmdline", "/proc/2/cmdline"):
        try:
            texts.append(open(path, errors="replace").read())
        except OSError:
            pass
    for text in texts:
        m = re.search(r'"expected": (-?[0-9]+)', text)
        if m:
            return int(m.group(1))
    return -1
