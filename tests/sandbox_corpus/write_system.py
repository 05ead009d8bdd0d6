# attack: writes into the interpreter's and the system's directories
# mode: function
# expect: runtime error
import os

def add(a, b):
    for d in ("/usr/lib", os.path.dirname(os.__file__), "/etc", "/"):
        open(os.path.join(d, "@@CANARY@@"), "w").write("x")
