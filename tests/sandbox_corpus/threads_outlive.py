# attack: leaves spinning and sleeping threads behind after answering wrongly
# mode: function
# expect: wrong answer
import threading, time

def spin():
    while True:
        pass

def add(a, b):
    threading.Thread(target=spin, daemon=True).start()
    threading.Thread(target=time.sleep, args=(10**6,)).start()
    return a - b
