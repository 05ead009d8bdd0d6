"""The sandbox's vocabulary: what a run is (Job, Case), what it may use (SandboxLimits), what it
did (ExecResult), and what the host shows inside it (the interpreter, the read-only paths).
Nothing here starts a process."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

ISOLATION_LEVELS = ("full", "best_effort")
Isolation = Literal["full", "best_effort"]
CGROUP_MODES = ("auto", "required", "off")

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
