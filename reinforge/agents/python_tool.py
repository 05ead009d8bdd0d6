"""The ``python`` tool: model-written code run in the sandbox (reinforge/sandbox), never in the
trainer's process, with the code verifier's limits (2 s, 512 MiB per process, 32 processes by
default; docs/sandbox.md). What the program printed is the tool's result."""

from __future__ import annotations

import functools

from reinforge.agents.tools import Tool

PROGRAM = "main.py"


@functools.lru_cache(maxsize=4)
def _sandbox(timeout_s: float, memory_mb: int, max_processes: int, isolation: str):
    from reinforge.sandbox import Sandbox, SandboxLimits

    return Sandbox(SandboxLimits(timeout_s=timeout_s, memory_mb=memory_mb, max_processes=max_processes,
                                 max_output_bytes=1 << 16), isolation=isolation)


def run_python(code: str, *, timeout_s: float = 2.0, memory_mb: int = 512, max_processes: int = 32,
               isolation: str = "full") -> str:
    """Run ``code`` in the sandbox; its stdout, or why it failed (with the end of its stderr)."""
    sb = _sandbox(float(timeout_s), int(memory_mb), int(max_processes), isolation)
    r = sb.run([sb.python, PROGRAM], files={PROGRAM: code})
    out = r.stdout.decode("utf-8", "replace")
    if r.ok:
        return out if out.strip() else "(the program printed nothing; print() the result)"
    err = r.stderr.decode("utf-8", "replace").strip().splitlines()
    tail = "\n".join(err[-5:])
    raise RuntimeError(f"{r.status}: {r.reason}" + (f"\n{tail}" if tail else "") + (f"\nstdout: {out}" if out else ""))


def make_python_tool(*, timeout_s: float = 2.0, memory_mb: int = 512, max_processes: int = 32,
                     isolation: str = "full") -> Tool:
    """A ``python`` Tool bound to these sandbox limits. Its own call limit is the sandbox's plus
    start-up slack: the sandbox stops the program; the tool's limit only guards the launcher."""

    def python(code: str) -> str:
        """Run a Python program in a sandbox and return what it printed.

        Args:
            code: a complete Python program; print() the values you need.
        """
        return run_python(code, timeout_s=timeout_s, memory_mb=memory_mb, max_processes=max_processes,
                          isolation=isolation)

    return Tool.from_function(python, timeout_s=timeout_s + 15.0)
