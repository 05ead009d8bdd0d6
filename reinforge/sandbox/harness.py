"""The program the code verifier runs INSIDE the sandbox for one test case. The sandbox's runner
(pid 1, another process) times the case and collects its output; this file only starts the
candidate's code. It is not trusted for the verdict: the candidate's code runs in its process and
may patch or break it, which at most changes what this one case claims as its output, compared
outside.

It runs either in a fresh interpreter (``python -I -S -B -c <this text> MODE``, the job as
marshal data on stdin) or, what the code verifier uses, in a fork of the runner's own
interpreter (the runner sets JOB): no interpreter start-up per case, and the same process
boundary. Either way:

MODE "function": the job is {"entry_point", "args", "kwargs"} for this one test. The candidate's
    file is loaded as a module (what it prints goes to /dev/null), the function is called, and
    fd 3 gets "ok\\n" + the JSON of the return value, or "error\\n" + a description. The process
    then ends at once (threads the call left behind do not count).
MODE "stdio": the candidate's file runs as __main__ with the test's stdin, as
    ``python solution.py`` would, ending the way an interpreter does: non-daemon threads joined,
    atexit handlers run, standard streams flushed, SystemExit's code (or 1 after an uncaught
    exception, its traceback on stderr) as the exit status. Its stdout is the case's output.

Each case is a new process: nothing from another case (its inputs, its state, time spent) is
here, and the candidate's import time counts within the case's limit. Only builtin modules are
imported: start-up time is paid on every case.
"""

import builtins
import marshal
import os
import sys

SOURCE = "solution.py"
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


def _report(tag, text):
    data = (tag + "\n" + text).encode("utf-8", "replace")
    view = memoryview(data)
    while view:
        view = view[os.write(3, view):]


def _exit_builtin(code=None):
    raise SystemExit(code)


def _function(job):
    if job is None:
        job = marshal.loads(sys.stdin.buffer.read())
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    try:
        with open(SOURCE, "rb") as f:
            code = compile(f.read(), SOURCE, "exec")
        module = {"__name__": "solution", "__file__": SOURCE, "__builtins__": builtins}
        exec(code, module)
        fn = module.get(job["entry_point"])
        if not callable(fn):
            raise NameError(f"the code defines no function named {job['entry_point']!r}")
        text = to_json(fn(*job["args"], **job["kwargs"]))
    except BaseException as e:  # noqa: BLE001 - any failure is the case's result
        _report("error", _describe(e))
        os._exit(1)
    _report("ok", text)
    os._exit(0)


def _stdio(in_fork):
    with open(SOURCE, "rb") as f:
        code = compile(f.read(), SOURCE, "exec")
    sys.argv[:] = [SOURCE]
    main = sys.modules["__main__"].__dict__
    fresh = {"__name__": "__main__", "__file__": SOURCE, "__builtins__": builtins, "__doc__": None,
             "__loader__": None, "__spec__": None, "__package__": None}
    run, finish = exec, _finish
    # From here on only locals: the candidate's __main__ holds what a fresh script's would.
    main.clear()
    main.update(fresh)
    if not in_fork:
        run(code, main)  # a real interpreter ends it
        return
    status = 0
    try:
        run(code, main)
    except SystemExit as e:
        status = _exit_status(e.code)
    except BaseException:  # noqa: BLE001 - as the interpreter: traceback, status 1
        sys.excepthook(*sys.exc_info())
        status = 1
    finish(status)


def _exit_status(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except BaseException:  # noqa: BLE001
        pass
    return 1


def _finish(status):
    """What Py_FinalizeEx does before the process ends: wait for non-daemon threads, run the
    atexit handlers, flush the standard streams that are still open."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:  # noqa: BLE001
            pass
    try:
        import atexit

        atexit._run_exitfuncs()
    except SystemExit as e:
        status = _exit_status(e.code)
    except BaseException:  # noqa: BLE001
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None and not stream.closed:
                stream.flush()
        except BaseException:  # noqa: BLE001 - e.g. the reader went away
            status = status or 120
    os._exit(status)


builtins.exit = builtins.quit = _exit_builtin  # `site` is not loaded (-S): define them
sys.path.insert(0, os.getcwd())  # the candidate may import its own helper files
_job = globals().get("JOB")
if _job is not None:
    (_function if _job["mode"] == "function" else lambda j: _stdio(True))(_job)
elif sys.argv[1:] == ["function"]:
    _function(None)
else:
    _stdio(False)
