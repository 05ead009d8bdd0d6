# attack: walks up from its working directory and lists it
# mode: function
# expect: wrong answer
import os

def add(a, b):
    os.chdir("../../../../..")
    return sorted(os.listdir("."))
