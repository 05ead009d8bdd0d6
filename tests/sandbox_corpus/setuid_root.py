# attack: tries to become root
# mode: function
# expect: wrong answer
import os

def add(a, b):
    out = []
    for f in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.setresuid(0, 0, 0)):
        try:
            f()
            out.append("ok")
        except OSError as e:
            out.append(e.errno)
    return out + [os.getuid(), os.geteuid()]
