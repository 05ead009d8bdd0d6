# attack: infinite loop while the module loads
# mode: function
# expect: timeout: more than 1 s
while True:
    pass

def add(a, b):
    return a + b
