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
    In the fork, the standard streams are made anew on fds 0-2 as an interpreter makes them, and
    the end follows Py_FinalizeEx step by step (_finish), modules torn down included, so objects
    finalized at exit (__del__, open files, sys.__stdout__ behind a replaced sys.stdout) write
    what they would.

Each case is a new process: nothing from another case (its inputs, its state, time spent) is
here, and the candidate's import time counts within the case's limit. Only builtin modules are
imported: start-up time is paid on every case.
"""

import builtins
import marshal
import os
import sys

SOURCE = "solution.py"
_BUILTINS = dict(builtins.__dict__)  # what the interpreter restores at its end (before site)
_RUNNER_STREAMS = _RUNNER_MODULES = ()
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
    path = os.path.join(os.getcwd(), SOURCE)  # __file__ and tracebacks as `python solution.py` has them
    with open(SOURCE, "rb") as f:
        source = f.read()
    sys.argv[:] = [SOURCE]
    if in_fork:
        import gc

        global _RUNNER_MODULES
        # The runner's objects are not the candidate's: no collection walks them (copying their
        # pages into this process) or finalizes them; the end collects what the candidate made.
        gc.freeze()
        _RUNNER_MODULES = {id(m): m for m in sys.modules.values()}  # held: no id is reused
        _standard_streams()
    modules = sys.modules  # the interpreter's own, whatever sys.modules is made to be later
    old = sys.modules["__main__"].__dict__
    try:  # as the interpreter's: the source file's loader
        loader = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path)
    except Exception:  # noqa: BLE001
        loader = None
    fresh = {"__name__": "__main__", "__doc__": None, "__package__": None, "__loader__": loader,
             "__spec__": None, "__annotations__": {}, "__builtins__": builtins, "__file__": path,
             "__cached__": None}
    run, finish, uncaught, flush_io = exec, _finish, _uncaught, _flush_io
    status, interrupted = 0, False
    try:
        code = compile(source, path, "exec")
    except BaseException:  # noqa: BLE001 - a SyntaxError, reported as the interpreter does
        code, status, interrupted = None, 1, uncaught()
    # From here on only locals: the candidate's __main__ holds what a fresh script's would.
    old.clear()
    if not in_fork:
        if code is None:
            raise SystemExit(status)
        old.update(fresh)
        try:
            try:
                run(code, old)  # a real interpreter ends it
            finally:
                flush_io()
        except (SystemExit, KeyboardInterrupt):
            raise  # its status; or its SIGINT
        except BaseException:  # noqa: BLE001 - the traceback without this file's frames
            uncaught()
            raise SystemExit(1) from None
        return
    # A module of its own, as a script's: the runner's __main__ dict stays referenced by the
    # runner's frames, and the candidate's must be freed at the end (its objects finalized).
    module = type(sys)("__main__")
    main = module.__dict__
    main.update(fresh)
    sys.modules["__main__"] = module
    del old, module, fresh, loader
    if code is not None:
        try:
            try:
                run(code, main)
            finally:
                flush_io()
        except SystemExit as e:
            status = _exit_status(e.code)
        except BaseException:  # noqa: BLE001 - as the interpreter: traceback, status 1
            status, interrupted = 1, uncaught()
    del main, code  # the candidate's namespace is referenced by its module alone now
    finish(status, interrupted, modules)


def _standard_streams():
    """New sys.stdin/stdout/stderr (and __stdin__...) on fds 0-2, made as the interpreter makes
    them at start-up (create_stdio in Python/pylifecycle.c). The runner's were made for other
    files: its stdout for /dev/null, which is seekable, so a TextIOWrapper over its buffer failed
    with ESPIPE on the case's pipe, and tell() answered. The runner's objects are kept, never
    finalized: what they might hold is not the candidate's output."""
    import io

    global _RUNNER_STREAMS
    _RUNNER_STREAMS = (sys.stdin, sys.stdout, sys.stderr, sys.__stdin__, sys.__stdout__, sys.__stderr__)
    streams = []
    for fd, name, model in ((0, "<stdin>", sys.__stdin__), (1, "<stdout>", sys.__stdout__),
                            (2, "<stderr>", sys.__stderr__)):
        try:
            buf = io.open(fd, "rb" if fd == 0 else "wb", -1, None, None, None, False)
            buf.raw.name = name
            stream = io.TextIOWrapper(
                buf, getattr(model, "encoding", None) or "utf-8",
                getattr(model, "errors", None) or ("backslashreplace" if fd == 2 else "surrogateescape"),
                "\n", fd == 2 or buf.raw.isatty(), False)
            stream.mode = "r" if fd == 0 else "w"
        except (OSError, ValueError):  # not open: the interpreter sets None
            stream = None
        streams.append(stream)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams


def _flush_io(sys=sys):  # bound here: in a new interpreter this file's globals are cleared by then
    """What the interpreter does as soon as the main module has run (flush_io in
    Python/pythonrun.c), before it reports an exception and before atexit: flush sys.stderr and
    sys.stdout, ignoring errors."""
    for name in ("stderr", "stdout"):
        try:
            sys.__dict__.get(name).flush()
        except BaseException:  # noqa: BLE001
            pass


