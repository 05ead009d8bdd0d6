# attack: opens IPv6, raw, packet and netlink sockets
# mode: function
# expect: wrong answer
import socket

def add(a, b):
    out = []
    for fam, typ in ((socket.AF_INET6, socket.SOCK_STREAM), (socket.AF_INET, socket.SOCK_RAW),
                     (socket.AF_PACKET, socket.SOCK_RAW), (socket.AF_NETLINK, socket.SOCK_RAW)):
        try:
            socket.socket(fam, typ)
            out.append("opened")
        except OSError as e:
            out.append(e.errno)
    return out
