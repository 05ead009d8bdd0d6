"""Running untrusted programs (model-written code) with limits and isolation from Linux itself:
namespaces, a private root file system, rlimits and seccomp. docs/sandbox.md says what it protects
against and what it does not.

    sb = Sandbox(SandboxLimits(timeout_s=2))
    r = sb.run([sb.python, "-c", "print(input()[::-1])"], stdin=b"abc\\n")
    r.status, r.stdout            # ("ok", b"cba\\n")
    sb.map(jobs)                  # many runs in parallel on a worker pool

The isolation is built by launcher.py, a short-lived trusted process started for every run; the
untrusted program never shares a process with reinforge.
"""

from __future__ import annotations

import logging
import marshal
import math
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

logger = logging.getLogger(__name__)

__all__ = [
    "ExecResult",
    "ISOLATION_LEVELS",
    "Job",
    "Sandbox",
    "SandboxLimits",
    "SandboxUnavailable",
    "default_workers",
]

ISOLATION_LEVELS = ("full", "best_effort")
Isolation = Literal["full", "best_effort"]

_LAUNCHER = Path(__file__).with_name("launcher.py")
_LIBSECCOMP = "libseccomp.so.2"
# The host paths a Python interpreter needs; top-level ones that are symlinks (merged /usr) are
# recreated as symlinks, real directories are bound read-only.
_SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache",)  # the dynamic loader's index of /usr's libraries
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
# The parent's own backstop in case a launcher itself hangs; the launcher enforces the limit.
_BACKSTOP_S = 15.0
_DRAIN_S = 2.0  # after a kill, how long the streams may take to close


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be built on this machine; the message says why and how to
    fix it or opt into weaker isolation."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. A run that exceeds one is stopped and reported with the limit's name.

    timeout_s:        wall-clock seconds from exec to exit; the whole process tree is killed after.
    cpu_s:            CPU seconds per process (RLIMIT_CPU); None: ceil(timeout_s) + 1.
    memory_mb:        address space per process (RLIMIT_AS), in MiB.
    max_processes:    processes and threads the sandbox's user may have (RLIMIT_NPROC).
    max_output_bytes: bytes read from each of stdout, stderr and the result channel; beyond it
                      the run is killed ("output_limit").
    max_file_mb:      largest file the program may write (RLIMIT_FSIZE), in MiB.
    tmpfs_mb:         size of the private, memory-backed /tmp working directory, in MiB.
    max_open_files:   open file descriptors per process (RLIMIT_NOFILE).
    """

    timeout_s: float = 5.0
    cpu_s: float | None = None
    memory_mb: int = 512
    max_processes: int = 32
    max_output_bytes: int = 1 << 20
    max_file_mb: int = 16
    tmpfs_mb: int = 64
    max_open_files: int = 256

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "max_processes", "max_output_bytes", "max_file_mb",
                     "tmpfs_mb", "max_open_files"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be > 0, got {getattr(self, name)!r}")
        if self.cpu_s is not None and not self.cpu_s > 0:
            raise ValueError(f"sandbox limit cpu_s must be > 0 or None, got {self.cpu_s!r}")

    def rlimits(self) -> dict[str, int]:
        return {
            "cpu_s": int(self.cpu_s if self.cpu_s is not None else math.ceil(self.timeout_s) + 1),
            "as_bytes": int(self.memory_mb) << 20,
            "nproc": int(self.max_processes),
            "fsize_bytes": int(self.max_file_mb) << 20,
            "nofile": int(self.max_open_files),
            "tmpfs_bytes": int(self.tmpfs_mb) << 20,
        }


@dataclass
class Job:
    """One run: argv[0] must be visible inside the sandbox (Sandbox.python is). files are
    written into the working directory first (name -> text). With result_channel, the program
    gets fd 3 as a pipe to the caller (ExecResult.results). timeout_s and max_result_bytes
    override the sandbox's timeout and, for the result channel, its output limit."""

    argv: Sequence[str]
    files: dict[str, str] = field(default_factory=dict)
    stdin: bytes = b""
    result_channel: bool = False
    timeout_s: float | None = None
    max_result_bytes: int | None = None


