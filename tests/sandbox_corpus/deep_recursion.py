# attack: unbounded recursion
# mode: function
# expect: runtime error: RecursionError
def add(a, b):
    return add(a, b) + 1
