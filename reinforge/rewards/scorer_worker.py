"""A scoring worker: runs third-party scorers (reasoning-gym's score_answer, math-verify) on model
answers INSIDE the sandbox, as a long-lived program (``python -I -S -B -c <this text> PATHS
LIBRARIES``, PATHS the read-only site-packages holding the libraries and their dependencies,
LIBRARIES those to load: reasoning_gym and/or math_verify). reinforge/rewards/isolated.py starts a
pool of these, sends one request at a time and bounds each answer's time; the sandbox bounds
memory and sees that nothing here can reach the trainer, the host or the network.

math-verify requests are also timed here, in this process's main thread, where SIGALRM stops even
one long integer operation (sympy evaluating 9^(9^9)): a late one is answered "timeout" and the
worker lives on (the trainer still kills one that stays silent). Importing this module (as the
trainer does for a constant) changes nothing.

Some scorers evaluate the answer text: eval() (string_insertion, spiral_matrix, binary_matrix,
n_queens, ...) or sympy's parse_expr/sympify (polynomial_multiplication, simple_integration,
puzzle24, countdown, ...; docs/sandbox.md lists them). Both entry points are replaced here,
before reasoning-gym is imported, by evaluators that build the value from the expression's syntax
tree and never run code: eval() accepts literals (numbers, strings, lists, tuples, dicts, sets)
and arithmetic on numbers; parse_expr accepts what sympy's parser makes of a formula (numbers,
symbols, operators, calls of sympy's classes and a few of its functions), never attributes,
subscripts, lambdas or other callables. So an answer cannot run code in the process that holds
the expected answer (it could otherwise read it, or print its own score). As a tripwire, an audit
hook refuses, while a scorer runs, any compilation or execution of code that is not a module file
being imported, and any pickle, marshal, ctypes, socket or subprocess use; a request that trips
it is answered "blocked" and the worker exits (its state is no longer trusted).

Protocol: requests on stdin, each a decimal length, a newline, then that many bytes of pickle
(sent by the trusted trainer); answers on stdout, one JSON object per line:
  {"ready": true} once, then per request {"score": x} (math: and "unparsed": true when the answer
  did not parse) | {"error": "Type: message"} | {"timeout": "message"} | {"blocked": "what"};
  {"fatal": "..."} if start-up failed. Requests: ("score", dataset key, answer, entry) and
  ("math", (float_rounding, strict, limit_s or None), answer, reference).
"""

import ast
import builtins
import json
import operator
import os
import pickle
import re
import signal
import sys
from functools import lru_cache

_MAX_RESULT_BITS = 1 << 22  # an integer power or shift past this size is refused, not computed


_real_eval = builtins.eval


class Blocked(Exception):
    """The answer reached something that would run code; the request is refused."""


# -- the tripwire ------------------------------------------------------------------------------

_state = {"armed": False, "trusted": 0, "blocked": None, "codegen": frozenset(), "timing": False}
_REFUSED_PREFIXES = ("ctypes.", "socket.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn",
                     "os.fork", "os.system", "pickle.", "code.__new__",
                     "function.__new__")


def _is_module_file(path):
    return isinstance(path, str) and path.endswith(".py") and os.path.isfile(path)


def _untrusted_caller(depth):
    """Whether the Python code `depth` frames above the caller may be passing an answer to
    eval or compile: anything but the known code generators, which compile source built from
    their own templates and names they checked (namedtuple, dataclasses, sympy's polynomial
    kernels; reasoning-gym's scorers use them through sympy). Deny by default: a library not
    listed here that evaluates strings gets the safe evaluator, or trips the wire."""
    try:
        path = sys._getframe(depth + 1).f_code.co_filename
    except ValueError:
        return True
    return path not in _state["codegen"]


def _codegen_files():
    import collections
    import dataclasses

    import sympy

    polys = os.path.join(os.path.dirname(sympy.__file__), "polys")
    return frozenset({collections.__file__, dataclasses.__file__,
                      *(os.path.join(polys, f) for f in ("monomials.py", "ring_series.py",
                                                         "polyconfig.py"))})


