# attack: aborts the process
# mode: function
# expect: crashed: killed by SIGABRT
import os

def add(a, b):
    os.abort()
