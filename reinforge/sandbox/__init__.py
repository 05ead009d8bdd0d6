"""Running untrusted programs (model-written code) with limits and isolation from Linux itself:
namespaces, a private root file system, rlimits, seccomp and, where the machine allows, a memory
cgroup. docs/sandbox.md says what it protects against and what it does not.

    sb = Sandbox(SandboxLimits(timeout_s=2))
    r = sb.run([sb.python, "-c", "print(input()[::-1])"], stdin=b"abc\\n")
    r.status, r.stdout            # ("ok", b"cba\\n")
    sb.map(jobs)                  # many runs in parallel on a worker pool
    sb.run_job(Job(argv, cases=[Case(stdin=b"1"), Case(stdin=b"2")]))   # one program per case
    proc = sb.start(Job(argv))    # a long-lived program to talk to over its stdin and stdout

The isolation is built by launcher.py, a short-lived trusted process started for every run; the
untrusted program never shares a process with reinforge.
"""

from __future__ import annotations

import itertools
import logging
import marshal
import math
import os
import secrets
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
    "Case",
    "ExecResult",
    "ISOLATION_LEVELS",
    "Job",
    "Sandbox",
    "SandboxLimits",
    "SandboxProcess",
    "SandboxUnavailable",
    "default_workers",
    "memory_cgroup",
]

ISOLATION_LEVELS = ("full", "best_effort")
Isolation = Literal["full", "best_effort"]
CGROUP_MODES = ("auto", "required", "off")

_LAUNCHER = Path(__file__).with_name("launcher.py")
_LIBSECCOMP = "libseccomp.so.2"
# The host paths a Python interpreter needs; top-level ones that are symlinks (merged /usr) are
# recreated as symlinks, real directories are bound read-only.
_SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
_SYSTEM_FILES = ("/etc/ld.so.cache",)  # the dynamic loader's index of /usr's libraries
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
# The parent's own backstop in case a launcher itself hangs; the launcher enforces the limit.
_BACKSTOP_S = 15.0
_DRAIN_S = 0.5  # once the launcher has reported, how long the other streams may take to close
_STATUS_CAP = 1 << 16
RUNNER_MB = 64  # the trusted runner's own share of a run's memory (an interpreter, case buffers)
_FRAME_OVERHEAD = 4096  # a case report's fields besides its output


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be built on this machine; the message says why and how to
    fix it or opt into weaker isolation."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one run. A run that exceeds one is stopped and reported with the limit's name.

    timeout_s:        wall-clock seconds of one case, from its fork to its exit (start-up and
                      imports count); its whole process tree is killed after. math.inf: none
                      (a long-lived program, Sandbox.start).
    cpu_s:            CPU seconds per process (RLIMIT_CPU); None: ceil(timeout_s) + 1 (no limit
                      when timeout_s is infinite).
    memory_mb:        address space per process (RLIMIT_AS), in MiB.
    max_processes:    processes and threads the sandbox's user may have (RLIMIT_NPROC).
    max_output_bytes: bytes read from each of stdout, stderr and the result channel of a case;
                      beyond it the case is killed ("output_limit").
    max_file_mb:      largest file the program may write (RLIMIT_FSIZE), in MiB.
    tmpfs_mb:         size of the private, memory-backed /tmp working directory, in MiB.
    max_files:        files and directories /tmp may hold (its inodes: each costs kernel memory).
    max_open_files:   open file descriptors per process (RLIMIT_NOFILE).
    total_memory_mb:  the whole run's memory, kernel memory included, enforced by a memory cgroup
                      where the machine offers one (docs/sandbox.md). None: the bound the other
                      limits already imply, max_processes x memory_mb + tmpfs_mb + RUNNER_MB.
    """

    timeout_s: float = 5.0
    cpu_s: float | None = None
    memory_mb: int = 512
    max_processes: int = 32
    max_output_bytes: int = 1 << 20
    max_file_mb: int = 16
    tmpfs_mb: int = 64
    max_files: int = 4096
    max_open_files: int = 256
    total_memory_mb: int | None = None

    def __post_init__(self) -> None:
        for name in ("timeout_s", "memory_mb", "max_processes", "max_output_bytes", "max_file_mb",
                     "tmpfs_mb", "max_files", "max_open_files"):
            if not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be > 0, got {getattr(self, name)!r}")
        for name in ("cpu_s", "total_memory_mb"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                raise ValueError(f"sandbox limit {name} must be > 0 or None, got {getattr(self, name)!r}")

    def rlimits(self) -> dict[str, int | None]:
        if self.cpu_s is not None:
            cpu = int(math.ceil(self.cpu_s))
        else:
            cpu = None if math.isinf(self.timeout_s) else int(math.ceil(self.timeout_s)) + 1
        return {
            "cpu_s": cpu,
            "as_bytes": int(self.memory_mb) << 20,
            "nproc": int(self.max_processes),
            "fsize_bytes": int(self.max_file_mb) << 20,
            "nofile": int(self.max_open_files),
            "tmpfs_bytes": int(self.tmpfs_mb) << 20,
            "max_files": int(self.max_files),
        }

    @property
    def memory_bound_mb(self) -> int:
        """The most memory a run may hold: total_memory_mb, or what the other limits imply."""
        if self.total_memory_mb is not None:
            return int(self.total_memory_mb)
        return self.max_processes * self.memory_mb + self.tmpfs_mb + RUNNER_MB


@dataclass
class Case:
    """One execution of a job's program (a test case): a fresh process, started in a /tmp that
    holds only the job's files again (nothing one case wrote is seen by the next), with its
    own stdin, wall-clock limit and output caps. argv None: the job's argv.

    capture_stdout False sends stdout to /dev/null. result_channel gives the program fd 3 as a
    pipe to the caller (ExecResult.results), read up to max_result_bytes (None: the sandbox's
    max_output_bytes). harness: instead of executing argv, run sandbox/harness.py with this job
    ({"mode": "function" | "stdio", ...}) in a fork of the runner's own interpreter (a new
    process like any other case, without an interpreter start-up; the code verifier's way)."""

    stdin: bytes = b""
    argv: Sequence[str] | None = None
    timeout_s: float | None = None
    result_channel: bool = False
    max_result_bytes: int | None = None
    capture_stdout: bool = True
    harness: dict | None = None