@dataclass
class ExecResult:
    """What a run did. status: ok (exit 0) | runtime_error (other exit) | timeout | memory_limit
    | output_limit | killed (by a signal) | setup_error (the sandbox could not be built).
    reason: a short human-readable explanation for anything but ok."""

    status: str
    reason: str = ""
    exit_code: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    results: bytes = b""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    maxrss_kb: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def default_workers() -> int:
    """Worker threads of the pool: the CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def sandbox_python() -> str:
    """The base interpreter behind the running one (a venv's python is a link to it), so that the
    project's virtual environment need not be visible inside."""
    exe = getattr(sys, "_base_executable", None) or sys.executable
    return os.path.realpath(exe)


def _visible_paths(python: str, extra: Sequence[str], custom: bool = False
                   ) -> tuple[dict[str, str], list[str]]:
    symlinks: dict[str, str] = {}
    binds: list[str] = []
    for p in _SYSTEM_PATHS:
        if os.path.islink(p):
            symlinks[p] = os.readlink(p)
        elif os.path.isdir(p):
            binds.append(p)
    binds += [f for f in _SYSTEM_FILES if os.path.isfile(f)]
    # The interpreter's installation: bin/python -> its prefix (lib/pythonX.Y lives there).
    prefix = os.path.dirname(os.path.dirname(python))
    own = () if custom else (os.path.realpath(sys.base_prefix),)
    for p in (*own, prefix, *map(os.path.realpath, extra)):
        if p in ("/", "") or not os.path.exists(p):
            continue
        if not any(p == b or p.startswith(b.rstrip("/") + "/") for b in binds):
            binds.append(p)
    return symlinks, binds


_probe_lock = threading.Lock()
_probe_cache: dict[tuple, dict] = {}


class Sandbox:
    """Runs programs under `limits` with the given isolation.

    isolation="full" (default) requires user, mount, pid, network, IPC and UTS namespaces and a
    seccomp filter (libseccomp.so.2); without them it raises SandboxUnavailable instead of running.
    isolation="best_effort" uses what works and warns about what does not; without namespaces
    the program can read and write your files and signal your processes (docs/sandbox.md).
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
    ) -> None:
        if isolation not in ISOLATION_LEVELS:
            raise ValueError(f"isolation must be one of {', '.join(ISOLATION_LEVELS)}, got {isolation!r}")
        if sys.platform != "linux":
            raise SandboxUnavailable(
                f"the code sandbox needs Linux (namespaces, seccomp); this is {sys.platform}"
            )
        self.limits = limits
        self.isolation = isolation
        self.python = os.path.realpath(python) if python else sandbox_python()
        if not os.access(self.python, os.X_OK):
            raise ValueError(f"sandbox python {self.python!r} is not an executable file")
        self.workers = workers or default_workers()
        self._symlinks, self._binds = _visible_paths(self.python, extra_ro_paths, custom=bool(python))
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.mechanisms = self._probe()

    # -- availability --------------------------------------------------------------------------

    def _probe(self) -> dict:
        key = (self.python, tuple(self._binds), self.isolation)
        with _probe_lock:
            if key in _probe_cache:
                return _probe_cache[key]
            seccomp_error = _libseccomp_error()
            mech = {"namespaces": True, "seccomp": seccomp_error is None}
            ns_error = self._try(mech)
            if self.isolation == "full":
                if ns_error or seccomp_error:
                    raise SandboxUnavailable(_unavailable_message(ns_error, seccomp_error))
            else:
                if ns_error:
                    mech = {"namespaces": False, "seccomp": seccomp_error is None}
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
                        + " and ".join(missing) + ": " + "; ".join(e for e in (ns_error, seccomp_error) if e)
                        + ". Model-written code can then "
                        + ("read and write your files and signal your processes; " if ns_error else "")
                        + "only rlimits, a private working directory and timeouts hold it."
                    )
                    logger.warning(msg)
                    warnings.warn(msg, RuntimeWarning, stacklevel=3)
            _probe_cache[key] = mech
            return mech

    def _try(self, mech: dict) -> str | None:
        # A generous limit: a busy machine must not pass for a missing mechanism.
        r = self._run(Job([self.python, "-I", "-S", "-c", "pass"], timeout_s=max(self.limits.timeout_s, 30.0)), mech)
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

    def map(self, jobs: Sequence[Job]) -> list[ExecResult]:
        """Run jobs in parallel on the pool; results in the jobs' order."""
        if len(jobs) <= 1:
            return [self._run(j, self.mechanisms) for j in jobs]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="sandbox")
        return list(self._pool.map(lambda j: self._run(j, self.mechanisms), jobs))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _spec(self, job: Job, mech: dict) -> bytes:
        spec = {
            "mechanisms": mech,
            "argv": list(job.argv),
            "files": job.files,
            "symlinks": self._symlinks,
            "ro_binds": self._binds,
            "limits": self.limits.rlimits(),
            "wall_s": job.timeout_s or self.limits.timeout_s,
            "env": _ENV,
            "libseccomp": _LIBSECCOMP,
        }
        data = marshal.dumps(spec)
        return str(len(data)).encode() + b"\n" + data

    def _run(self, job: Job, mech: dict) -> ExecResult:
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        result_r = result_w = None
        if job.result_channel:
            result_r, result_w = os.pipe2(os.O_CLOEXEC)
        pass_fds = (status_w,) if result_w is None else (status_w, result_w)
        cmd = [sys.executable, "-I", "-S", "-B", str(_LAUNCHER), str(status_w),
               str(result_w) if result_w is not None else "-"]
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                pass_fds=pass_fds, env={"PATH": _ENV["PATH"]}, start_new_session=True, bufsize=0,
            )
        finally:
            os.close(status_w)
            if result_w is not None:
                os.close(result_w)
        streams = {"stdout": proc.stdout.fileno(), "stderr": proc.stderr.fileno(), "status": status_r}
        if result_r is not None:
            streams["results"] = result_r
        timeout = job.timeout_s or self.limits.timeout_s
        deadline = start + timeout + _BACKSTOP_S
        caps = {"stdout": self.limits.max_output_bytes, "stderr": self.limits.max_output_bytes,
                "results": job.max_result_bytes or self.limits.max_output_bytes, "status": 1 << 20}
        try:
            out, overflow, backstop = _communicate(
                proc, self._spec(job, mech) + job.stdin, streams, caps, deadline
            )
        finally:
            for s in (proc.stdin, proc.stdout, proc.stderr):
                if s is not None and not s.closed:
                    s.close()
            os.close(status_r)
            if result_r is not None:
                os.close(result_r)
        proc.wait()
        return _result(out, overflow, backstop, self.limits, timeout, caps, time.monotonic() - start)


