# attack: infinite loop in the function
# mode: function
# expect: timeout
def add(a, b):
    while True:
        pass