@dataclass
class Job:
    """One run: argv[0] must be visible inside the sandbox (Sandbox.python is). files are
    written into the working directory first (name -> text). Without cases the job is one case
    made of its own stdin, result_channel, timeout_s and max_result_bytes (which override the
    sandbox's timeout and, for the result channel, its output limit). stderr_tail: keep only the
    last this many bytes of each case's stderr (the cap on what it may write stays
    max_output_bytes)."""

    argv: Sequence[str]
    files: dict[str, str] = field(default_factory=dict)
    stdin: bytes = b""
    result_channel: bool = False
    timeout_s: float | None = None
    max_result_bytes: int | None = None
    cases: Sequence[Case] | None = None
    stderr_tail: int | None = None

    def case_list(self) -> list[Case]:
        if self.cases is not None:
            return list(self.cases)
        return [Case(stdin=self.stdin, timeout_s=self.timeout_s, result_channel=self.result_channel,
                     max_result_bytes=self.max_result_bytes)]


@dataclass
class ExecResult:
    """What a run (or one case of it) did. status: ok (exit 0) | runtime_error (other exit) |
    timeout | memory_limit | output_limit | killed (by a signal) | not_run (the run stopped
    before this case) | setup_error (the sandbox could not be built). reason: a short
    human-readable explanation for anything but ok. A run of several cases reports each in
    `cases`; its own fields are then those of its first case, and memory_peak_kb is the whole
    run's peak (from its memory cgroup; 0 without one)."""

    status: str
    reason: str = ""
    exit_code: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    results: bytes = b""
    wall_s: float = 0.0
    cpu_s: float = 0.0
    maxrss_kb: int = 0
    memory_peak_kb: int = 0
    cases: list["ExecResult"] = field(default_factory=list)

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


_HOST_TMP = "/.host-tmp"  # launcher.HOST_TMP


