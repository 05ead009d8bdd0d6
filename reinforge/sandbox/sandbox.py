"""Sandbox (run programs and wait for them, alone or on a pool) and SandboxProcess (a long-lived
one); both start launcher.py, compiled once here and sent whole to a fresh interpreter."""

from __future__ import annotations

import itertools
import logging
import marshal
import math
import os
import secrets
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .limits import (_BACKSTOP_S, _ENV, _LIBSECCOMP, _STATUS_CAP, CGROUP_MODES, ISOLATION_LEVELS, Case,
                     ExecResult, Isolation, Job, SandboxLimits, SandboxUnavailable, _visible_paths,
                     default_workers, sandbox_python)
from .probe import _cgroup_message, _libseccomp_error, _unavailable_message, memory_cgroup
from .wire import _communicate, _frame_cap, _kill_launcher, _remove_cgroup, _results

logger = logging.getLogger("reinforge.sandbox")

_LAUNCHER = Path(__file__).with_name("launcher.py")

# The launcher's environment: no secret of the trainer's, and the locale a program's interpreter
# gets (the harness's fork continues the runner's interpreter; without LANG it would run in UTF-8
# mode, unlike `python solution.py`).
_LAUNCHER_ENV = {k: _ENV[k] for k in ("PATH", "LANG", "LC_ALL")}
_probe_lock = threading.Lock()
_probe_cache: dict[tuple, dict] = {}
_run_ids = itertools.count()


