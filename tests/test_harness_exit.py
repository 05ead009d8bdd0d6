"""Honest stdin/stdout programs end in the code verifier's harness (reinforge/sandbox/harness.py)
as they end under `python solution.py`: the same stdout, byte for byte, and the same exit
status, whatever they leave to the interpreter's shutdown (atexit handlers, sys.__stdout__
behind a replaced sys.stdout, __del__ methods, files left open on fd 1, generators' finally
blocks, threads). The expected bytes come from running the same file with the same interpreter
outside any sandbox, so every case checks itself.

Three routes run the harness:
- the sandbox itself, whose runner forks per case and runs the harness in the fork (needs full
  isolation: skipped without user namespaces);
- the same fork made by a stand-in runner here: an interpreter started as the launcher is
  (``-I -S -B -c``, no LANG, stdout on /dev/null, the launcher's modules imported) that forks per
  case and runs the harness with JOB set, as launcher.py's _run_harness does; so the shutdown
  is tested on machines without namespaces too;
- a new interpreter (``python -I -S -B -c <harness> stdio``), the route for another python=.
"""

from __future__ import annotations

import ast
import marshal
import re
import subprocess
from pathlib import Path

import pytest

import reinforge.sandbox as sandbox_module
from reinforge.rewards.code import CodeVerifier
from reinforge.sandbox import Case, Job, Sandbox, SandboxLimits, SandboxUnavailable
from reinforge.tasks.base import Example

SANDBOX_DIR = Path(sandbox_module.__file__).resolve().parent
HARNESS = SANDBOX_DIR / "harness.py"
LAUNCHER = SANDBOX_DIR / "launcher.py"
PYTHON = sandbox_module.sandbox_python()
PATH = "/usr/local/bin:/usr/bin:/bin"
ENV = {"PATH": PATH, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}  # what the sandbox gives a case
STDIN = b"3\n1 2 3\n"