def inside_path(path: str) -> str:
    """Where a host path bound into the sandbox appears inside it: the same path, except under
    /tmp, which is the sandbox's own tmpfs there (those are shown under /.host-tmp)."""
    path = os.path.realpath(path)
    return _HOST_TMP + path if path == "/tmp" or path.startswith("/tmp/") else path


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
        argv, stdin, harness = list(case.argv or job.argv), bytes(case.stdin), case.harness
        # The runner's interpreter can run the harness only where the program would see that
        # same interpreter: with namespaces (its installation is bound) and no other python=.
        if harness is not None and not (mech["namespaces"] and self.python == self._launcher_python):
            argv = [self.python, "-I", "-S", "-B", "-c", _harness_text(), harness["mode"]]
            if harness["mode"] == "function":
                stdin = marshal.dumps({k: v for k, v in harness.items() if k != "mode"})
            harness = None
        caps = {"stderr": self.limits.max_output_bytes}
        if case.capture_stdout:
            caps["stdout"] = self.limits.max_output_bytes
        if case.result_channel:
            caps["results"] = case.max_result_bytes or self.limits.max_output_bytes
        timeout = case.timeout_s or self.limits.timeout_s
        return {"argv": argv, "stdin": stdin, "caps": caps,
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
            "cases": cases,
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
                stderr=subprocess.PIPE, pass_fds=(status_w, report_w), env={"PATH": _ENV["PATH"]},
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


def _frame_cap(case: dict) -> int:
    caps = case["caps"]
    stderr = caps["stderr"] if case["stderr_keep"] is None else min(caps["stderr"], case["stderr_keep"])
    return _FRAME_OVERHEAD + stderr + caps.get("stdout", 0) + caps.get("results", 0) + 32


def _remove_cgroup(path: str) -> None:
    """The launcher removes the run's cgroup; if it was killed first, this does."""
    if os.path.isdir(path):
        for _ in range(50):
            try:
                os.rmdir(path)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.01)


def _communicate(proc, stdin: bytes, streams: dict[str, int], caps: dict[str, int], deadline: float):
    """Feed stdin and read every stream to EOF, keeping at most caps[name] bytes of each; kill the
    launcher (and with it the sandbox: parent-death signal) on overflow or past the deadline.
    Once the launcher has written its status and closed it, the other streams get _DRAIN_S to
    end: nothing waits on a descriptor something else might be holding open."""
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
            if killed:  # what was left to drain after the kill or the report did not end: stop
                break
            backstop = "status" in names.values()  # the launcher itself never reported
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
            name = names[fd]
            if not chunk:
                sel.unregister(fd)
                del names[fd]
                open_reads -= 1
                if name == "status":  # the launcher is done: the rest must end promptly
                    deadline = min(deadline, time.monotonic() + _DRAIN_S)
                continue
            buf, cap = bufs[name], caps[name]
            if len(buf) + len(chunk) > cap:
                buf += chunk[: cap - len(buf)]
                if overflow is None:
                    overflow = name
                    _kill_launcher(proc)
                    killed, deadline = True, min(deadline, time.monotonic() + _DRAIN_S)
            else:
                buf += chunk
    sel.close()
    if not proc.stdin.closed:
        proc.stdin.close()
    if not killed and proc.poll() is None:
        _kill_launcher(proc)
    return {k: bytes(v) for k, v in bufs.items()}, overflow, backstop


def _kill_launcher(proc) -> None:
    try:
        proc.send_signal(signal.SIGKILL)
    except ProcessLookupError:
        pass


def _parse_reports(data: bytes, cases: list[dict]) -> dict[int, dict]:
    """The runner's frames (a decimal length, a newline, marshal data), each checked against
    the most its case may send before it is decoded."""
    out: dict[int, dict] = {}
    pos = 0
    while pos < len(data) and len(out) < len(cases):
        nl = data.find(b"\n", pos, pos + 24)
        if nl < 0:
            break
        try:
            n = int(data[pos:nl])
        except ValueError:
            break
        body = data[nl + 1 : nl + 1 + n]
        if n < 0 or len(body) < n or n > _frame_cap(cases[len(out)]):
            break
        try:
            frame = marshal.loads(body)
        except (EOFError, ValueError, TypeError):
            break
        if not isinstance(frame, dict) or frame.get("i") != len(out):
            break
        out[frame["i"]] = frame
        pos = nl + 1 + n
    return out