def _uncaught(sys=sys):  # bound here: in a new interpreter this file's globals are cleared by then
    """Report the exception being handled as the interpreter reports an uncaught one
    (PyErr_Print): sys.last_*, then sys.excepthook, with the traceback from the candidate's code
    on. Returns whether it was a KeyboardInterrupt (the interpreter then ends by SIGINT)."""
    etype, value, tb = sys.exc_info()
    if tb is not None:
        tb = tb.tb_next  # this file's frame is not the candidate's
        value.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
    if sys.version_info >= (3, 12):
        sys.last_exc = value
    try:
        sys.excepthook(etype, value, tb)
    except BaseException:  # noqa: BLE001 - as the interpreter: the hook's error, then the original
        try:
            sys.__excepthook__(*sys.exc_info())
            sys.__excepthook__(etype, value, tb)
        except BaseException:  # noqa: BLE001
            pass
    return issubclass(etype, KeyboardInterrupt)


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


def _flush_std():
    """flush_std_files: flush sys.stdout and sys.stderr where set and not closed (an object
    without a `closed` attribute counts as open). False if a flush failed."""
    ok = True
    for name in ("stdout", "stderr"):
        stream = sys.__dict__.get(name)
        if stream is None:
            continue
        try:
            closed = bool(stream.closed)
        except BaseException:  # noqa: BLE001 - as the interpreter: then it is open
            closed = False
        try:
            if not closed:
                stream.flush()
        except BaseException:  # noqa: BLE001 - e.g. the reader went away
            ok = False
    return ok


def _finish(status, interrupted, modules):
    """The rest of Py_FinalizeEx, in its order: wait for non-daemon threads, run the atexit
    handlers, flush sys.stdout and sys.stderr (status 120 if that fails), collect garbage, tear
    the modules down as finalize_modules does. So __del__ methods, generators' finally blocks and
    files the candidate left open (on fd 1, or sys.__stdout__ behind a replaced sys.stdout) run
    and flush when and as they would. Then the process ends with the status."""
    import _signal
    import gc

    exit_, base = os._exit, BaseException  # all that is used once everything is torn down
    threading = modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:  # noqa: BLE001
            pass
    try:  # each handler's error is reported there; none changes the status (not even SystemExit)
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001
        pass
    if not _flush_std():
        status = 120
    kill = (_signal.signal, _signal.SIGINT, _signal.SIG_DFL, os.kill, os.getpid()) if interrupted else None
    try:
        if gc.isenabled():
            gc.collect()
        _teardown(modules, gc.collect)
    except base:  # noqa: BLE001 - builtins may be gone: nothing to report with
        pass
    if kill is not None:
        try:
            kill[0](kill[1], kill[2])
            kill[3](kill[4], kill[1])
        except base:  # noqa: BLE001
            pass
        status = 130  # what the interpreter returns when the signal does not end it
    exit_(status)


def _teardown(modules, collect):
    """finalize_modules (Python/pylifecycle.c): sys.stdout... restored from sys.__stdout__...,
    every module removed from sys.modules, builtins restored, garbage collected, the modules
    still alive wiped (those imported last first; not the runner's own, which hold nothing of
    the candidate's), sys and builtins wiped, garbage collected. sys.__stdout__ is flushed as it
    is freed. Uses only what it bound first: builtins are gone at the end."""
    import _weakref

    bdict, sysd, sys_, builtins_, runner = builtins.__dict__, sys.__dict__, sys, builtins, _RUNNER_MODULES
    module_type, ref, id_, isinstance_, str_, list_ = type(sys), _weakref.ref, id, isinstance, str, list

    def clear(d):  # _PyModule_ClearDict: names "_x" first, then all but __builtins__
        for key in list_(d):
            if isinstance_(key, str_) and key[:1] == "_" and key[1:2] != "_" and d.get(key) is not None:
                d[key] = None
        for key in list_(d):
            if isinstance_(key, str_) and key != "__builtins__" and d.get(key) is not None:
                d[key] = None

    bdict["_"] = None
    for name in ("path", "argv", "ps1", "ps2", "last_exc", "last_type", "last_value", "last_traceback",
                 "path_hooks", "path_importer_cache", "meta_path", "__interactivehook__"):
        if name != "last_exc" or name in sysd:
            sysd[name] = None
    for name in ("stdin", "stdout", "stderr"):
        sysd[name] = sysd.get("__" + name + "__")
    alive = []
    for name, module in list_(modules.items()):
        if isinstance_(module, module_type):
            alive.append(ref(module))
            modules[name] = None
    modules.clear()
    bdict.clear()
    bdict.update(_BUILTINS)
    collect()
    for wr in alive[::-1]:
        module = wr()
        if module is not None and module is not sys_ and module is not builtins_ and id_(module) not in runner:
            clear(module.__dict__)
        module = None
    clear(sysd)
    clear(bdict)
    collect()


builtins.exit = builtins.quit = _exit_builtin  # `site` is not loaded (-S): define them
sys.path.insert(0, os.getcwd())  # the candidate may import its own helper files
_job = globals().get("JOB")
if _job is not None:
    (_function if _job["mode"] == "function" else lambda j: _stdio(True))(_job)
elif sys.argv[1:] == ["function"]:
    _function(None)
else:
    _stdio(False)
