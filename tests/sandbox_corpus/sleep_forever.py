# attack: blocks without using CPU (the CPU limit alone would never fire)
# mode: function
# expect: timeout
import time

def add(a, b):
    time.sleep(10**6)
