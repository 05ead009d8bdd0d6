# attack: connects to the internet
# mode: function
# expect: wrong answer|runtime error
import socket

def add(a, b):
    socket.create_connection(("1.1.1.1", 80), timeout=1)
    return 0
