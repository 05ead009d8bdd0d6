# attack: needs 1.3x the per-test limit; at import raises every timeout-like value it can find in its callers' frames, globals and modules
# mode: function
# expect: test 0: timeout.*test 1: timeout
import sys, time

frame = sys._getframe()
while frame is not None:
    for scope in (frame.f_locals, frame.f_globals):
        for key, value in list(scope.items()):
            if isinstance(value, dict):
                for k in list(value):
                    if "time" in str(k) and isinstance(value[k], (int, float)):
                        value[k] = 10**6
            elif "time" in key.lower() and isinstance(value, (int, float)):
                scope[key] = 10**6
    frame = frame.f_back
for module in list(sys.modules.values()):
    for key in dir(module):
        if "timeout" in key.lower():
            try:
                setattr(module, key, 10**6)
            except Exception:
                pass

def add(a, b):
    time.sleep(1.3)
    return a + b
