"""Third-party scorers run outside the trainer: a pool of sandboxed worker processes.

reasoning-gym's scorers are untrusted code as far as model output goes: several evaluate the
answer (eval(), sympy's parse_expr), so an answer that is a Python expression would run in
whatever process scores it. Here every such call runs in a worker (scorer_worker.py) inside the
sandbox (reinforge.sandbox: namespaces, a read-only view of the interpreter and its
site-packages, no network, seccomp, rlimits, a memory cgroup where available), where those
evaluators are replaced by ones that never run code. Each worker is started once with
reasoning-gym imported and answers one request at a time; this side bounds each answer's time
(the worker is killed and replaced when it is late, crashes or trips its tripwire, and that
sample gets a ScorerFailure: scored 0, counted as a reward error with its reason).

    scorer = IsolatedScorer(task)               # shares the process-wide pool of its settings
    scorer.score_batch(answers, examples)       # [float | Exception, ...]

math-verify runs in a pool of its own (IsolatedMath): sympy can spend hours in one integer
operation (9^(9^9)) that no deadline stops in a thread of this process (it holds the GIL, so
the whole process stalls); a worker process answers "timeout" at the limit, or is killed.

    IsolatedMath(timeout_s=5).score_batch(answers, references)  # [dict | Exception, ...]
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import pickle
import site
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from reinforge.sandbox import (Job, Sandbox, SandboxLimits, SandboxProcess, default_workers, inside_path,
                               memory_cgroup)
from reinforge.tasks.base import Example, Task

logger = logging.getLogger(__name__)

_WORKER = Path(__file__).with_name("scorer_worker.py")
# reasoning-gym 0.1.25's tasks whose scorer evaluates the answer text: eval() (the first four),
# sympy's parse_expr (the rest; parse_expr itself calls eval). Found by scanning every dataset's
# scorer on marked answers (tests/scan_evaluating_scorers.py, checked by the test suite).
EVALUATING_SCORERS = frozenset({
    "binary_matrix", "n_queens", "spiral_matrix", "string_insertion",
    "countdown", "intermediate_integration", "polynomial_multiplication", "puzzle24",
    "simple_integration",
})
_REPLY_CAP = 4096  # a reply is one short JSON line
_START_TIMEOUT_S = 180.0  # importing reasoning-gym on a busy machine; a bound, not a target


class ScorerFailure(RuntimeError):
    """A scoring call that gave no score: the scorer timed out, crashed, or the answer tripped
    the worker's tripwire. The sample scores 0 and the failure is counted as a reward error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


class ScorerError(RuntimeError):
    """The third-party scorer raised; the message is its exception's type and text."""


def needs_isolation(task: Task | None) -> bool:
    """Whether the task's scorer is third-party code that must not run in the trainer."""
    from reinforge.tasks.reasoning_gym_task import ReasoningGymTask

    return isinstance(task, ReasoningGymTask)


def _dataset_key(task: Task) -> tuple:
    """What the worker needs to build the same dataset object as the task's training stream
    (its config decides how answers are scored)."""
    from reinforge.tasks.reasoning_gym_task import _derive_seed

    return (task.name, tuple(sorted(task.options.items())), _derive_seed(task.seed, 0),
            task.train_size)


@lru_cache(maxsize=None)
def _package_paths(libraries: tuple[str, ...] = ("reasoning_gym",)) -> tuple[str, ...]:
    """The site-packages directories the libraries (reasoning-gym, math-verify) and their
    dependencies are imported from; the worker sees them read-only (never the project's source:
    .pth files are not processed)."""
    import importlib

    paths = []
    candidates = [*site.getsitepackages(), site.getusersitepackages(),
                  *(str(Path(importlib.import_module(lib).__file__).resolve().parents[1])
                    for lib in libraries)]
    for p in candidates:
        p = os.path.realpath(p)
        if os.path.isdir(p) and p not in paths and any(
                os.path.realpath(s) == p for s in sys.path if s):
            paths.append(p)
    return tuple(paths)


