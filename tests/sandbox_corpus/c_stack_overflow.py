# attack: recursion past the C stack
# mode: function
# expect: crashed|runtime error|memory limit|timeout
import sys
sys.setrecursionlimit(10**8)

def f(n):
    return f(n + 1) + 1

def add(a, b):
    return f(0)
