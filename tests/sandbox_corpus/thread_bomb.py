# attack: starts threads until it cannot
# mode: function
# expect: runtime error|timeout|not run
import threading, time

def add(a, b):
    while True:
        threading.Thread(target=time.sleep, args=(1000,)).start()
