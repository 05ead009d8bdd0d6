"""The `code` verifier: take the program out of a completion, run it in the sandbox, score it.

mode "tests" (code tasks): the program runs once per test case, each time in a fresh process
given only that case's input; the sandbox's runner (another process) times it and collects what it
returned or printed, and the expected outputs stay in this (trusted) process, compared here on
plain JSON values parsed with a size bound. So printing "passed", exiting early, patching the
harness, overriding __eq__, reading the test files or working ahead on other cases gains nothing:
none of those can produce the right output for an input the program has not solved in time, and
the expected values are nowhere inside the sandbox.

mode "stdout_answer" (any task, e.g. reasoning-gym's): program-aided answering ("PAL: Program-aided
Language Models", Gao et al., 2022, arXiv:2211.10435); the program's standard output is the
answer, scored by the task's own scorer (a third-party scorer in the isolated scoring pool,
reinforge/rewards/isolated.py).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from reinforge.sandbox import Case, ExecResult, Job, Sandbox, SandboxLimits
from reinforge.rewards.extract import MAX_PARSE_CHARS
from reinforge.rewards.verifiers import BatchVerifier, VerifierResult, task_scorer
from reinforge.tasks.base import Example, Task
from reinforge.tasks.code_task import CodeProblem

CODE_MODES = ("tests", "stdout_answer")
_PYTHON_LANGS = {"", "python", "py", "python3", "py3", "pycon", "ipython"}
# An opening fence starts a line; the closing one may end the code's last line ("x = 1```").
# Possessive quantifiers (*+): the info string's parts can only end at the line's end, and letting
# [ \t]* / [\w+.-]* give characters back to [^\n]* made a fence line with no newline ("```aaa...")
# quadratic without ever matching anything else.
_FENCE = re.compile(r"^[ \t]*+```[ \t]*+([\w+.-]*+)[^\n]*+\n(.*?)```", re.S | re.M)
_OPEN_FENCE = re.compile(r"^[ \t]*+```[ \t]*+([\w+.-]*+)[^\n]*+\n", re.M)
SOLUTION_FILE = "solution.py"


def extract_code(completion: str, entry_point: str | None = None) -> str | None:
    """The program in a completion, following chat models' markdown.

    - Fenced blocks (```python ... ```; unlabelled, py and python3 count as Python; blocks in
      other languages are used only when there is no Python block).
    - With entry_point: the last Python block that defines it (the one after it is often just
      an example call); otherwise the last Python block.
    - A final fence that never closes (the completion was cut off): the text after it.
    - No fence at all: the whole completion (if it is not code, running it fails).
    Returns None for an empty completion. Only the first MAX_PARSE_CHARS characters are read (a
    block they cut is an unclosed one, as when generation stops).
    """
    completion = completion[:MAX_PARSE_CHARS]
    blocks, last_end = [], 0
    for m in _FENCE.finditer(completion):
        blocks.append((m.group(1).lower(), m.group(2)))
        last_end = m.end()
    tail = _OPEN_FENCE.search(completion, last_end)
    if tail is not None:  # an opener after the last complete block: truncated
        blocks.append((tail.group(1).lower(), completion[tail.end():]))
    if not blocks:
        return completion.strip() or None
    python = [b for lang, b in blocks if lang in _PYTHON_LANGS] or [b for _, b in blocks]
    if entry_point:
        # Indentation is [^\S\n]* (whitespace but newlines), not \s*: from every line start of a
        # run of blank lines \s* scanned the whole run again (16384 of them after a fence: 7 s). A
        # def after blank lines still matches, from its own line's start.
        defines = re.compile(rf"^[^\S\n]*+(async\s+)?def\s+{re.escape(entry_point)}\s*\(", re.M)
        with_def = [b for b in python if defines.search(b)]
        if with_def:
            return with_def[-1]
    return python[-1]


def values_equal(got: Any, expected: Any, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Equality of JSON values: bools only equal bools; an integer expected value is compared
    exactly (a float must equal it exactly); a float expected value with a tolerance; lists
    elementwise, dicts by keys and values. A number too large for a float is a wrong answer."""
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, (int, float)) and isinstance(got, (int, float)):
        if isinstance(expected, int):
            return got == expected  # exact, also for a float (int/float compare exactly)
        try:
            got = float(got)
        except OverflowError:
            return False
        if math.isnan(expected) or math.isnan(got):
            return math.isnan(expected) and math.isnan(got)
        return math.isclose(got, expected, rel_tol=rel_tol, abs_tol=abs_tol)
    if expected is None or isinstance(expected, str):
        return type(got) is type(expected) and got == expected
    if isinstance(expected, list):
        return (isinstance(got, list) and len(got) == len(expected)
                and all(values_equal(g, e, rel_tol, abs_tol) for g, e in zip(got, expected)))
    if isinstance(expected, dict):
        return (isinstance(got, dict) and got.keys() == expected.keys()
                and all(values_equal(got[k], expected[k], rel_tol, abs_tol) for k in expected))
    return False


