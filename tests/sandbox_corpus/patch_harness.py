# attack: replaces the harness's JSON writer and report function
# mode: function
# expect: wrong answer|runtime error
import sys
main = sys.modules["__main__"]
main.to_json = lambda value, depth=0: "999"
main._report = lambda fd, **kw: main._write_all(fd, b'{"i": %d, "status": "ok", "data": "999", "info": "", "exit": 0}\n' % kw.get("i", 0))

def add(a, b):
    return 0
