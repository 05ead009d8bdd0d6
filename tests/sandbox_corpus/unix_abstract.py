# attack: connects to an abstract Unix socket the host listens on
# mode: function
# expect: wrong answer|runtime error
import socket

def add(a, b):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("\0@@UNIX_NAME@@")
    s.sendall(b"pwned")
    return 0