def result_cap(expected: Any) -> int:
    """The most bytes a function's reported return value may take for a test: a JSON text far
    longer than the expected value's cannot equal it, so it is not even parsed (its objects
    would cost memory in this process long before the comparison fails)."""
    return 4096 + 8 * len(json.dumps(expected, ensure_ascii=False))


def _lines(text: str) -> list[str]:
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def stdout_matches(got: str, expected: str) -> bool:
    """Line by line, ignoring trailing whitespace on each line and trailing empty lines."""
    return _lines(got) == _lines(expected)


class CodeVerifier(BatchVerifier):
    """Runs the completion's code in a sandbox. Options (reward.verifiers[].options):

    mode:             "tests": run the problem's tests (task.source=code); "stdout_answer": the
                      program's stdout is the answer, scored by the task's scorer (any task).
    partial_credit:   score = fraction of tests passed (default: 1 only when all pass). Correct
                      always means all tests pass.
    timeout_s:        wall-clock limit of each test case, from the start of its process (the
                      program's start-up and imports count).
    memory_mb:        address-space limit per process, MiB.
    max_processes:    processes and threads the program may have.
    max_output_bytes: output kept per test case and stream; more is an "output limit" failure.
    total_memory_mb:  the whole run's memory (a memory cgroup, where the machine has one; see
                      docs/sandbox.md); default max_processes x memory_mb + tmpfs + runner.
    isolation:        "full" (default; refuses to run if a mechanism is missing) or
                      "best_effort" (runs with what works and warns; see docs/sandbox.md).
    workers:          parallel sandboxes (default: the CPUs available).
    scorer_timeout_s: stdout_answer mode with a third-party scorer (reasoning-gym): the most one
                      answer's scoring may take in the isolated scoring pool.
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
        total_memory_mb: int | None = None,
        isolation: str = "full",
        workers: int | None = None,
        scorer_timeout_s: float = 10.0,
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
                          max_processes=int(max_processes), max_output_bytes=self.max_output_bytes,
                          total_memory_mb=total_memory_mb),
            isolation=isolation, workers=workers,
        )
        # stdout_answer: the task's scorer, isolated when it is third-party code.
        self.scorer = (task_scorer(task, timeout_s=scorer_timeout_s, isolation=isolation)
                       if mode == "stdout_answer" else None)

    # -- a batch ------------------------------------------------------------------------------

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
            code, problem = plan
            key = (code, example.id)
            if key not in keys:
                keys[key] = len(jobs)
                jobs.append(self._job(code, problem))
            plans.append((keys[key], problem, example))
        results = self.sandbox.map(jobs)
        out: list[Any] = []
        for plan in plans:
            if isinstance(plan, (VerifierResult, Exception)):
                out.append(plan)
                continue
            index, problem, example = plan
            try:
                out.append(self._verdict(results[index], problem, example))
            except Exception as err:  # noqa: BLE001
                out.append(err)
        if self.mode == "stdout_answer":
            self._score_answers(out, examples)
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
        return code, problem

    def _job(self, code: str, problem: CodeProblem) -> Job:
        """One case per test, each a new process (a fork of the sandbox's runner running the
        harness) given only that test's input: expected outputs never enter the sandbox."""
        argv = [self.sandbox.python]  # unused: each case names the harness (Case.harness)
        if problem.mode == "function":
            cases = [Case(harness={"mode": "function", "entry_point": problem.entry_point,
                                   "args": list(t.get("args", [])), "kwargs": dict(t.get("kwargs", {}))},
                          timeout_s=self.timeout_s, result_channel=True, capture_stdout=False,
                          max_result_bytes=result_cap(t["expected"]))
                     for t in problem.tests]
        else:
            cases = [Case(stdin=str(t.get("stdin", "")).encode("utf-8"), timeout_s=self.timeout_s,
                          harness={"mode": "stdio"})
                     for t in problem.tests]
        return Job(argv, files={SOLUTION_FILE: code}, cases=cases, stderr_tail=8192)

    # -- judging -------------------------------------------------------------------------------

    def _verdict(self, run: ExecResult, problem: CodeProblem, example: Example) -> VerifierResult:
        runs = run.cases or [run]
        if any(r.status == "setup_error" for r in runs):  # our failure, not the program's
            raise RuntimeError(next(r.reason for r in runs if r.status == "setup_error"))
        verdicts = [self._judge(r, test, problem.mode) for r, test in zip(runs, problem.tests)]
        if self.mode == "stdout_answer":
            r = runs[0]
            if verdicts[0] != "ran":
                return VerifierResult(0.0, False, {"reason": verdicts[0], "sandbox": r.status})
            answer = r.stdout.decode("utf-8", "replace").strip()
            return VerifierResult(0.0, False, {"extracted": answer, "sandbox": r.status,
                                               "pending": True})
        passed = sum(v == "passed" for v in verdicts)
        n = len(verdicts)
        all_passed = passed == n
        score = passed / n if self.partial_credit else float(all_passed)
        failures = [f"test {i}: {v}" for i, v in enumerate(verdicts) if v != "passed"]
        reason = f"{passed}/{n} tests passed" + ("; " + "; ".join(failures[:3]) if failures else "")
        return VerifierResult(score, all_passed, {"passed": passed, "total": n, "reason": reason,
                                                  "tests": verdicts,
                                                  "sandbox": _worst(r.status for r in runs)})

    def _judge(self, r: ExecResult, test: dict, mode: str) -> str:
        """One case's verdict: "passed" (or "ran" in stdout_answer mode), else why not."""
        if r.status == "not_run":
            return r.reason
        if r.status == "timeout":
            return "timeout: CPU time limit" if "CPU time" in r.reason else \
                f"timeout: more than {self.timeout_s:g} s"
        if r.status == "memory_limit":
            return "memory limit"
        if r.status == "killed":
            return _signal_reason(r.exit_code)
        if mode == "function":
            if r.status == "output_limit" and r.reason.endswith("on results"):
                return "wrong answer (the return value is far larger than the expected one)"
            tag, _, body = r.results.partition(b"\n")
            if tag == b"ok" and r.exit_code == 0:
                try:
                    got = json.loads(body)
                except (ValueError, RecursionError):
                    return "wrong answer (the return value is not JSON)"
                return "passed" if values_equal(got, test["expected"]) else "wrong answer"
            if r.status == "output_limit":
                return _limit_reason(r, self.max_output_bytes)
            if tag == b"error":
                return _classify_error(body.decode("utf-8", "replace")[:300], "")
            if r.exit_code == 0:
                return "exited early (no result reported)"
            return _classify_error(_last_line(r.stderr), f"exit code {r.exit_code}")
        if r.status == "output_limit":
            return _limit_reason(r, self.max_output_bytes)
        if r.status != "ok":
            return _classify_error(_last_line(r.stderr), f"exit code {r.exit_code}")
        if self.mode == "stdout_answer":
            return "ran"
        return "passed" if stdout_matches(r.stdout.decode("utf-8", "replace"), test["stdout"]) \
            else "wrong answer"

    def _score_answers(self, out: list, examples: Sequence[Example]) -> None:
        """stdout_answer: the programs' answers, scored by the task's scorer in one batch."""
        todo = [i for i, r in enumerate(out) if isinstance(r, VerifierResult) and r.details.get("pending")]
        if not todo:
            return
        answers = [out[i].details["extracted"] for i in todo]
        scores = self.scorer.score_batch(answers, [examples[i] for i in todo])
        for i, score in zip(todo, scores):
            details = dict(out[i].details)
            del details["pending"]
            details["extracted"] = details["extracted"][:500]
            if isinstance(score, BaseException):
                out[i] = score
                continue
            out[i] = VerifierResult(float(score), float(score) >= self.threshold, details)


def _worst(statuses) -> str:
    statuses = list(statuses)
    return next((s for s in statuses if s != "ok"), "ok")


def _last_line(stderr: bytes) -> str:
    tail = stderr[-4000:].decode("utf-8", "replace")
    return next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")[:300]


def _limit_reason(r: ExecResult, max_output_bytes: int) -> str:
    if "file size" in r.reason:
        return "output limit: file size limit"
    if "working directory full" in r.reason:
        return "output limit: working directory full"
    return f"output limit: more than {max_output_bytes} bytes"

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
