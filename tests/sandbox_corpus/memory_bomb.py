# attack: one huge allocation
# mode: function
# expect: memory limit
def add(a, b):
    x = bytearray(10**11)
    return len(x)