def _communicate(proc, stdin: bytes, streams: dict[str, int], caps: dict[str, int], deadline: float):
    """Feed stdin and read every stream to EOF, keeping at most caps[name] bytes of each; kill the
    launcher (and with it the sandbox: parent-death signal) on overflow or past the deadline."""
    sel = selectors.DefaultSelector()
    bufs = {name: bytearray() for name in streams}
    names = {fd: name for name, fd in streams.items()}
    for fd in streams.values():
        sel.register(fd, selectors.EVENT_READ)
    stdin_fd = proc.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_WRITE)
    view, sent = memoryview(stdin), 0
    overflow = backstop = None
    killed = False
    open_reads = len(streams)
    while open_reads:
        timeout = deadline - time.monotonic()
        if timeout <= 0:
            if killed:  # what was left to drain after the kill did not end: stop reading
                break
            backstop = True
            _kill_launcher(proc)
            killed, deadline = True, time.monotonic() + _DRAIN_S
            continue
        for key, _ in sel.select(timeout):
            fd = key.fd
            if fd == stdin_fd:
                try:
                    sent += os.write(fd, view[sent : sent + 65536])
                except (BrokenPipeError, OSError):
                    sent = len(view)
                if sent >= len(view):
                    sel.unregister(fd)
                    proc.stdin.close()
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                sel.unregister(fd)
                open_reads -= 1
                continue
            name = names[fd]
            buf, cap = bufs[name], caps[name]
            if len(buf) + len(chunk) > cap:
                buf += chunk[: cap - len(buf)]
                if overflow is None:
                    overflow = names[fd]
                    _kill_launcher(proc)
                    killed, deadline = True, min(deadline, time.monotonic() + _DRAIN_S)
            else:
                buf += chunk
    sel.close()
    if not proc.stdin.closed:
        proc.stdin.close()
    return {k: bytes(v) for k, v in bufs.items()}, overflow, backstop


