# attack: floods stderr without end
# mode: function
# expect: output limit
import os

def add(a, b):
    while True:
        os.write(2, b"x" * 65536)
