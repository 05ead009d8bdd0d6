"""The test harness that runs INSIDE the sandbox, as the program the launcher execs (the code
verifier passes this file's text with ``python -I -S -c``). It is not trusted for the verdict: the
candidate's code runs in its process and may patch or break it. It only runs the candidate and
reports what the candidate produced, one line per test case on fd 3; the expected outputs never
enter the sandbox, and the trusted parent compares them. A candidate that tampers with this file
can at most report some output of its own for a test case, which is then compared like any other.

Job (marshal, on stdin):
  mode:        "function": call entry_point(*args, **kwargs) per test, report the return value
               as JSON; "stdio": run the file as __main__ per test with the test's stdin,
               report its stdout.
  source:      the candidate's file name in the working directory.
  entry_point: function name (function mode).
  tests:       list of {"args": [...], "kwargs": {...}} or {"stdin": "..."}.
  timeout_s:   wall-clock limit of each test case; the case's process group is killed after it.
  max_bytes:   the most output kept per test case.

Each test case runs in a fresh fork of this process, so one case cannot change the state another
case sees, a crash or a timeout costs only that case, and each gets its own time limit.

Report, one JSON object per line on fd 3:
  {"i": k, "status": "ok" | "error" | "timeout" | "crashed" | "output_limit",
   "data": <JSON text of the return value, or the stdout>, "info": <error text>, "exit": <code>}
  and {"i": -1, "status": "error", "info": ...} when the file cannot even be loaded.
Only the standard library's builtin modules are imported: start-up time is paid on every run.
"""

import _signal
import builtins
import marshal
import os
import select
import sys
import time

_ESC = {i: "\\u%04x" % i for i in range(32)}
_ESC.update({i: "\\u%04x" % i for i in range(0xD800, 0xE000)})  # lone surrogates
_ESC[ord('"')] = '\\"'
_ESC[ord("\\")] = "\\\\"


def _jstr(s):
    return '"' + str.__str__(s).translate(_ESC) + '"'


def to_json(x, depth=0):
    """JSON text of plain data. Subclasses are read through their base type's methods, so an
    object cannot pass for another value (an int subclass with __eq__ always True is written
    as its integer value)."""
    if depth > 200:
        raise ValueError("nested more than 200 levels deep")
    if x is None:
        return "null"
    if x is True:
        return "true"
    if x is False:
        return "false"
    if isinstance(x, int):
        return int.__repr__(x)
    if isinstance(x, float):
        r = float.__repr__(x)
        return {"inf": "Infinity", "-inf": "-Infinity", "nan": "NaN"}.get(r, r)
    if isinstance(x, str):
        return _jstr(x)
    if isinstance(x, list):
        return "[" + ", ".join(to_json(v, depth + 1) for v in list.copy(x)) + "]"
    if isinstance(x, tuple):
        return "[" + ", ".join(to_json(tuple.__getitem__(x, i), depth + 1)
                               for i in range(tuple.__len__(x))) + "]"
    if isinstance(x, dict):
        parts = []
        for k, v in list(dict.items(x)):
            if isinstance(k, str):
                key = _jstr(k)
            elif k is None or isinstance(k, (bool, int, float)):
                key = _jstr(to_json(k))  # as json.dumps does
            else:
                raise TypeError(f"dict key of type {type(k).__name__} is not JSON")
            parts.append(key + ": " + to_json(v, depth + 1))
        return "{" + ", ".join(parts) + "}"
    raise TypeError(f"a value of type {type(x).__name__} is not plain data (None, bool, int, "
                    "float, str, list, tuple or dict)")


def _describe(e):
    try:
        text = str(e)
    except BaseException:  # noqa: BLE001 - a hostile __str__
        text = "?"
    return (type(e).__name__ + (": " + text if text else ""))[:500]


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _report(fd, **fields):
    parts = []
    for k, v in fields.items():
        parts.append(_jstr(k) + ": " + (to_json(v) if not isinstance(v, str) else _jstr(v)))
    _write_all(fd, ("{" + ", ".join(parts) + "}\n").encode("utf-8"))


def _exit_builtin(code=None):
    raise SystemExit(code)


