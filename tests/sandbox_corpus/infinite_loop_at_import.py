# attack: infinite loop while the module loads
# mode: function
# expect: not run: timeout
while True:
    pass

def add(a, b):
    return a + b