# Each program follows a line '### <name>'. The first, from the red team: the Codeforces
# fast-output idiom, everything printed going to a StringIO that an atexit handler writes to
# sys.__stdout__. The interpreter flushes sys.__stdout__ when it tears sys down; the harness used
# to flush only sys.stdout (the StringIO), so the answer was lost and the program scored 0.
PROGRAM_TEXT = r'''
### codeforces StringIO + atexit to sys.__stdout__
import atexit, io, sys
_INPUT_LINES = sys.stdin.read().splitlines()
input = iter(_INPUT_LINES).__next__
_OUTPUT_BUFFER = io.StringIO()
sys.stdout = _OUTPUT_BUFFER

@atexit.register
def write():
    sys.__stdout__.write(_OUTPUT_BUFFER.getvalue())

n = int(input())
a = list(map(int, input().split()))
print(sum(a))
for x in a:
    print(x * 2)
### read and print
n = int(input())
print(sum(map(int, input().split())) + n)
### atexit print
import atexit
atexit.register(print, "bye")
print("hi")
### sys.exit then atexit
import atexit, sys
atexit.register(print, "bye")
print("hi")
sys.exit(3)
### os.write in atexit, after what print buffered (flushed once the main module has run)
import atexit, os
atexit.register(os.write, 1, b"raw\n")
print("hi")
### no trailing newline, atexit too
import atexit
atexit.register(print, "tail", end="")
print("head", end="")
### large output in atexit
import atexit
atexit.register(lambda: print("x" * 200000))
### large output, no flush
import sys
sys.stdout.write("\n".join(map(str, range(100000))))
### logging to stdout
import logging, sys
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
logging.info("hello")
### exit builtin, atexit
import atexit
atexit.register(print, "bye")
print("hi")
exit()
### sys.exit in an atexit handler (the status stays 0)
import atexit, sys
def h():
    print("handler")
    sys.exit(5)
atexit.register(h)
print("main")
### handler registered by a handler (never runs)
import atexit
def a():
    print("a")
    atexit.register(print, "late")
atexit.register(a)
print("main")
### uncaught exception after output
import atexit
atexit.register(print, "bye")
print("x")
raise ValueError("v")
### stdin to EOF
total = 0
while True:
    try:
        line = input()
    except EOFError:
        break
    total += sum(map(int, line.split()))
print(total)
### atexit writes sys.__stdout__.buffer
import atexit, io, sys
out = []
sys.stdout = io.StringIO()
atexit.register(lambda: sys.__stdout__.buffer.write(("\n".join(out) + "\n").encode()))
out.append("answer")
### printed, then sys.stdout replaced
import io, sys
print("before")
sys.stdout = io.StringIO()
print("hidden")
### sys.stdout set to None
import sys
print("before")
sys.stdout = None
### stdout object without closed, writes at __del__
import sys
class Out:
    def __init__(self): self.parts = []
    def write(self, s): self.parts.append(s)
    def flush(self): pass
    def __del__(self): sys.__stdout__.write("".join(self.parts))
sys.stdout = Out()
print("hello", 42)
### pyrival FastIO/IOWrapper
import os, sys
from io import BytesIO, IOBase
BUFSIZE = 8192
class FastIO(IOBase):
    newlines = 0
    def __init__(self, file):
        self._fd = file.fileno()
        self.buffer = BytesIO()
        self.writable = "x" in file.mode or "r" not in file.mode
        self.write = self.buffer.write if self.writable else None
    def read(self):
        while True:
            b = os.read(self._fd, max(os.fstat(self._fd).st_size, BUFSIZE))
            if not b:
                break
            ptr = self.buffer.tell()
            self.buffer.seek(0, 2), self.buffer.write(b), self.buffer.seek(ptr)
        self.newlines = 0
        return self.buffer.read()
    def readline(self):
        while self.newlines == 0:
            b = os.read(self._fd, max(os.fstat(self._fd).st_size, BUFSIZE))
            self.newlines = b.count(b"\n") + (not b)
            ptr = self.buffer.tell()
            self.buffer.seek(0, 2), self.buffer.write(b), self.buffer.seek(ptr)
        self.newlines -= 1
        return self.buffer.readline()
    def flush(self):
        if self.writable:
            os.write(self._fd, self.buffer.getvalue())
            self.buffer.truncate(0), self.buffer.seek(0)
class IOWrapper(IOBase):
    def __init__(self, file):
        self.buffer = FastIO(file)
        self.flush = self.buffer.flush
        self.writable = self.buffer.writable
        self.write = lambda s: self.buffer.write(s.encode("ascii"))
        self.read = lambda: self.buffer.read().decode("ascii")
        self.readline = lambda: self.buffer.readline().decode("ascii")
sys.stdin, sys.stdout = IOWrapper(sys.stdin), IOWrapper(sys.stdout)
input = lambda: sys.stdin.readline().rstrip("\r\n")
def main():
    n = int(input())
    print(sum(map(int, input().split())) * n)
if __name__ == "__main__":
    main()
### sys.stdout = open(1, 'w'), big buffer
import sys
sys.stdout = open(1, "w", buffering=1 << 20)
for i in range(100000):
    print(i)
### file on fd 1 never closed
out = open(1, "w", buffering=1 << 20, closefd=False)
for i in range(100000):
    out.write("%d\n" % i)
### binary file on a dup of fd 1 never closed
import os
w = os.fdopen(os.dup(1), "wb")
w.write(b"bin\n")
### TextIOWrapper over sys.stdout.buffer
import io, sys
sys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8")
print("größe ✓")
### stdout is not seekable
import sys
print(sys.stdout.seekable())
try:
    sys.stdout.tell()
except OSError as e:
    print("tell fails", e.errno)
### detached stdout (status 120: the interpreter's flush of sys.stdout fails)
import sys
sys.stdout.detach().write(b"detached\n")
### __del__ of a global
class A:
    def __del__(self):
        print("del")
a = A()
print("main")
### __del__ reads globals
class A:
    def __del__(self):
        print(RESULT)
RESULT = 5
a = A()
### __del__ order after atexit
import atexit
class A:
    def __init__(self, n): self.n = n
    def __del__(self): print("del", self.n)
xs = [A(1), A(2)]
b = A(3)
atexit.register(print, "atexit")
print("main")
### __del__ at exit, large
class A:
    def __del__(self):
        print("z" * 300000)
a = A()
### cycle with __del__, gc disabled
import gc
gc.disable()
class A:
    def __del__(self): print("del cyc")
a = A(); a.self = a
del a
print("main")
### flusher held in a global dict
class Flusher:
    def __init__(self): self.lines = []
    def __del__(self): print("\n".join(self.lines))
state = {"f": Flusher()}
state["f"].lines += ["a", "b"]
### generator's finally
def gen():
    try:
        yield 1
        yield 2
    finally:
        print("closed")
g = gen()
print(next(g))
### __del__ in a frame of the traceback
class A:
    def __del__(self): print("del")
def f():
    a = A()
    raise ValueError("x")
print("before")
f()
### weakref.finalize
import sys, weakref
class Res: pass
r = Res()
weakref.finalize(r, sys.stdout.write, "finalized\n")
print("main")
### non-daemon thread prints late
import threading, time
def f():
    time.sleep(0.2); print("late")
threading.Thread(target=f).start()
print("main")
### thread still running when main fails
import threading, time
def f():
    time.sleep(0.1); print("thread")
threading.Thread(target=f).start()
raise RuntimeError("main fails")
### main in a thread with a big stack
import sys, threading
sys.setrecursionlimit(1 << 20)
threading.stack_size(1 << 26)
def main():
    print(sum(map(int, sys.stdin.read().split())))
threading.Thread(target=main).start()
### executor left open, callback prints
from concurrent.futures import ThreadPoolExecutor
import time
ex = ThreadPoolExecutor(2)
fut = ex.submit(lambda: (time.sleep(0.1), 7)[1])
fut.add_done_callback(lambda f: print("done", f.result()))
### daemon thread asleep, __del__ prints
import threading, time
threading.Thread(target=time.sleep, args=(100,), daemon=True).start()
class A:
    def __del__(self): print("del")
a = A()
print("m")
### a helper module's atexit handler and finalizer
HELPER = """import atexit
class Out:
    def __init__(self): self.parts = []
    def __del__(self): print("".join(self.parts))
out = Out()
atexit.register(print, "helper atexit")
"""
with open("helper.py", "w") as f:
    f.write(HELPER)
import helper
helper.out.parts.append("from the helper's global")
print("main")
### __file__, __name__, argv
import os, sys
print(__name__, os.path.basename(__file__), os.path.isabs(__file__), sys.argv)
'''

