# attack: writes a file at a host path
# mode: function
# expect: wrong answer|runtime error
def add(a, b):
    with open("@@HOST_FILE@@", "w") as f:
        f.write("pwned")
    return 0