def _results(out: dict, overflow, backstop, limits: SandboxLimits, cases: list[dict],
             elapsed: float) -> ExecResult:
    try:
        st = marshal.loads(out["status"]) if out["status"] else {}
    except (EOFError, ValueError, TypeError):
        st = {}
    if not isinstance(st, dict):
        st = {}
    peak_kb = int(st.get("memory_peak_bytes", 0)) >> 10
    launcher_err = out["stderr"][-500:].decode(errors="replace")
    run_error = None
    if overflow:
        run_error = ("output_limit", f"output limit: the runner's {overflow} stream went past "
                     f"{_frame_cap(cases[0]) if overflow == 'report' else _STATUS_CAP} bytes")
    elif backstop:
        run_error = ("timeout", f"timeout: the launcher did not finish within "
                     f"{sum(c['timeout_s'] for c in cases) + 1 + _BACKSTOP_S:g} s")
    elif "setup_error" in st:
        run_error = ("setup_error", f"sandbox setup failed: {st['setup_error']}")
    elif not st:
        run_error = ("setup_error", "sandbox setup failed: the launcher reported no status; "
                     f"its stderr: {launcher_err}")
    elif st.get("timed_out"):
        run_error = ("timeout", f"timeout: the run went past its limit of "
                     f"{sum(c['timeout_s'] for c in cases) + 1:g} s")
    reports = _parse_reports(out["report"], cases)
    results = []
    for i, case in enumerate(cases):
        rep = reports.get(i)
        if rep is not None:
            results.append(_case_result(rep, limits, case))
            continue
        if run_error is None:
            run_error = ("setup_error", "the sandbox's runner ended without reporting "
                         f"(exit {st.get('runner_exit')}); launcher stderr: {launcher_err}")
        status, reason = run_error
        if i > len(reports):  # after the case the run stopped in: never started
            status, reason = "not_run", f"not run: {reason}"
        results.append(ExecResult(status, reason, wall_s=elapsed if i == 0 else 0.0))
    first = results[0]
    return ExecResult(first.status, first.reason, first.exit_code, first.stdout, first.stderr,
                      first.results, first.wall_s, first.cpu_s, first.maxrss_kb, peak_kb,
                      results if len(cases) > 1 else [])


def _case_result(rep: dict, limits: SandboxLimits, case: dict) -> ExecResult:
    common = dict(stdout=bytes(rep.get("stdout", b"")), stderr=bytes(rep.get("stderr", b"")),
                  results=bytes(rep.get("results", b"")), wall_s=float(rep.get("wall_s", 0.0)),
                  cpu_s=float(rep.get("cpu_s", 0.0)), maxrss_kb=int(rep.get("maxrss_kb", 0)),
                  exit_code=rep.get("exit_code"))
    status = rep.get("status")
    if status == "setup_error":
        return ExecResult("setup_error", f"sandbox setup failed: {rep.get('reason', '')}", **common)
    if status == "output_limit":
        name = rep.get("overflow") or "output"
        return ExecResult("output_limit", f"output limit: more than {case['caps'].get(name, 0)} "
                          f"bytes on {name}", **common)
    if status == "timeout":
        return ExecResult("timeout", f"timeout: still running after {case['timeout_s']:g} s "
                          "(wall clock)", **common)
    code = common["exit_code"]
    if rep.get("oom"):  # the OOM killer took some process of the case: whichever it was, the
        # case ran out of its run's memory
        return ExecResult("memory_limit", f"memory limit: the run's {limits.memory_bound_mb} MiB "
                          "(memory cgroup)", **common)
    if code == 0:
        return ExecResult("ok", **common)
    tail = common["stderr"][-4000:].decode(errors="replace")
    rl = limits.rlimits()
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and rl["cpu_s"] is not None
                                   and common["cpu_s"] >= rl["cpu_s"]):
        return ExecResult("timeout", f"timeout: CPU time limit of {rl['cpu_s']} s", **common)
    if "MemoryError" in tail or "Cannot allocate memory" in tail:
        return ExecResult("memory_limit", f"memory limit: {limits.memory_mb} MiB of address space",
                          **common)
    # Python ignores SIGXFSZ, so an oversized write fails with EFBIG instead of killing it.
    if code == -signal.SIGXFSZ or "File too large" in tail:
        return ExecResult("output_limit", f"file size limit: {limits.max_file_mb} MiB", **common)
    if "No space left on device" in tail:
        return ExecResult("output_limit", f"working directory full: {limits.tmpfs_mb} MiB or "
                          f"{limits.max_files} files", **common)
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return ExecResult("killed", f"killed by signal {name}", **common)
    last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
    return ExecResult("runtime_error", f"runtime error (exit code {code}): {last[:300]}", **common)


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


