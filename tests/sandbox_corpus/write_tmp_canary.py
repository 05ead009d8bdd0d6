# attack: writes to /tmp, hoping it is the host's /tmp
# mode: function
# expect: wrong answer
def add(a, b):
    with open("/tmp/@@CANARY@@", "w") as f:
        f.write("pwned")
    return 0
