# attack: sys.exit(0) inside the function
# mode: function
# expect: exited early
import sys

def add(a, b):
    sys.exit(0)