class Sandbox:
    """Runs programs under `limits` with the given isolation.

    isolation="full" (default) requires user, mount, pid, network, IPC and UTS namespaces and a
    seccomp filter (libseccomp.so.2); without them it raises SandboxUnavailable instead of running.
    isolation="best_effort" uses what works and warns about what does not; without namespaces
    the program can read and write your files and signal your processes (docs/sandbox.md).
    cgroup: where the run's memory cgroup comes from. "auto" (default): a memory cgroup this
            process may create children in (cgroup v1's memory hierarchy, or v2 where the memory
            controller is delegated to this process's cgroup), else none: the run's memory is
            then bounded by rlimits and seccomp alone (docs/sandbox.md); "required": refuse to
            run without one; "off"; or the path of a delegated cgroup directory to create the
            runs' cgroups in (also taken from $REINFORGE_SANDBOX_CGROUP).
    extra_ro_paths: more host paths to show read-only inside (e.g. a library the program needs).
    workers: threads of the pool used by map() (None: the CPUs this process may use).
    python: the interpreter programs run with (Sandbox.python; its installation is shown
            read-only). Default: the base interpreter of the running one, not its virtualenv.
    """

    def __init__(
        self,
        limits: SandboxLimits = SandboxLimits(),
        *,
        isolation: Isolation = "full",
        extra_ro_paths: Sequence[str] = (),
        workers: int | None = None,
        python: str | None = None,
        cgroup: str | None = None,
    ) -> None:
        if isolation not in ISOLATION_LEVELS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}, got {isolation!r}")
        if sys.platform != "linux":
            raise SandboxUnavailable(
                f"the code sandbox needs Linux (namespaces, seccomp); this is {sys.platform}"
            )
        cgroup = cgroup or os.environ.get("REINFORGE_SANDBOX_CGROUP") or "auto"
        if cgroup not in CGROUP_MODES and not os.path.isabs(cgroup):
            raise ValueError(f"cgroup must be one of {', '.join(CGROUP_MODES)} or an absolute path "
                             f"to a delegated cgroup directory, got {cgroup!r}")
        self.limits = limits
        self.isolation = isolation
        self.python = os.path.realpath(python) if python else sandbox_python()
        if not os.access(self.python, os.X_OK):
            raise ValueError(f"sandbox python {self.python!r} is not an executable file")
        # The launcher always runs on this process's own base interpreter: it speaks marshal
        # with us, and its command line (seen inside as /proc/1/cmdline) names no project path.
        self._launcher_python = sandbox_python()
        self.workers = workers or default_workers()
        self._symlinks, self._binds = _visible_paths(self.python, extra_ro_paths, custom=bool(python))
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self._cgroup_mode = cgroup
        self.mechanisms = self._probe()

    # -- availability --------------------------------------------------------------------------

    def _probe(self) -> dict:
        key = (self.python, tuple(self._binds), self.isolation, self._cgroup_mode,
               self.limits.total_memory_mb)
        with _probe_lock:
            if key in _probe_cache:
                return _probe_cache[key]
            cgroup, cgroup_error = memory_cgroup(self._cgroup_mode)
            seccomp_error = _libseccomp_error()
            mech = {"namespaces": True, "seccomp": seccomp_error is None, "memory_cgroup": cgroup}
            if cgroup is None and self._cgroup_mode != "auto" and self._cgroup_mode != "off":
                raise SandboxUnavailable(_cgroup_message(cgroup_error, "cgroup=" + self._cgroup_mode))
            if cgroup is None and self.limits.total_memory_mb is not None:
                msg = (f"code sandbox: total_memory_mb={self.limits.total_memory_mb} is NOT "
                       f"enforced: no memory cgroup ({cgroup_error}). A run's memory is bounded "
                       "by rlimits and seccomp only: max_processes x memory_mb + tmpfs_mb = "
                       f"{self.limits.max_processes * self.limits.memory_mb + self.limits.tmpfs_mb}"
                       " MiB (docs/sandbox.md; cgroup='required' refuses to run instead).")
                logger.warning(msg)
                warnings.warn(msg, RuntimeWarning, stacklevel=3)
            ns_error = self._try(mech)
            if ns_error and "memory cgroup" in ns_error:  # the cgroup failed, not the namespaces
                raise SandboxUnavailable(_cgroup_message(ns_error, "cgroup=" + self._cgroup_mode))
            if self.isolation == "full":
                if ns_error or seccomp_error:
                    raise SandboxUnavailable(_unavailable_message(ns_error, seccomp_error))
            else:
                if ns_error:
                    mech = {**mech, "namespaces": False}
                    err = self._try(mech)
                    if err:
                        hint = ""
                        if os.geteuid() == 0:
                            hint = (f". Without namespaces a program started by root runs as "
                                    f"nobody, who must be able to reach {self.python}: pass "
                                    "python= an interpreter outside root's home (e.g. /usr/bin/python3)")
                        raise SandboxUnavailable(
                            f"isolation=best_effort: namespaces are unavailable ({ns_error}) and "
                            f"running without them failed too: {err}{hint}"
                        )
                missing = [m for m, e in (("namespaces", ns_error), ("seccomp", seccomp_error)) if e]
                if missing:
                    msg = (
                        "code sandbox: isolation=best_effort is running WITHOUT "
                        + " and ".join(missing) + ": "
                        + "; ".join(e for e in (ns_error, seccomp_error) if e)
                        + ". Model-written code can then "
                        + ("read and write your files and signal your processes; " if ns_error else "")
                        + "only rlimits, a private working directory and timeouts hold it."
                    )
                    logger.warning(msg)
                    warnings.warn(msg, RuntimeWarning, stacklevel=3)
            if cgroup is None and self._cgroup_mode == "auto":
                logger.info("code sandbox: no memory cgroup (%s); a run's memory is bounded by "
                            "rlimits and seccomp (docs/sandbox.md)", cgroup_error)
            _probe_cache[key] = mech
            return mech

    def _try(self, mech: dict) -> str | None:
        # A generous limit: a busy machine must not pass for a missing mechanism.
        timeout = 30.0 if math.isinf(self.limits.timeout_s) else max(self.limits.timeout_s, 30.0)
        r = self._run(Job([self.python, "-I", "-S", "-c", "pass"], timeout_s=timeout), mech)
        if r.status == "setup_error":
            return r.reason
        if not r.ok:
            return f"a trivial program failed: {r.reason}; stderr: {r.stderr[-500:].decode(errors='replace')}"
        return None

    # -- running -------------------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, files: dict[str, str] | None = None, stdin: bytes = b"",
            result_channel: bool = False, timeout_s: float | None = None) -> ExecResult:
        """Run one program and wait for it (at most the time limit plus start-up)."""
        return self._run(Job(argv, dict(files or {}), stdin, result_channel, timeout_s), self.mechanisms)

    def run_job(self, job: Job) -> ExecResult:
        """Run a job (one program per case) and wait for it."""
        return self._run(job, self.mechanisms)

    def map(self, jobs: Sequence[Job]) -> list[ExecResult]:
        """Run jobs in parallel on the pool; results in the jobs' order."""
        if len(jobs) <= 1:
            return [self._run(j, self.mechanisms) for j in jobs]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
        return list(self._pool.map(lambda j: self._run(j, self.mechanisms), jobs))

    def start(self, job: Job) -> "SandboxProcess":
        """Start a long-lived program (the job's argv and files; timeout_s None: no wall-clock
        limit) and return a handle to talk to it over its stdin and stdout."""
        return SandboxProcess(self, job)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _case_spec(self, job: Job, case: Case, mech: dict) -> dict:
        argv, data, harness = list(case.argv or job.argv), bytes(case.stdin), case.harness
        if harness is not None:
            if harness["mode"] == "function":  # the call's arguments are the case's input
                data = marshal.dumps({k: v for k, v in harness.items() if k != "mode"})
            harness = {"mode": harness["mode"]}
        # The runner's interpreter can run the harness only where the program would see that
        # same interpreter: with namespaces (its installation is bound) and no other python=.
        if harness is not None and not (mech["namespaces"] and self.python == self._launcher_python):
            argv = [self.python, "-I", "-S", "-B", "-c", _harness_text(), harness["mode"]]
            harness = None
        caps = {"stderr": self.limits.max_output_bytes}
        if case.capture_stdout:
            caps["stdout"] = self.limits.max_output_bytes
        if case.result_channel:
            caps["results"] = case.max_result_bytes or self.limits.max_output_bytes
        timeout = case.timeout_s or self.limits.timeout_s
        # The input travels after the header and reaches the runner only when its case starts.
        return {"argv": argv, "input": data, "input_len": len(data), "caps": caps,
                "timeout_s": None if math.isinf(timeout) else float(timeout),
                "stderr_keep": job.stderr_tail, "harness": harness}

    def _spec(self, job: Job, mech: dict, cases: list[dict], interactive: bool,
              cgroup_path: str | None) -> bytes:
        total = sum(c["timeout_s"] for c in cases) if all(c["timeout_s"] is not None for c in cases) else None
        spec = {
            "mechanisms": mech,
            "files": job.files,
            "symlinks": self._symlinks,
            "ro_binds": self._binds,
            "limits": self.limits.rlimits(),
            # The runner enforces each case's limit; this is the launcher's backstop for the run.
            "wall_s": None if total is None else total + 1.0,
            "env": _ENV,
            "libseccomp": _LIBSECCOMP,
            "cases": [{k: v for k, v in c.items() if k != "input"} for c in cases],
            "interactive": interactive,
            "harness_code": _harness_code() if any(c["harness"] for c in cases) else None,
            "cgroup": None if cgroup_path is None else {
                "path": cgroup_path, "version": mech["memory_cgroup"]["version"],
                "limit": self.limits.memory_bound_mb << 20},
        }
        data = marshal.dumps(spec)
        return str(len(data)).encode() + b"\n" + data

    def _launch(self, job: Job, mech: dict, interactive: bool):
        cases = [self._case_spec(job, c, mech) for c in ([Case(timeout_s=job.timeout_s)] if interactive
                                                        else job.case_list())]
        cgroup_path = None
        if mech.get("memory_cgroup"):
            cgroup_path = os.path.join(mech["memory_cgroup"]["parent"],
                                       f"reinforge-{os.getpid()}-{next(_run_ids)}-{secrets.token_hex(4)}")
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        report_r, report_w = os.pipe2(os.O_CLOEXEC)
        cmd = [self._launcher_python, "-I", "-S", "-B", "-c", _BOOTSTRAP, str(status_w), str(report_w)]
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE if interactive else subprocess.DEVNULL,
                stderr=subprocess.PIPE, pass_fds=(status_w, report_w), env=_LAUNCHER_ENV,
                start_new_session=True, bufsize=0,
            )
        except BaseException:
            for fd in (status_r, report_r):
                os.close(fd)
            raise
        finally:
            os.close(status_w)
            os.close(report_w)
        header = _launcher_code() + self._spec(job, mech, cases, interactive, cgroup_path)
        if not interactive:  # each case's input, read by the runner just before that case
            header += b"".join(c.pop("input") for c in cases)
        return proc, status_r, report_r, header, cases, cgroup_path

    def _run(self, job: Job, mech: dict) -> ExecResult:
        start = time.monotonic()
        proc, status_r, report_r, header, cases, cgroup_path = self._launch(job, mech, interactive=False)
        streams = {"stderr": proc.stderr.fileno(), "status": status_r, "report": report_r}
        caps = {"stderr": 1 << 16, "status": _STATUS_CAP,
                "report": sum(_frame_cap(c) for c in cases)}
        if any(c["timeout_s"] is None for c in cases):
            raise ValueError("a run that is waited for needs a finite timeout_s; use "
                             "Sandbox.start for a long-lived program")
        total = sum(c["timeout_s"] for c in cases)
        try:
            out, overflow, backstop = _communicate(proc, header, streams, caps,
                                                   start + total + 1.0 + _BACKSTOP_S)
        finally:
            for s in (proc.stdin, proc.stderr):
                if s is not None and not s.closed:
                    s.close()
            os.close(status_r)
            os.close(report_r)
            proc.wait()
            if cgroup_path is not None:
                _remove_cgroup(cgroup_path)
        return _results(out, overflow, backstop, self.limits, cases, time.monotonic() - start)