# -- mechanisms --------------------------------------------------------------------------------


_cgroup_cache: dict[str, tuple[dict | None, str]] = {}


def memory_cgroup(mode: str = "auto") -> tuple[dict | None, str]:
    """Where this process can create the runs' memory cgroups: ({"parent", "version"}, "") or
    (None, why not). Probed once per mode."""
    if mode not in _cgroup_cache:
        _cgroup_cache[mode] = _find_cgroup(mode)
    return _cgroup_cache[mode]


def _find_cgroup(mode: str) -> tuple[dict | None, str]:
    if mode == "off":
        return None, "cgroup=off"
    if os.path.isabs(mode):
        candidates = [mode]
    else:
        candidates = _cgroup_candidates()
        if not candidates:
            return None, "no cgroup memory controller is mounted for this process"
    errors = []
    for parent in candidates:
        version = 2 if os.path.exists(os.path.join(parent, "cgroup.controllers")) else 1
        if version == 2:
            try:
                enabled = Path(parent, "cgroup.subtree_control").read_text().split()
            except OSError as err:
                errors.append(f"{parent}: {err.strerror}")
                continue
            if "memory" not in enabled:
                errors.append(f"{parent}: the memory controller is not enabled for its children "
                              "(cgroup.subtree_control)")
                continue
        probe = os.path.join(parent, f"reinforge-probe-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.mkdir(probe)
        except OSError as err:
            errors.append(f"{parent}: cannot create a cgroup there ({err.strerror})")
            continue
        try:
            name = "memory.max" if version == 2 else "memory.limit_in_bytes"
            Path(probe, name).write_text(str(64 << 20))
            return {"parent": parent, "version": version}, ""
        except OSError as err:
            errors.append(f"{parent}: cannot set a memory limit ({err.strerror})")
        finally:
            try:
                os.rmdir(probe)
            except OSError:
                pass
    return None, "; ".join(errors)


def _cgroup_candidates() -> list[str]:
    try:
        own = Path("/proc/self/cgroup").read_text().splitlines()
        mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    v1_mount = v2_mount = None
    for line in mounts:
        pre, _, post = line.partition(" - ")
        parts, rest = pre.split(), post.split()
        if len(parts) < 5 or len(rest) < 3:
            continue
        if rest[0] == "cgroup2" and v2_mount is None:
            v2_mount = parts[4]
        elif rest[0] == "cgroup" and "memory" in rest[2].split(",") and v1_mount is None:
            v1_mount = parts[4]
    out = []
    for line in own:
        hid, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hid != "0" and "memory" in controllers.split(",") and v1_mount:
            out.append(os.path.join(v1_mount, path.lstrip("/")))
        elif hid == "0" and controllers == "" and v2_mount:
            out.append(os.path.join(v2_mount, path.lstrip("/")))
    return [p.rstrip("/") or "/" for p in out if os.path.isdir(p)]


def _libseccomp_error() -> str | None:
    import ctypes

    try:
        ctypes.CDLL(_LIBSECCOMP)
        return None
    except OSError as err:
        return (f"{_LIBSECCOMP} cannot be loaded ({err}); install it (Debian/Ubuntu: libseccomp2, "
                "Fedora: libseccomp)")


def _cgroup_message(error: str, asked: str) -> str:
    return (
        f"the code sandbox has no memory cgroup to enforce {asked}: {error or 'none found'}. A "
        "memory cgroup needs a cgroup directory this process may create children in: as root, "
        "cgroup v1's memory hierarchy or the v2 root; otherwise a delegated one, e.g. start the "
        "trainer with `systemd-run --user --scope -p Delegate=yes bash`, create a child cgroup "
        "for the trainer and one for the sandboxes with the memory controller enabled, and pass "
        "the latter as cgroup=<path> (or $REINFORGE_SANDBOX_CGROUP). Without a cgroup, leave "
        "total_memory_mb unset: rlimits and seccomp still bound a run to "
        "max_processes x memory_mb + tmpfs_mb (docs/sandbox.md)."
    )


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
        "without namespaces the code can read and write your files), set the verifier's option "
        "isolation: best_effort (reward.verifiers[].options.isolation, for the code verifier and "
        "for the task verifier's scoring workers; Sandbox(isolation='best_effort')). See "
        "docs/sandbox.md."
    )
    return "\n".join(parts)