class _Worker:
    """One sandboxed worker process, started on first use and after every failure."""

    def __init__(self, pool: "ScorerPool") -> None:
        self.pool = pool
        self.proc: SandboxProcess | None = None
        self.lock = threading.Lock()

    def _start(self) -> None:
        sb = self.pool.sandbox
        libraries = self.pool.libraries
        argv = [sb.python, "-I", "-S", "-B", "-c", _WORKER.read_text(encoding="utf-8"),
                os.pathsep.join(inside_path(p) for p in _package_paths(libraries)), ",".join(libraries)]
        proc = sb.start(Job(argv, timeout_s=math.inf))
        try:
            line = proc.read_line(_REPLY_CAP, _START_TIMEOUT_S)
        except (EOFError, ValueError) as err:
            proc.kill()
            raise ScorerFailure("unavailable", f"the scoring worker did not start: {err}") from None
        if line is None:
            proc.kill()
            raise ScorerFailure("unavailable", f"the scoring worker did not start within "
                                f"{_START_TIMEOUT_S:g} s")
        reply = _parse_reply(line)
        if not reply.get("ready"):
            proc.kill()
            raise ScorerFailure("unavailable", "the scoring worker failed to start: "
                                f"{reply.get('fatal', reply)}")
        self.proc = proc

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc = None

    def call(self, request: tuple, timeout_s: float | None) -> float | dict | Exception:
        """The reply to one request: a score (a dict when the worker adds details: math's
        "unparsed"), or the failure. timeout_s: None waits for ever."""
        if self.proc is None or not self.proc.alive:
            self.kill()
            try:
                self._start()
            except ScorerFailure as err:
                return err
        data = pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self.proc.write(str(len(data)).encode() + b"\n" + data)
            line = self.proc.read_line(_REPLY_CAP, timeout_s)
        except (EOFError, OSError) as err:
            tail = self.proc.stderr_tail[-300:] if self.proc else ""
            self.kill()
            return self.pool.failed("crashed", f"the scorer's process ended ({err})"
                                    + (f"; stderr: {tail}" if tail and str(err).find(tail) < 0 else ""))
        except ValueError as err:
            self.kill()
            return self.pool.failed("bad_reply", f"the scorer's reply was too long ({err})")
        if line is None:
            self.kill()
            return self.pool.failed("timeout", f"no score within {timeout_s:g} s (the scoring "
                                    "worker was replaced)")
        reply = _parse_reply(line)
        if "score" in reply and isinstance(reply["score"], (int, float)):
            return float(reply["score"]) if len(reply) == 1 else {**reply, "score": float(reply["score"])}
        if "error" in reply:
            return ScorerError(str(reply["error"])[:500])
        if "timeout" in reply:  # the worker stopped the request itself and lives on
            return self.pool.failed("timeout", str(reply["timeout"])[:200])
        self.kill()
        if "blocked" in reply:
            return self.pool.failed("blocked", "the answer reached code execution in the scorer, "
                                    f"which was refused ({str(reply['blocked'])[:200]})")
        return self.pool.failed("bad_reply", f"unexpected reply {line[:200]!r}")


def _parse_reply(line: bytes) -> dict:
    try:
        reply = json.loads(line)
    except (ValueError, RecursionError):
        return {}
    return reply if isinstance(reply, dict) else {}


