# attack: connects to a TCP server the host listens on
# mode: function
# expect: wrong answer|runtime error
import socket

def add(a, b):
    s = socket.create_connection(("127.0.0.1", @@TCP_PORT@@), timeout=1)
    s.sendall(b"pwned")
    return 0