def _kill_launcher(proc) -> None:
    try:
        proc.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass


def _result(out: dict, overflow, backstop, limits: SandboxLimits, timeout: float, caps: dict,
            elapsed: float) -> ExecResult:
    try:
        st = marshal.loads(out["status"]) if out["status"] else {}
    except (EOFError, ValueError, TypeError):
        st = {}
    common = dict(stdout=out["stdout"], stderr=out["stderr"], results=out.get("results", b""),
                  wall_s=st.get("wall_s", elapsed), cpu_s=st.get("cpu_s", 0.0),
                  maxrss_kb=st.get("maxrss_kb", 0), exit_code=st.get("exit_code"))
    if overflow:
        return ExecResult("output_limit", f"output limit: more than {caps[overflow]} bytes on "
                          f"{overflow}", **common)
    if backstop:
        return ExecResult("timeout", f"timeout: the launcher did not finish within "
                          f"{timeout + _BACKSTOP_S:g} s", **common)
    if "setup_error" in st:
        return ExecResult("setup_error", f"sandbox setup failed: {st['setup_error']}", **common)
    if not st:
        return ExecResult("setup_error", "sandbox setup failed: the launcher reported no status; "
                          f"its stderr: {out['stderr'][-500:].decode(errors='replace')}", **common)
    code = st["exit_code"]
    if st.get("timed_out"):
        return ExecResult("timeout", f"timeout: still running after {timeout:g} s (wall clock)",
                          **common)
    if code == 0:
        return ExecResult("ok", **common)
    tail = out["stderr"][-4000:].decode(errors="replace")
    rl = limits.rlimits()
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and st.get("cpu_s", 0) >= rl["cpu_s"]):
        return ExecResult("timeout", f"timeout: CPU time limit of {rl['cpu_s']} s", **common)
    if "MemoryError" in tail or "Cannot allocate memory" in tail:
        return ExecResult("memory_limit", f"memory limit: {limits.memory_mb} MiB of address space",
                          **common)
    # Python ignores SIGXFSZ, so an oversized write fails with EFBIG instead of killing it.
    if code == -signal.SIGXFSZ or "File too large" in tail:
        return ExecResult("output_limit", f"file size limit: {limits.max_file_mb} MiB", **common)
    if "No space left on device" in tail:
        return ExecResult("output_limit", f"working directory full: {limits.tmpfs_mb} MiB", **common)
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return ExecResult("killed", f"killed by signal {name}", **common)
    last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
    return ExecResult("runtime_error", f"runtime error (exit code {code}): {last[:300]}", **common)


def _libseccomp_error() -> str | None:
    import ctypes

    try:
        ctypes.CDLL(_LIBSECCOMP)
        return None
    except OSError as err:
        return (f"{_LIBSECCOMP} cannot be loaded ({err}); install it (Debian/Ubuntu: libseccomp2, "
                "Fedora: libseccomp)")


def _unavailable_message(ns_error: str | None, seccomp_error: str | None) -> str:
    parts = ["the code sandbox cannot build full isolation on this machine:"]
    if ns_error:
        parts.append(
            f"  namespaces: {ns_error}. Unprivileged user namespaces may be disabled: on Debian "
            "`sysctl kernel.unprivileged_userns_clone=1`; on Ubuntu 23.10+ "
            "`sysctl kernel.apparmor_restrict_unprivileged_userns=0`; in a container, run it with "
            "user namespaces allowed (Docker: --security-opt seccomp=unconfined, or use Podman)."
        )
    if seccomp_error:
        parts.append(f"  seccomp: {seccomp_error}.")
    parts.append(
        "  To run anyway with weaker isolation (rlimits, timeouts, a private working directory; "
        "without namespaces the code can read and write your files), set the code verifier's "
        "option isolation: best_effort (Sandbox(isolation='best_effort')). See docs/sandbox.md."
    )
    return "\n".join(parts)
