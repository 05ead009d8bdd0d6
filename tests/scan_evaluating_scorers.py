"""Which reasoning-gym scorers evaluate the answer text. Run as a script (it wraps eval() and
sympy's parse_expr, through which sympify and its callers parse strings, for the whole process):
every dataset's score_answer is called on marked answers of several shapes, and a dataset is
listed when the marked answer reached one of them. Prints a JSON list of names.

The answers are benign (a number as the marker): nothing malicious runs here.
"""

import builtins
import json

import sympy
import sympy.parsing
import sympy.parsing.sympy_parser as sp

MARK = "7919"
calls: list[str] = []
active = [False]
real_eval, real_parse = builtins.eval, sp.parse_expr


def traced_eval(source, *args):
    if active[0] and isinstance(source, (str, bytes)):
        calls.append(source if isinstance(source, str) else source.decode(errors="replace"))
    return real_eval(source, *args)


def traced_parse(s, *args, **kwargs):
    if active[0]:
        calls.append(str(s))
    return real_parse(s, *args, **kwargs)


sp.parse_expr = sympy.parsing.parse_expr = sympy.parse_expr = traced_parse  # before the imports
import reasoning_gym  # noqa: E402,F401
from reasoning_gym import create_dataset  # noqa: E402
from reasoning_gym.factory import DATASETS  # noqa: E402

builtins.eval = traced_eval
found = set()
for name in sorted(DATASETS):
    try:
        ds = create_dataset(name, seed=0, size=3)
        entries = [ds[i] for i in range(3)]
    except Exception:  # noqa: BLE001 - e.g. composite needs options
        continue
    for entry in entries:
        ref = str(entry.get("answer"))
        shapes = [ref + " + " + MARK, f"[{MARK}]", f"[[{MARK}]]", f"{MARK} + 1", f"x + {MARK}",
                  f"({MARK})", MARK]
        for answer in shapes:
            calls.clear()
            active[0] = True
            try:
                ds.score_answer(answer, entry)
            except Exception:  # noqa: BLE001
                pass
            finally:
                active[0] = False
            if any(MARK in c for c in calls):
                found.add(name)
print(json.dumps(sorted(found)))
