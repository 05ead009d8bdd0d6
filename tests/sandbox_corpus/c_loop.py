# attack: a long loop inside C code, where Python signal handlers never run
# mode: function
# expect: timeout
def add(a, b):
    return sum(range(10**13))