def _audit(event, args):
    if not _state["armed"]:
        return
    if event == "compile":
        if _state["trusted"] or _is_module_file(args[1]) or not _untrusted_caller(1):
            return  # our own ast.parse, an import compiling a module, a code generator
        _refuse(f"compiling code ({args[1]})")
    elif event == "exec":
        if _is_module_file(getattr(args[0], "co_filename", None)) or not _untrusted_caller(1):
            return  # an import running a module, a code generator
        _refuse("running code")
    elif event.startswith(_REFUSED_PREFIXES):
        _refuse(event)


def _refuse(what):
    if _state["blocked"] is None:
        _state["blocked"] = what
    raise Blocked(f"refused while scoring: {what}")


_ast_parse = ast.parse


def _marked_parse(*args, **kwargs):
    """ast.parse only builds a syntax tree (ast.literal_eval and our evaluators use it): marked
    as harmless for the tripwire, which otherwise sees it as a compilation."""
    _state["trusted"] += 1
    try:
        return _ast_parse(*args, **kwargs)
    finally:
        _state["trusted"] -= 1



def _parse(text, mode="eval"):
    return _marked_parse(text, mode=mode)


# -- eval(): literals and arithmetic -----------------------------------------------------------

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow, ast.LShift: operator.lshift, ast.RShift: operator.rshift,
           ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg, ast.Invert: operator.invert}
_NUMBER = (int, float, complex)


def _is_number(value):
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) or getattr(value, "is_Number", False) is True


def _check_power(op, left, right):
    """Refuse integer powers and shifts whose result would be astronomically large (a formula,
    not code, can still ask for 9**9**9)."""
    if op not in (ast.Pow, ast.LShift) or not (_is_number(left) and _is_number(right)):
        return
    try:
        if right != int(right) or left != int(left):
            return  # a float or fraction power: overflows or stays small
        bits, exponent = abs(int(left)).bit_length(), abs(int(right))
    except (TypeError, ValueError, OverflowError):
        return
    if op is ast.Pow and bits > 1 and bits * exponent > _MAX_RESULT_BITS:
        raise ValueError(f"an integer power of about {bits * exponent} bits is too large to evaluate")
    if op is ast.LShift and bits + exponent > _MAX_RESULT_BITS:
        raise ValueError(f"a shift to about {bits + exponent} bits is too large to evaluate")


