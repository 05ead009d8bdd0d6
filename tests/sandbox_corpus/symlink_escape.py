# attack: symlinks to host paths and follows them
# mode: function
# expect: wrong answer|runtime error
import os

def add(a, b):
    os.symlink("/etc/passwd", "p")
    os.symlink("@@PROJECT_FILE@@", "q")
    return open("p").read() + open("q").read()
