# attack: needs 1.3x the limit; starts the work in a thread at import and writes its answer to the result channel from there, ahead of the harness
# mode: function
# expect: test 0: timeout.*test 1: timeout
import os, threading, time

def work():
    time.sleep(1.3)
    try:
        os.write(3, b"ok\n5")  # the prompt's example answer, claimed for whichever test this is
    except OSError:
        pass

threading.Thread(target=work).start()

def add(a, b):
    time.sleep(1.3)
    return a + b
