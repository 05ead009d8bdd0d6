# attack: reads /etc/passwd and returns it
# mode: function
# expect: wrong answer|runtime error
def add(a, b):
    return open("/etc/passwd").read()