class ScorerPool:
    """A fixed number of sandboxed scoring workers, shared by every scorer with the same
    sandbox settings in this process (ScorerPool.shared)."""

    _shared: dict[tuple, "ScorerPool"] = {}
    _shared_lock = threading.Lock()

    def __init__(self, *, workers: int | None = None, memory_mb: int = 2048,
                 isolation: str = "full", libraries: tuple[str, ...] = ("reasoning_gym",)) -> None:
        # A worker is one process (a few threads); where a memory cgroup exists it bounds the
        # worker's whole footprint, kernel memory included.
        has_cgroup = memory_cgroup("auto")[0] is not None
        limits = SandboxLimits(timeout_s=math.inf, memory_mb=int(memory_mb), max_processes=16,
                               tmpfs_mb=16, max_files=1024,
                               total_memory_mb=int(memory_mb) + 256 if has_cgroup else None)
        self.libraries = tuple(libraries)
        self.sandbox = Sandbox(limits, isolation=isolation, extra_ro_paths=_package_paths(self.libraries))
        self.size = int(workers or min(default_workers(), 4))
        if self.size < 1:
            raise ValueError(f"scorer workers must be >= 1, got {workers!r}")
        self._workers = [_Worker(self) for _ in range(self.size)]
        self.failures: Counter[str] = Counter()
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, *, workers: int | None, memory_mb: int, isolation: str,
               libraries: tuple[str, ...] = ("reasoning_gym",)) -> "ScorerPool":
        key = (int(workers or min(default_workers(), 4)), int(memory_mb), isolation, tuple(libraries))
        with cls._shared_lock:
            pool = cls._shared.get(key)
            if pool is None:
                pool = cls._shared[key] = cls(workers=workers, memory_mb=memory_mb,
                                              isolation=isolation, libraries=libraries)
            return pool

    def ensure_started(self) -> None:
        """Start the first worker now, so that a worker that cannot start (a missing mechanism,
        a broken install) fails the reward's construction with its reason, not every sample."""
        w = self._workers[0]
        with w.lock:
            if w.proc is None or not w.proc.alive:
                w.kill()
                try:
                    w._start()
                except ScorerFailure as err:
                    raise RuntimeError(f"the isolated scoring pool cannot start: {err}") from None

    def failed(self, kind: str, message: str) -> ScorerFailure:
        with self._lock:
            self.failures[kind] += 1
        return ScorerFailure(kind, message)

    def run(self, requests: Sequence[tuple], timeout_s: float | None) -> list[float | dict | Exception]:
        """Every request on the pool, each worker taking the next one when it is free."""
        results: list[Any] = [None] * len(requests)
        todo = list(range(len(requests)))[::-1]
        todo_lock = threading.Lock()

        def drain(worker: _Worker) -> None:
            with worker.lock:
                while True:
                    with todo_lock:
                        if not todo:
                            return
                        i = todo.pop()
                    results[i] = worker.call(requests[i], timeout_s)

        busy = self._workers[: max(1, min(self.size, len(requests)))]
        threads = [threading.Thread(target=drain, args=(w,), daemon=True, name=f"scorer-{k}")
                   for k, w in enumerate(busy)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    def close(self) -> None:
        for w in self._workers:
            with w.lock:
                w.kill()


@atexit.register
def _close_shared_pools() -> None:
    for pool in list(ScorerPool._shared.values()):
        pool.close()


class IsolatedScorer:
    """A task's own scorer, run in the sandboxed pool.

    timeout_s: the most one answer's scoring may take; past it the worker is replaced and the
               sample gets a ScorerFailure.
    memory_mb: address space of a worker (it holds reasoning-gym and its datasets); its memory
               cgroup, where available, allows 256 MiB more.
    isolation: the sandbox's isolation ("full" or "best_effort"; docs/sandbox.md).
    workers:   processes in the pool (None: the CPUs available, at most 4).
    """

    def __init__(self, task: Task, *, timeout_s: float = 10.0, memory_mb: int = 2048,
                 isolation: str = "full", workers: int | None = None) -> None:
        if not needs_isolation(task):
            raise ValueError(f"task {task.name!r} has no third-party scorer to isolate")
        if not timeout_s > 0:
            raise ValueError(f"scorer timeout_s must be > 0, got {timeout_s!r}")
        self.task = task
        self.timeout_s = float(timeout_s)
        self.pool = ScorerPool.shared(workers=workers, memory_mb=memory_mb, isolation=isolation)
        self.pool.ensure_started()
        self._key = _dataset_key(task)

    def score_batch(self, answers: Sequence[str], examples: Sequence[Example]
                    ) -> list[float | Exception]:
        requests = [("score", self._key, a, e.metadata) for a, e in zip(answers, examples)]
        return self.pool.run(requests, self.timeout_s)

    def score(self, answer: str, example: Example) -> float:
        out = self.score_batch([answer], [example])[0]
        if isinstance(out, BaseException):
            raise out
        return out


_MATH_GRACE_S = 1.0  # a math worker still silent this long after its own limit is killed


class IsolatedMath:
    """math-verify's verdicts (scorer_worker.math_score), computed in a pool of its own.

    timeout_s: the most one answer may take (None or <= 0: no limit). The worker stops the
               request at the limit itself and lives on; one that is still silent
               _MATH_GRACE_S later is killed and replaced. Either way the sample gets a
               ScorerFailure of kind "timeout".
    memory_mb, isolation, workers: as IsolatedScorer's. isolation defaults to "best_effort":
               math-verify runs no model code (the worker's parse_expr never evaluates), the
               process is here to be stopped, so a machine without namespaces still scores.
    """

    def __init__(self, *, timeout_s: float | None = 5.0, float_rounding: int = 6,
                 strict: bool = True, memory_mb: int = 2048, isolation: str = "best_effort",
                 workers: int | None = None) -> None:
        self.timeout_s = float(timeout_s) if timeout_s is not None and timeout_s > 0 else None
        self.options = (int(float_rounding), bool(strict), self.timeout_s)
        self.pool = ScorerPool.shared(workers=workers, memory_mb=memory_mb, isolation=isolation,
                                      libraries=("math_verify",))
        self.pool.ensure_started()

    def score_batch(self, answers: Sequence[str], references: Sequence[str]
                    ) -> list[dict | Exception]:
        """One {"score": 1.0 | 0.0[, "unparsed": True]} or failure per answer, in parallel."""
        requests = [("math", self.options, a, r) for a, r in zip(answers, references)]
        limit = None if self.timeout_s is None else self.timeout_s + _MATH_GRACE_S
        return [{"score": r} if isinstance(r, float) else r for r in self.pool.run(requests, limit)]


__all__ = ["EVALUATING_SCORERS", "IsolatedMath", "IsolatedScorer", "ScorerError", "ScorerFailure",
           "ScorerPool", "needs_isolation"]
