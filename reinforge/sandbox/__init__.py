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

Modules, each importing only those above it: limits.py (SandboxLimits, Job, Case, ExecResult,
the constants and the host paths shown inside), probe.py (memory cgroup and libseccomp probes,
the messages), wire.py (the launcher's pipes and reports), sandbox.py (Sandbox, SandboxProcess,
the bootstrap). launcher.py and harness.py run inside the sandbox and import none of them.
"""

from __future__ import annotations

import logging

from .limits import (CGROUP_MODES, ISOLATION_LEVELS, RUNNER_MB, Case, ExecResult, Isolation, Job,
                     SandboxLimits, SandboxUnavailable, default_workers, inside_path, sandbox_python)
from .probe import memory_cgroup
from .sandbox import _LAUNCHER, Sandbox, SandboxProcess, _harness_code, _harness_text, _launcher_code

logger = logging.getLogger(__name__)  # "reinforge.sandbox", the name every module here logs under

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
