# attack: fills the disk of its working directory
# mode: function
# expect: output limit: file size limit
def add(a, b):
    with open("big", "wb") as f:
        while True:
            f.write(b"\0" * (1 << 20))