# Programs whose stderr must match too (tracebacks, messages), once paths are normalised.
STDERR_TEXT = r'''
### traceback
def f():
    return 1 / 0
print("x")
f()
### syntax error
print(1
### sys.exit with a message
import sys
print("x")
sys.exit("bad input")
'''


def _programs(text: str) -> dict[str, str]:
    names = re.findall(r"^### (.*)$", text, flags=re.M)
    return dict(zip(names, re.split(r"^### .*\n", text, flags=re.M)[1:]))


PROGRAMS = _programs(PROGRAM_TEXT)
STDERR_TOO = {**_programs(STDERR_TEXT),
              "uncaught exception after output": PROGRAMS["uncaught exception after output"]}
CODEFORCES_ATEXIT = PROGRAMS["codeforces StringIO + atexit to sys.__stdout__"]


def _normal(stderr: bytes) -> bytes:
    return re.sub(rb'File "[^"]*solution\.py"', b'File "solution.py"', stderr)


def _host(code: str, stdin: bytes, tmp: Path) -> tuple[int, bytes, bytes]:
    """`python solution.py < input`, with the sandbox's interpreter and locale, outside it."""
    tmp.mkdir(parents=True)
    (tmp / "solution.py").write_text(code, encoding="utf-8")
    p = subprocess.run([PYTHON, "solution.py"], input=stdin, capture_output=True, cwd=tmp,
                       env=dict(ENV, HOME=str(tmp)), timeout=60)
    return p.returncode, p.stdout, p.stderr


def _fresh(code: str, stdin: bytes, tmp: Path) -> tuple[int, bytes, bytes]:
    tmp.mkdir(parents=True)
    (tmp / "solution.py").write_text(code, encoding="utf-8")
    p = subprocess.run([PYTHON, "-I", "-S", "-B", "-c", HARNESS.read_text(encoding="utf-8"), "stdio"],
                       input=stdin, capture_output=True, cwd=tmp, env=dict(ENV, HOME=str(tmp)), timeout=60)
    return p.returncode, p.stdout, p.stderr


# The stand-in runner: started like the launcher, it forks per case and runs the harness there.
RUNNER = r'''
import marshal, os, select, signal, sys, time
data = b""
while True:
    chunk = os.read(0, 1 << 16)
    if not chunk:
        break
    data += chunk
spec = marshal.loads(data)
try:  # the runner's interpreter has imported the launcher's modules
    exec(compile(spec["launcher"], "launcher.py", "exec"), {"__name__": "launcher"})
except Exception:
    pass
null = os.open("/dev/null", os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
os.close(null)
harness = compile(spec["harness"], "harness.py", "exec")


def run(case):
    in_r, in_w = os.pipe2(os.O_CLOEXEC)
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        try:
            os.chdir(case["cwd"])
            os.setpgid(0, 0)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for target, fd in ((0, in_r), (1, out_w), (2, err_w)):
                os.dup2(fd, target, inheritable=True)
            os.closerange(3, 1 << 16)
            os.environ.clear()
            os.environ.update(dict(spec["env"], HOME=case["cwd"], TMPDIR=case["cwd"], PWD=case["cwd"]))
            sys.argv[:] = ["-c", "stdio"]
            import builtins
        except BaseException:
            os._exit(127)
        exec(harness, {"__name__": "__harness__", "__builtins__": builtins, "JOB": {"mode": "stdio"}})
        os._exit(0)
    for fd in (in_r, out_w, err_w):
        os.close(fd)
    stdin, outs, deadline = case["stdin"], {out_r: b"", err_r: b""}, time.monotonic() + 30
    os.set_blocking(in_w, False)
    if not stdin:
        os.close(in_w)
    open_fds = [out_r, err_r]
    while open_fds:
        writers = [in_w] if stdin else []
        r, w, _ = select.select(open_fds, writers, [], max(0.0, deadline - time.monotonic()))
        if not r and not w:
            break
        if w:
            try:
                stdin = stdin[os.write(in_w, stdin):]
            except BrokenPipeError:
                stdin = b""
            if not stdin:
                os.close(in_w)
        for fd in r:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                outs[fd] += chunk
            else:
                open_fds.remove(fd)
                os.close(fd)
    if stdin:
        os.close(in_w)
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    _, status = os.waitpid(pid, 0)
    for fd in open_fds:
        os.close(fd)
    return os.waitstatus_to_exitcode(status), outs[out_r], outs[err_r]


with open(spec["report"], "wb") as f:
    f.write(marshal.dumps([run(case) for case in spec["cases"]]))
'''