def _plain_value(node):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        items = [_plain_value(e) for e in node.elts]
        return {ast.List: list, ast.Tuple: tuple, ast.Set: set}[type(node)](items)
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** unpacking is not allowed in an evaluated answer")
        return {_plain_value(k): _plain_value(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _plain_value(node.operand)
        if not isinstance(value, _NUMBER):
            raise ValueError("unary operators apply to numbers only in an evaluated answer")
        return _UNARY[type(node.op)](value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _plain_value(node.left), _plain_value(node.right)
        if not (isinstance(left, _NUMBER) and isinstance(right, _NUMBER)):
            raise ValueError("arithmetic applies to numbers only in an evaluated answer")
        _check_power(type(node.op), left, right)
        return _BINARY[type(node.op)](left, right)
    raise ValueError(f"{type(node).__name__} is not allowed in an evaluated answer (only "
                     "literals and arithmetic on numbers)")


def safe_eval(source, globals=None, locals=None):  # noqa: A002 - eval's own signature
    """eval() for scorers: the value of a literal or arithmetic expression, never code. The
    known code generators (see _untrusted_caller) keep the real eval."""
    if not _untrusted_caller(1):
        return _real_eval(source, globals, locals)
    if isinstance(source, bytes):
        source = source.decode("utf-8")
    if not isinstance(source, str):
        raise Blocked("eval of a code object")
    return _plain_value(_parse(source.strip(" \t")).body)


# -- sympy's parse_expr: formulas, never code --------------------------------------------------

_SYMPY = {}
_PLAIN_FUNCTIONS = ("sqrt", "root", "cbrt", "real_root", "Abs", "abs")


class _SympyEval:
    """The value of the expression sympy's tokenizer made of a formula, built from its syntax
    tree: names resolve in local_dict then global_dict (as eval would), and only sympy objects,
    numbers and strings are values; calls only of sympy's classes (Basic subclasses: Symbol,
    Integer, Add, sin, Function('f'), ...) and a few plain functions (sqrt, root, ...)."""

    def __init__(self, local_dict, global_dict):
        self.local_dict, self.global_dict = local_dict, global_dict

    def value(self, node):
        method = getattr(self, "_" + type(node).__name__, None)
        if method is None:
            raise ValueError(f"{type(node).__name__} is not allowed in a formula")
        return method(node)

    def _Expression(self, node):
        return self.value(node.body)

    def _Constant(self, node):
        if isinstance(node.value, (bytes, type(Ellipsis))):
            raise ValueError("this constant is not allowed in a formula")
        return node.value

    def _Name(self, node):
        for scope in (self.local_dict, self.global_dict):
            if node.id in scope:
                value = scope[node.id]
                if self._allowed_value(value):
                    return value
                raise ValueError(f"name {node.id!r} is not allowed in a formula")
        raise NameError(f"name {node.id!r} is not defined")

    def _allowed_value(self, value):
        basic = _SYMPY["Basic"]
        if value is None or isinstance(value, (bool, int, float, complex, str, basic)):
            return True
        return self._callable(value)

    def _callable(self, fn):
        basic = _SYMPY["Basic"]
        if isinstance(fn, type):
            return issubclass(fn, basic)
        return any(fn is f for f in _SYMPY["plain"])

    def _Call(self, node):
        fn = self.value(node.func)
        if not self._callable(fn):
            raise ValueError(f"calling {getattr(fn, '__name__', type(fn).__name__)} is not allowed "
                             "in a formula")
        args = []
        for a in node.args:
            if isinstance(a, ast.Starred):
                raise ValueError("* unpacking is not allowed in a formula")
            args.append(self.value(a))
        kwargs = {}
        for k in node.keywords:
            if k.arg is None:
                raise ValueError("** unpacking is not allowed in a formula")
            kwargs[k.arg] = self.value(k.value)
        if fn is _SYMPY["Pow"] and len(args) == 2:
            _check_power(ast.Pow, *args)
        return fn(*args, **kwargs)

    def _BinOp(self, node):
        op = type(node.op)
        if op not in _BINARY:
            raise ValueError(f"operator {op.__name__} is not allowed in a formula")
        left, right = self.value(node.left), self.value(node.right)
        _check_power(op, left, right)
        return _BINARY[op](left, right)

    def _UnaryOp(self, node):
        op = type(node.op)
        if op not in _UNARY:
            raise ValueError(f"operator {op.__name__} is not allowed in a formula")
        return _UNARY[op](self.value(node.operand))

    def _Compare(self, node):
        ops = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
               ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne}
        if len(node.ops) != 1 or type(node.ops[0]) not in ops:
            raise ValueError("only a single comparison is allowed in a formula")
        return ops[type(node.ops[0])](self.value(node.left), self.value(node.comparators[0]))

    def _Tuple(self, node):
        return tuple(self.value(e) for e in node.elts)

    def _List(self, node):
        return [self.value(e) for e in node.elts]


def safe_parse_expr(s, local_dict=None, transformations=None, global_dict=None, evaluate=True):
    """sympy.parsing.sympy_parser.parse_expr with the same arguments and results for formulas,
    but the tokenizer's output is evaluated by _SympyEval instead of eval()."""
    sp = _SYMPY["parser"]
    if transformations is None:
        transformations = sp.standard_transformations
    if local_dict is None:
        local_dict = {}
    elif not isinstance(local_dict, dict):
        raise TypeError("expecting local_dict to be a dict")
    elif sp.null in local_dict:
        raise ValueError('cannot use "" in local_dict')
    if global_dict is None:
        global_dict = dict(_SYMPY["globals"])
    elif not isinstance(global_dict, dict):
        raise TypeError("expecting global_dict to be a dict")
    transformations = transformations or ()
    if isinstance(transformations, str):
        if transformations == "all":
            transformations = sp.T[:]
        elif transformations == "implicit":
            transformations = sp.T[:6]
        else:
            raise ValueError("unknown transformation group name")
    code = sp.stringify_expr(s, local_dict, global_dict, transformations)
    try:
        if evaluate:
            tree = _parse(code)
        else:
            _state["trusted"] += 1
            try:
                tree = sp.evaluateFalse(code)
            finally:
                _state["trusted"] -= 1
        return _SympyEval(local_dict, global_dict).value(tree)
    finally:
        for name in local_dict.pop(sp.null, ()):
            local_dict[name] = sp.null


def safe_eval_expr(code, local_dict, global_dict):
    if not isinstance(code, str):
        raise Blocked("eval of a code object")
    return _SympyEval(local_dict, global_dict).value(_parse(code))


def _install_sympy():
    import sympy
    import sympy.parsing
    import sympy.parsing.sympy_parser as sp

    namespace = {}
    exec("from sympy import *", namespace)  # noqa: S102 - sympy's own namespace, as parse_expr builds it
    for name, obj in vars(builtins).items():
        if isinstance(obj, type(len)):
            namespace[name] = obj
    namespace["max"], namespace["min"] = sympy.Max, sympy.Min
    _SYMPY.update(parser=sp, globals=namespace, Basic=sympy.Basic, Pow=sympy.Pow,
                  plain=tuple(namespace[n] for n in _PLAIN_FUNCTIONS if n in namespace))
    # Before reasoning-gym's modules import them by name.
    sp.parse_expr = sympy.parsing.parse_expr = sympy.parse_expr = safe_parse_expr
    sp.eval_expr = safe_eval_expr


# -- math-verify -------------------------------------------------------------------------------

_LATEX_MARKERS = ("$", "\\(", "\\[", "\\boxed")
# Possessive: "1" * n + "x" would otherwise try every split of the digits (quadratic).
_SCIENTIFIC = re.compile(r"([+-]?(?:\d++(?:\.\d*+)?|\.\d++))[eE]([+-]?\d++)")


@lru_cache(maxsize=1)
def _math_verify():
    import math_verify
    import math_verify.grader
    import math_verify.parser

    # timeout=None everywhere (their signal timeouts fail off the main thread): the caller
    # bounds the call, so their "timeout is disabled" warning does not apply.
    math_verify.parser.TIMEOUT_WARNING_SHOWN = True
    math_verify.grader.TIMEOUT_WARNING_SHOWN = True
    return math_verify


def parse_math(text):
    """math_verify.parse, with bare text put in $...$ so "1,2", "x+1" or "\\sqrt{2}" parse as
    LaTeX (unwrapped, "1,2" would read as 1.2), and "2.5e-4" as 2.5 \\times 10^{-4}; falls back to
    the bare text."""
    mv = _math_verify()
    text = text.strip()
    if not text:
        return []
    if any(m in text for m in _LATEX_MARKERS):
        return mv.parse(text, parsing_timeout=None)
    sci = _SCIENTIFIC.fullmatch(text)
    if sci:  # "1e5" would read as 1*e*5
        text = f"{sci.group(1)}\\times 10^{{{sci.group(2)}}}"
    parsed = mv.parse(f"${text}$", parsing_timeout=None)
    return parsed or mv.parse(text, parsing_timeout=None)


@lru_cache(maxsize=4096)
def _parse_reference(text):
    return tuple(parse_math(text))  # checked against every sample of its group; immutable


def math_score(answer, reference, float_rounding=6, strict=True):
    """(1.0 or 0.0, whether the answer parsed): math-verify's verdict on answer == reference.
    Unbounded: the caller bounds its time."""
    gold = list(_parse_reference(reference))
    if not gold:
        raise ValueError(f"math-verify cannot parse the reference answer {reference[:80]!r}")
    pred = parse_math(answer)
    if not pred:
        return 0.0, False
    ok = _math_verify().verify(gold, pred, float_rounding=float_rounding, strict=strict,
                               timeout_seconds=None)
    return float(bool(ok)), True


class _Late(BaseException):
    """A math request past its limit (a BaseException: `except Exception` lets it through)."""


def _on_alarm(signum, frame):
    if _state["timing"]:
        raise _Late()


def _math_request(options, answer, reference):
    float_rounding, strict, limit = options
    _state["timing"] = bool(limit)
    try:
        signal.setitimer(signal.ITIMER_REAL, limit or 0)
        score, parsed = math_score(answer, reference, float_rounding, strict)
    except _Late:
        return {"timeout": f"no result within {limit:g} s"}
    finally:
        _state["timing"] = False
        signal.setitimer(signal.ITIMER_REAL, 0)
    return {"score": score} if parsed else {"score": score, "unparsed": True}


# -- the loop ----------------------------------------------------------------------------------


def _describe(e):
    try:
        text = str(e)
    except Exception:  # noqa: BLE001
        text = "?"
    return (type(e).__name__ + (": " + text if text else ""))[:500]


def _send(obj):
    data = (json.dumps(obj) + "\n").encode()
    view = memoryview(data)
    while view:
        view = view[os.write(1, view):]


def _read_exact(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, min(n - len(data), 1 << 20))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _read_request():
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 1)
        if not chunk:
            raise EOFError
        line += chunk
    return pickle.loads(_read_exact(int(line)))


def _dataset(cache, key):
    ds = cache.get(key)
    if ds is None:
        from reasoning_gym import create_dataset

        name, options, seed, size = key
        ds = cache[key] = create_dataset(name, seed=seed, size=size, **dict(options))
    return ds


def main():
    sys.path[:0] = [p for p in sys.argv[1].split(os.pathsep) if p]
    # Libraries with thread pools: one thread each (the sandbox counts threads as processes).
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
        os.environ[var] = "1"
    os.environ.setdefault("MPLCONFIGDIR", os.getcwd())
    libraries = sys.argv[2].split(",") if len(sys.argv) > 2 else ["reasoning_gym"]
    ast.parse = _marked_parse
    try:
        _install_sympy()  # before the libraries' modules import parse_expr by name
        if "reasoning_gym" in libraries:
            import reasoning_gym  # noqa: F401 - registers every dataset
        if "math_verify" in libraries:
            _math_verify()
        signal.signal(signal.SIGALRM, _on_alarm)  # math requests' limit
        _state["codegen"] = _codegen_files()
        builtins.eval = safe_eval  # after: some modules eval their own constants at import
    except BaseException as e:  # noqa: BLE001
        _send({"fatal": _describe(e)})
        return
    sys.addaudithook(_audit)
    _send({"ready": True})
    datasets = {}
    while True:
        try:
            request = _read_request()
        except EOFError:
            return
        kind, key, answer, entry = request
        try:
            if kind not in ("score", "math"):
                raise ValueError(f"unknown request {kind!r}")
            ds = _dataset(datasets, key) if kind == "score" else None
            _state["armed"] = True
            try:
                if kind == "math":
                    reply = _math_request(key, answer, entry)
                else:
                    reply = {"score": float(ds.score_answer(answer=answer, entry=entry))}
            finally:
                _state["armed"] = False
        except BaseException as e:  # noqa: BLE001 - the request's failure, not the worker's
            reply = {"error": _describe(e)}
        del request, answer, entry
        if _state["blocked"] is not None:
            _send({"blocked": _state["blocked"]})
            return
        _send(reply)


if __name__ == "__main__":
    main()
