"""The `code` verifier: take the program out of a completion, run it in the sandbox, score it.

mode "tests" (code tasks): the program is run against the problem's tests by a harness inside
the sandbox, which only reports what the program returned or printed for each test's input; the
expected outputs stay in this (trusted) process and are compared here, on plain JSON values.
So printing "passed", exiting early, patching the harness, overriding __eq__ or reading the
test files gains nothing: none of those can produce the right output for an input the program
has not solved, and the expected values are nowhere inside the sandbox.

mode "stdout_answer" (any task, e.g. reasoning-gym's): program-aided answering ("PAL: Program-aided
Language Models", Gao et al., 2022, arXiv:2211.10435); the program's standard output is the
answer, scored by the task's own scorer.
"""

from __future__ import annotations

import json
import marshal
import math
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from reinforge.sandbox import ExecResult, Job, Sandbox, SandboxLimits
from reinforge.rewards.verifiers import VerifierResult
from reinforge.tasks.base import Example, Task
from reinforge.tasks.code_task import CodeProblem

CODE_MODES = ("tests", "stdout_answer")
_PYTHON_LANGS = {"", "python", "py", "python3", "py3", "pycon", "ipython"}
# An opening fence starts a line; the closing one may end the code's last line ("x = 1```").
_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n(.*?)```", re.S | re.M)
_OPEN_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+.-]*)[^\n]*\n", re.M)
SOLUTION_FILE = "solution.py"


@lru_cache(maxsize=1)
def _harness_source() -> str:
    return (Path(__file__).parents[1] / "sandbox" / "harness.py").read_text(encoding="utf-8")


def extract_code(completion: str, entry_point: str | None = None) -> str | None:
    """The program in a completion, following chat models' markdown.

    - Fenced blocks (```python ... ```; unlabelled, py and python3 count as Python; blocks in
      other languages are used only when there is no Python block).
    - With entry_point: the last Python block that defines it (the one after it is often just
      an example call); otherwise the last Python block.
    - A final fence that never closes (the completion was cut off): the text after it.
    - No fence at all: the whole completion (if it is not code, running it fails).
    Returns None for an empty completion.
    """
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(completion)]
    last_end = 0
    for m in _FENCE.finditer(completion):
        last_end = m.end()
    tail = _OPEN_FENCE.search(completion, last_end)
    if tail is not None:  # an opener after the last complete block: truncated
        blocks.append((tail.group(1).lower(), completion[tail.end():]))
    if not blocks:
        return completion.strip() or None
    python = [b for lang, b in blocks if lang in _PYTHON_LANGS] or [b for _, b in blocks]
    if entry_point:
        defines = re.compile(rf"^\s*(async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.M)
        with_def = [b for b in python if defines.search(b)]
        if with_def:
            return with_def[-1]
    return python[-1]


def values_equal(got: Any, expected: Any, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Equality of JSON values: bools only equal bools, ints and floats compare as numbers (with a
    tolerance when either is a float), lists elementwise, dicts by keys and values."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        if isinstance(expected, float) or isinstance(got, float):
            if math.isnan(expected) or math.isnan(got):
                return math.isnan(expected) and math.isnan(got)
            return math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol)
        return got == expected
    if expected is None or isinstance(expected, str):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, list):
        return (isinstance(got, list) and len(got) == len(expected)
                and all(values_equal(g, e, rel_tol, abs_tol) for g, e in zip(got, expected)))
    if isinstance(expected, dict):
        return (isinstance(got, dict) and got.keys() == expected.keys()
                and all(values_equal(got[k], expected[k], rel_tol, abs_tol) for k in expected))
    return False


def _lines(text: str) -> list[str]:
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def stdout_matches(got: str, expected: str) -> bool:
    """Line by line, ignoring trailing whitespace on each line and trailing empty lines."""
    return _lines(got) == _lines(expected)


class CodeVerifier:
    """Runs the completion's code in a sandbox. Options (reward.verifiers[].options):

    mode:             "tests": run the problem's tests (task.source=code); "stdout_answer": the
                      program's stdout is the answer, scored by the task's scorer (any task).
    partial_credit:   score = fraction of tests passed (default: 1 only when all pass). Correct
                      always means all tests pass.
    timeout_s:        wall-clock limit of each test case (the whole run: (tests + 1) x timeout_s + 1 s).
    memory_mb:        address-space limit per process, MiB.
    max_processes:    processes and threads the program may have.
    max_output_bytes: output kept per test case; more is an "output limit" failure.
    isolation:        "full" (default; refuses to run if a mechanism is missing) or
                      "best_effort" (runs with what works and warns; see docs/sandbox.md).
    workers:          parallel sandboxes (default: the CPUs available).
    """

    name = "code"

    def __init__(
        self,
        task: Task | None = None,
        *,
        mode: str = "tests",
        partial_credit: bool = False,
        timeout_s: float = 2.0,
        memory_mb: int = 512,
        max_processes: int = 32,
        max_output_bytes: int = 1 << 20,
        isolation: str = "full",
        workers: int | None = None,
        threshold: float = 1.0,
    ) -> None:
        if mode not in CODE_MODES:
            raise ValueError(f"code verifier: unknown mode {mode!r}; accepted: {', '.join(CODE_MODES)}")
        if mode == "stdout_answer" and task is None:
            raise ValueError("code verifier: mode 'stdout_answer' scores the output with the task's "
                             "scorer and needs the task")
        self.task = task
        self.mode = mode
        self.partial_credit = bool(partial_credit)
        self.timeout_s = float(timeout_s)
        self.max_output_bytes = int(max_output_bytes)
        self.threshold = threshold
        self.sandbox = Sandbox(
            SandboxLimits(timeout_s=self.timeout_s, memory_mb=int(memory_mb),
                          max_processes=int(max_processes), max_output_bytes=self.max_output_bytes),
            isolation=isolation, workers=workers,
        )

    # -- one and many --------------------------------------------------------------------------

    def __call__(self, completion: str, example: Example) -> VerifierResult:
        out = self.score_batch([completion], [example])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def score_batch(self, completions: Sequence[str], examples: Sequence[Example]
                    ) -> list[VerifierResult | Exception]:
        """All completions at once on the sandbox's worker pool. Identical (code, problem) pairs
        run once. A failure to even set up a sample is returned as its Exception."""
        plans: list[Any] = []
        keys: dict[tuple[str, str], int] = {}
        jobs: list[Job] = []
        for completion, example in zip(completions, examples):
            try:
                plan = self._plan(completion, example)
            except Exception as err:  # noqa: BLE001 - this sample's error, not the batch's
                plans.append(err)
                continue
            if isinstance(plan, VerifierResult):
                plans.append(plan)
                continue
            code, job_spec, problem = plan
            key = (code, example.id)
            if key not in keys:
                keys[key] = len(jobs)
                jobs.append(self._job(code, job_spec, problem))
            plans.append((keys[key], problem, example))
        results = self.sandbox.map(jobs)
        out: list[VerifierResult | Exception] = []
        for plan in plans:
            if isinstance(plan, (VerifierResult, Exception)):
                out.append(plan)
                continue
            index, problem, example = plan
            try:
                out.append(self._verdict(results[index], problem, example))
            except Exception as err:  # noqa: BLE001
                out.append(err)
        return out

    # -- building runs -------------------------------------------------------------------------

    def _plan(self, completion: str, example: Example):
        if self.mode == "tests":
            problem = CodeProblem.from_metadata(example.metadata)
            code = extract_code(completion, problem.entry_point)
        else:
            problem = CodeProblem(id=example.id, mode="stdio", tests=({"stdin": ""},))
            code = extract_code(completion)
        if code is None:
            return VerifierResult(0.0, False, {"reason": "no code in the completion", "passed": 0,
                                               "total": len(problem.tests)})
        tests = [
            {"args": t.get("args", []), "kwargs": t.get("kwargs", {})} if problem.mode == "function"
            else {"stdin": t.get("stdin", "")}
            for t in problem.tests
        ]  # only the inputs: expected outputs never enter the sandbox
        spec = {"mode": problem.mode, "source": SOLUTION_FILE, "entry_point": problem.entry_point,
                "tests": tests, "timeout_s": self.timeout_s, "max_bytes": self.max_output_bytes}
        return code, spec, problem

    def _job(self, code: str, spec: dict, problem: CodeProblem) -> Job:
        n = len(problem.tests)
        return Job(
            argv=[self.sandbox.python, "-I", "-S", "-B", "-c", _harness_source()],
            files={SOLUTION_FILE: code},
            stdin=marshal.dumps(spec),
            result_channel=True,
            timeout_s=self.timeout_s * (n + 1) + 1.0,  # every case at its limit, plus loading
            max_result_bytes=(n + 1) * (6 * self.max_output_bytes + 4096),  # JSON-escaped
        )

    # -- judging -------------------------------------------------------------------------------

    def _verdict(self, run: ExecResult, problem: CodeProblem, example: Example) -> VerifierResult:
        if run.status == "setup_error":  # our failure, not the program's: an error, not a 0
            raise RuntimeError(run.reason)
        reports: dict[int, dict] = {}
        load_error = None
        for line in run.results.splitlines():
            try:
                rep = json.loads(line)
                i = rep["i"]
            except (ValueError, TypeError, KeyError, RecursionError):
                continue  # not a report: whatever wrote it gains nothing
            if not isinstance(i, int) or not isinstance(rep, dict):
                continue
            if i == -1 and load_error is None:
                load_error = str(rep.get("info", ""))[:300]
            reports.setdefault(i, rep)
        if self.mode == "stdout_answer":
            return self._answer_verdict(run, reports.get(0), load_error, example)
        verdicts = []
        for i, test in enumerate(problem.tests):
            rep = reports.get(i)
            if load_error is not None:
                verdicts.append(_classify_error(load_error, "the code failed to load"))
            elif rep is None:
                verdicts.append(f"not run: {run.reason or 'the program ended before this test'}")
            else:
                verdicts.append(self._judge(rep, test, problem.mode))
        passed = sum(v == "passed" for v in verdicts)
        n = len(verdicts)
        all_passed = passed == n
        score = passed / n if self.partial_credit else float(all_passed)
        failures = [f"test {i}: {v}" for i, v in enumerate(verdicts) if v != "passed"]
        reason = f"{passed}/{n} tests passed" + ("; " + "; ".join(failures[:3]) if failures else "")
        return VerifierResult(score, all_passed, {"passed": passed, "total": n, "reason": reason,
                                                  "tests": verdicts, "sandbox": run.status})

    def _judge(self, rep: dict, test: dict, mode: str) -> str:
        status = rep.get("status")
        if status == "ok":
            data = rep.get("data", "")
            if not isinstance(data, str):
                return "wrong answer (malformed report)"
            if mode == "function":
                try:
                    got = json.loads(data)
                except (ValueError, RecursionError):
                    return "wrong answer (the return value is not JSON)"
                return "passed" if values_equal(got, test["expected"]) else "wrong answer"
            return "passed" if stdout_matches(data, test["stdout"]) else "wrong answer"
        if status == "timeout":
            return f"timeout: more than {self.timeout_s:g} s"
        if status == "output_limit":
            return f"output limit: more than {self.max_output_bytes} bytes"
        if status == "crashed":
            return _signal_reason(rep.get("exit"))
        return _classify_error(str(rep.get("info", ""))[:300], f"exit code {rep.get('exit')}")

    def _answer_verdict(self, run: ExecResult, rep: dict | None, load_error: str | None,
                        example: Example) -> VerifierResult:
        if load_error is not None or rep is None or rep.get("status") != "ok":
            why = (_classify_error(load_error, "") if load_error else
                   self._judge(rep, {}, "stdio") if rep else f"not run: {run.reason}")
            return VerifierResult(0.0, False, {"reason": why, "sandbox": run.status})
        answer = str(rep.get("data", "")).strip()
        score = float(self.task.score(answer, example))
        return VerifierResult(score, score >= self.threshold,
                              {"extracted": answer[:500], "sandbox": run.status})


def _classify_error(info: str, fallback: str) -> str:
    if "MemoryError" in info:
        return "memory limit"
    if "File too large" in info:
        return "output limit: file size limit"
    if "No space left on device" in info:
        return "output limit: working directory full"
    if info.startswith("SystemExit"):
        return f"exited early ({info})"
    return f"runtime error: {info or fallback}"


def _signal_reason(code) -> str:
    import signal

    if isinstance(code, int) and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        if name == "SIGXCPU":
            return "timeout: CPU time limit"
        if name == "SIGXFSZ":
            return "output limit: file size limit"
        return f"crashed: killed by {name}"
    return "crashed"