def _child(job, test, code, fn, data_w, info_w):
    """One test case; never returns."""
    status = 0
    try:
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
        os.setpgid(0, 0)
        if job["mode"] == "function":
            null = os.open("/dev/null", os.O_RDWR)
            os.dup2(null, 0)
            os.dup2(null, 1)
            try:
                value = fn(*test.get("args", ()), **test.get("kwargs", {}))
                text = to_json(value)
            except BaseException as e:  # noqa: BLE001 - any failure is the case's result
                _write_all(info_w, _describe(e).encode("utf-8", "replace"))
                os._exit(1)
            _write_all(data_w, text.encode("utf-8"))
        else:
            stdin = os.memfd_create("stdin")
            _write_all(stdin, test.get("stdin", "").encode("utf-8"))
            os.lseek(stdin, 0, os.SEEK_SET)
            os.dup2(stdin, 0)
            os.dup2(data_w, 1)
            sys.stdin = open(0, "r", encoding="utf-8", errors="replace", closefd=False)
            sys.stdout = open(1, "w", encoding="utf-8", errors="replace", closefd=False)
            g = {"__name__": "__main__", "__file__": job["source"], "__builtins__": builtins}
            try:
                exec(code, g)
            except SystemExit as e:
                status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException as e:  # noqa: BLE001
                _write_all(info_w, _describe(e).encode("utf-8", "replace"))
                status = 1
            try:
                sys.stdout.flush()
            except BaseException as e:  # noqa: BLE001 - e.g. the output pipe was closed
                _write_all(info_w, _describe(e).encode("utf-8", "replace"))
                status = status or 1
    except BaseException as e:  # noqa: BLE001
        try:
            _write_all(info_w, _describe(e).encode("utf-8", "replace"))
        finally:
            os._exit(1)
    os._exit(status)  # skips interpreter shutdown: threads left behind end with the case


def _run_case(job, i, test, code, fn, out):
    data_r, data_w = os.pipe()
    info_r, info_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(data_r)
        os.close(info_r)
        _child(job, test, code, fn, data_w, info_w)
    os.close(data_w)
    os.close(info_w)
    deadline = time.monotonic() + job["timeout_s"]
    cap = job["max_bytes"]
    data, info = bytearray(), bytearray()
    status, open_fds = None, {data_r: data, info_r: info}
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            status = "timeout"
            break
        ready, _, _ = select.select(list(open_fds), [], [], left)
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                del open_fds[fd]
                continue
            buf = open_fds[fd]
            buf += chunk
            if len(buf) > cap:
                del buf[cap:]
                status = "output_limit"
                open_fds.clear()
                break
    exit_code = None
    while status is None:  # output closed: wait for the exit, within the same deadline
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            exit_code = os.waitstatus_to_exitcode(st)
            break
        if time.monotonic() > deadline:
            status = "timeout"
            break
        time.sleep(0.001)
    if exit_code is None:
        for kill, target in ((os.killpg, pid), (os.kill, pid)):  # the group, or the case alone
            try:
                kill(target, _signal.SIGKILL)
            except OSError:
                pass
        _, st = os.waitpid(pid, 0)
        if status is None:
            exit_code = os.waitstatus_to_exitcode(st)
    os.close(data_r)
    os.close(info_r)
    if status is None:
        status = "ok" if exit_code == 0 else ("crashed" if exit_code < 0 else "error")
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:  # orphans of the case, re-parented to us (pid 1)
            pass
    except ChildProcessError:
        pass
    _report(out, i=i, status=status, data=bytes(data).decode("utf-8", "replace"),
            info=bytes(info).decode("utf-8", "replace"), exit=exit_code)


def main():
    out = 3
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # only the trusted parent stops the harness
    builtins.exit = builtins.quit = _exit_builtin  # `site` is not loaded (-S), so define them
    job = marshal.loads(sys.stdin.buffer.read())
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    sys.argv = [job["source"]]
    sys.path.insert(0, os.getcwd())  # the candidate may import its own helper files
    fn = None
    try:
        with open(job["source"], encoding="utf-8") as f:
            code = compile(f.read(), job["source"], "exec")
        if job["mode"] == "function":
            saved = os.dup(1)
            os.dup2(os.open("/dev/null", os.O_WRONLY), 1)  # prints at import time are not output
            try:
                ns = {"__name__": "solution", "__file__": job["source"], "__builtins__": builtins}
                exec(code, ns)
            finally:
                os.dup2(saved, 1)
            fn = ns.get(job["entry_point"])
            if not callable(fn):
                raise NameError(f"the code defines no function named {job['entry_point']!r}")
    except BaseException as e:  # noqa: BLE001 - the file itself failed: every case fails
        _report(out, i=-1, status="error", info=_describe(e))
        os._exit(0)
    for i, test in enumerate(job["tests"]):
        _run_case(job, i, test, code, fn, out)
    os._exit(0)


main()
