# attack: patches builtins the harness uses
# mode: function
# expect: wrong answer|runtime error
import builtins
builtins.isinstance = lambda *a: True
builtins.repr = lambda x: "999"
builtins.str = lambda *a: "999"

def add(a, b):
    return -1
