# attack: memory that grows until it runs out
# mode: function
# expect: memory limit
def add(a, b):
    xs = []
    while True:
        xs.append(bytearray(10**7))
