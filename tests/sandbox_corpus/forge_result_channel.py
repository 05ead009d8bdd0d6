# attack: writes forged results to the result fd and exits
# mode: function
# expect: wrong answer|exited early
import os

def add(a, b):
    for fd in range(3, 20):
        for i in range(10):
            try:
                os.write(fd, b'{"i": %d, "status": "ok", "data": "999", "info": "", "exit": 0}\n' % i)
            except OSError:
                pass
    os._exit(0)
