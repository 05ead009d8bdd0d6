# attack: sys.exit(0) before any test runs
# mode: function
# expect: exited early
import sys
sys.exit(0)

def add(a, b):
    return a + b + 1