# The launcher is compiled once here and sent ahead of its instructions; this bootstrap (what
# /proc/1/cmdline shows inside) reads and runs it, so a run pays no compilation.
_BOOTSTRAP = """import marshal, os
def read(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            raise SystemExit(125)
        data += chunk
    return data
line = b""
while not line.endswith(b"\\n"):
    line += read(1)
exec(marshal.loads(read(int(line))), {"__name__": "__main__"})
"""


def _launcher_code(_cache: list = []) -> bytes:  # noqa: B006 - compiled once
    if not _cache:
        code = compile(_LAUNCHER.read_text(encoding="utf-8"), "reinforge/sandbox/launcher.py", "exec")
        data = marshal.dumps(code)
        _cache.append(str(len(data)).encode() + b"\n" + data)
    return _cache[0]


def _harness_text(_cache: list = []) -> str:  # noqa: B006 - read once
    if not _cache:
        _cache.append(_LAUNCHER.with_name("harness.py").read_text(encoding="utf-8"))
    return _cache[0]


def _harness_code(_cache: list = []) -> bytes:  # noqa: B006 - compiled once
    if not _cache:
        _cache.append(marshal.dumps(compile(_harness_text(), "harness.py", "exec")))
    return _cache[0]


class SandboxProcess:
    """A long-lived program in the sandbox (Sandbox.start), talked to over its stdin and stdout.
    The caller bounds every exchange: read_line() takes a size cap and a deadline. kill() ends
    the whole sandbox (the launcher's death kills the namespace)."""

    def __init__(self, sandbox: Sandbox, job: Job) -> None:
        self._proc, self._status_r, self._report_r, header, _, self._cgroup = sandbox._launch(
            job, sandbox.mechanisms, interactive=True)
        self._stdin = self._proc.stdin.fileno()
        self._stdout = self._proc.stdout.fileno()
        self._pending = bytearray()
        self._stderr_tail = bytearray()
        self._lock = threading.Lock()
        self._closed = False
        # The program's stderr is the launcher's: keep reading it (else the program blocks once
        # the pipe is full), keeping only its end for error messages.
        self._stderr_thread = threading.Thread(target=self._drain_stderr, daemon=True,
                                               name="sandbox-stderr")
        self._stderr_thread.start()
        self.write(header)

    def _drain_stderr(self) -> None:
        fd = self._proc.stderr.fileno()
        try:
            while chunk := os.read(fd, 65536):
                self._stderr_tail += chunk
                if len(self._stderr_tail) > 16384:
                    del self._stderr_tail[:-8192]
        except OSError:
            pass

    @property
    def stderr_tail(self) -> str:
        return bytes(self._stderr_tail[-4000:]).decode(errors="replace")

    @property
    def alive(self) -> bool:
        return not self._closed and self._proc.poll() is None

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._stdin, view)
            view = view[n:]

    def read_line(self, max_bytes: int, timeout_s: float | None) -> bytes | None:
        """The next line (without its newline); None when none came within timeout_s; b"" is
        never returned for a line: EOFError when the program ended; ValueError when the line
        grows past max_bytes (the bytes are not kept)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            nl = self._pending.find(b"\n")
            if nl >= 0:
                if nl > max_bytes:
                    raise ValueError(f"a line of more than {max_bytes} bytes")
                line = bytes(self._pending[:nl])
                del self._pending[: nl + 1]
                return line
            if len(self._pending) > max_bytes:
                raise ValueError(f"a line of more than {max_bytes} bytes")
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return None
            import select

            ready, _, _ = select.select([self._stdout], [], [], wait)
            if not ready:
                return None
            chunk = os.read(self._stdout, 65536)
            if not chunk:
                raise EOFError("the sandboxed program ended" + (
                    f"; its stderr: {self.stderr_tail[-500:]}" if self._stderr_tail else ""))
            self._pending += chunk

    def kill(self) -> None:
        """End the program and its sandbox now, and free what it held."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _kill_launcher(self._proc)
        for s in (self._proc.stdin, self._proc.stdout):
            try:
                s.close()
            except OSError:
                pass
        self._proc.wait()
        self._stderr_thread.join(timeout=1.0)
        try:
            self._proc.stderr.close()
        except OSError:
            pass
        for fd in (self._status_r, self._report_r):
            os.close(fd)
        if self._cgroup is not None:
            _remove_cgroup(self._cgroup)

    close = kill

    def __del__(self) -> None:
        try:
            self.kill()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