def _forked(programs: dict[str, tuple[str, bytes]], tmp: Path) -> dict[str, tuple[int, bytes, bytes]]:
    cases = []
    for i, (code, stdin) in enumerate(programs.values()):
        d = tmp / f"case{i}"
        d.mkdir(parents=True)
        (d / "solution.py").write_text(code, encoding="utf-8")
        cases.append({"cwd": str(d), "stdin": stdin})
    report = tmp / "report"
    spec = {"launcher": LAUNCHER.read_text(encoding="utf-8"), "env": ENV, "cases": cases, "report": str(report),
            "harness": HARNESS.read_text(encoding="utf-8")}
    p = subprocess.run([PYTHON, "-I", "-S", "-B", "-c", RUNNER], input=marshal.dumps(spec), env={"PATH": PATH},
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=300)
    assert report.exists(), p.stderr.decode(errors="replace")[-2000:]
    return dict(zip(programs, marshal.loads(report.read_bytes())))


ALL = {name: (code, STDIN) for name, code in {**PROGRAMS, **STDERR_TOO}.items()}


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("host")
    return {name: _host(code, stdin, tmp / f"p{i}") for i, (name, (code, stdin)) in enumerate(ALL.items())}


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    return _forked(ALL, tmp_path_factory.mktemp("forked"))


@pytest.fixture(scope="module")
def sandboxed():
    try:
        sb = Sandbox(SandboxLimits(timeout_s=10.0))
    except SandboxUnavailable as e:
        pytest.skip(f"no full sandbox here: {str(e)[:300]}")
    jobs = [Job([sb.python], {"solution.py": code}, cases=[Case(stdin=stdin, harness={"mode": "stdio"})])
            for code, stdin in ALL.values()]
    cases = [r.cases[0] if r.cases else r for r in sb.map(jobs)]  # a one-case job is its case
    return {name: (c.exit_code, c.stdout, c.stderr, c.status, c.reason) for name, c in zip(ALL, cases)}


def _same(got, want, name):
    code, out, err = got[:3]
    assert (out, code) == (want[1], want[0]), (
        f"{name}: stdout/exit differ from python solution.py\n  want exit {want[0]} stdout {want[1][-300:]!r}\n"
        f"  got  exit {code} stdout {out[-300:]!r}\n  stderr {err[-800:]!r}")
    if name in STDERR_TOO:
        assert _normal(err) == _normal(want[2]), name


@pytest.mark.parametrize("name", list(ALL))
def test_in_a_fork_of_a_runner_like_interpreter(name, host, forked):
    _same(forked[name], host[name], name)


@pytest.mark.parametrize("name", list(ALL))
def test_in_a_new_interpreter(name, host, tmp_path):
    code, stdin = ALL[name]
    _same(_fresh(code, stdin, tmp_path / "case"), host[name], name)


@pytest.mark.parametrize("name", list(ALL))
def test_in_the_sandbox(name, host, sandboxed):
    _same(sandboxed[name], host[name], name)


def test_the_code_verifier_scores_the_atexit_idiom():
    problem = {"id": "sum", "tests": [{"stdin": "3\n1 2 3\n", "stdout": "6\n2\n4\n6\n"},
                                      {"stdin": "1\n-5\n", "stdout": "-5\n-10\n"}]}
    try:
        verifier = CodeVerifier(timeout_s=5.0)
    except SandboxUnavailable as e:
        pytest.skip(f"no full sandbox here: {str(e)[:300]}")
    completion = f"```python\n{CODEFORCES_ATEXIT}```"
    [result] = verifier.score_batch([completion], [Example("x", [], None, problem)])
    assert not isinstance(result, Exception), result
    assert result.score == 1.0, result.details


def test_the_harness_imports_only_builtin_modules_at_start_up():
    """Start-up is paid per case: the module level imports builtins, marshal, os and sys only;
    what the shutdown needs is imported there, lazily."""
    tree = ast.parse(HARNESS.read_text(encoding="utf-8"))
    names = {alias.name for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
             for alias in node.names}
    assert names <= {"builtins", "marshal", "os", "sys"}, names
