# attack: sends a UDP datagram to the host
# mode: function
# expect: wrong answer|runtime error
import socket

def add(a, b):
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"pwned", ("127.0.0.1", @@UDP_PORT@@))
    return 0
