"""Verifiers: one completion and its example in, a score out. They know nothing of how the score
is used."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from reinforge.config.callables import load_callable as _load_callable
from reinforge.rewards._deadline import VerifierTimeout
from reinforge.rewards.extract import extract_answer, is_well_formed
from reinforge.tasks.base import Example, Task, normalize_answer


@dataclass
class VerifierResult:
    """score: the verifier's reward, usually in [0, 1]; a finite real number within
    reward.max_abs_score (bool counts as 1/0), or the sample is a reward error
    (rewards/score_check.py). correct: whether the answer is right
    (None for verifiers that do not judge correctness, e.g. format).

    token_rewards: optional dense rewards, one per token of the trajectory after the prompt
    (``Trajectory.token_ids``), for verifiers that judge parts of a completion (a process reward
    model's step scores sit on each step's last token). Only the model's own tokens keep theirs.
    A verifier sees the trajectory instead of the text when it sets ``takes_trajectory = True``.

    in_reward: False when the token rewards are the verifier's whole contribution and its score
    is only recorded (components, logs, the reward-hacking guard), e.g. a PRM whose credit-assigned
    step rewards already sum to its judgement."""

    score: float
    correct: bool | None = None
    details: dict = field(default_factory=dict)
    token_rewards: list[float] | None = None
    in_reward: bool = True


@runtime_checkable
class Verifier(Protocol):
    name: str

    def __call__(self, completion: str, example: Example) -> VerifierResult: ...


class _InProcessScorer:
    """A task scorer that is the project's own code (file tasks' normalised match): safe to run
    here, as plain calls."""

    def __init__(self, task: Task) -> None:
        self.task = task

    def score_batch(self, answers: Sequence[str], examples: Sequence[Example]
                    ) -> list[float | Exception]:
        out: list[float | Exception] = []
        for answer, example in zip(answers, examples):
            try:
                out.append(float(self.task.score(answer, example)))
            except Exception as err:  # noqa: BLE001 - this sample's error
                out.append(err)
        return out


def task_scorer(task: Task, *, timeout_s: float = 10.0, memory_mb: int = 2048,
                isolation: str = "full", workers: int | None = None):
    """How a task's own scorer runs: a third-party one (reasoning-gym's, which may evaluate the
    answer) in the isolated scoring pool (reinforge/rewards/isolated.py), never in this
    process; the project's own in-process."""
    from reinforge.rewards.isolated import IsolatedScorer, needs_isolation

    if needs_isolation(task):
        return IsolatedScorer(task, timeout_s=timeout_s, memory_mb=memory_mb, isolation=isolation,
                              workers=workers)
    return _InProcessScorer(task)


class BatchVerifier:
    """A verifier that scores whole batches (``score_batch``, which RewardFunction calls once per
    batch); scoring one completion is a batch of one."""

    def __call__(self, completion: str, example: Example) -> VerifierResult:
        out = self.score_batch([completion], [example])[0]
        if isinstance(out, BaseException):
            raise out
        return out

    def score_batch(self, completions: Sequence[str], examples: Sequence[Example]
                    ) -> list[VerifierResult | Exception]:
        raise NotImplementedError


class TaskVerifier(BatchVerifier):
    """The task's own scorer on the extracted answer. reasoning-gym scorers give partial credit
    (e.g. the right number inside extra words); only a score reaching `threshold` is correct.

    reasoning-gym's scorers run in sandboxed worker processes, never in the trainer (some
    evaluate the answer text; docs/sandbox.md). Options for them:
    timeout_s: the most one answer's scoring may take; past it the worker is replaced and the
               sample is a reward error (scored 0, counted).
    memory_mb: address space of a scoring worker, MiB.
    isolation: "full" (default) or "best_effort", as for the code sandbox (docs/sandbox.md).
    workers:   scoring processes (default: the CPUs available, at most 4).
    """

    name = "task"

    def __init__(self, task: Task, *, answer_format: str = "tags", threshold: float = 1.0,
                 timeout_s: float = 10.0, memory_mb: int = 2048, isolation: str = "full",
                 workers: int | None = None) -> None:
        self.task = task
        self.answer_format = answer_format
        self.threshold = threshold
        self.scorer = task_scorer(task, timeout_s=timeout_s, memory_mb=memory_mb,
                                  isolation=isolation, workers=workers)

    def score_batch(self, completions: Sequence[str], examples: Sequence[Example]
                    ) -> list[VerifierResult | Exception]:
        """Every completion's answer scored in one batch (in parallel on the scoring pool)."""
        answers = [extract_answer(c, self.answer_format) for c in completions]
        todo = [i for i, a in enumerate(answers) if a is not None]
        scores = self.scorer.score_batch([answers[i] for i in todo], [examples[i] for i in todo])
        out: list[VerifierResult | Exception] = [
            VerifierResult(0.0, False, {"extracted": None}) for _ in completions]
        for i, score in zip(todo, scores):
            if isinstance(score, BaseException):
                out[i] = score
            else:
                out[i] = VerifierResult(score, score >= self.threshold, {"extracted": answers[i]})
        return out


class MathVerifyVerifier(BatchVerifier):
    """Symbolic equivalence with math-verify ("1/2" == "0.5" == "\\frac{1}{2}").

    sympy can spend hours in one integer operation on a short answer (\\boxed{9^{9^{9}}}); no
    deadline stops that in a thread of this process, and it holds the GIL, stalling every thread.
    So every answer is scored in a pool of worker processes that stop it at the limit or are
    killed (isolated.IsolatedMath, docs/sandbox.md), a batch in parallel, from any thread.
    timeout_s: the most one answer's scoring may take (None or <= 0: no limit); past it the
               sample is a reward error (VerifierTimeout: scored 0, counted).
    memory_mb, isolation, workers: the pool's, as the task verifier's (isolation "best_effort"
               by default: math-verify runs no model code, the process is there to be stopped).
    """

    name = "math_verify"

    def __init__(
        self,
        *,
        answer_format: str = "tags",
        timeout_s: float | None = 5.0,
        float_rounding: int = 6,
        strict: bool = True,
        memory_mb: int = 2048,
        isolation: str = "best_effort",
        workers: int | None = None,
    ) -> None:
        from reinforge.rewards.isolated import IsolatedMath

        self.answer_format = answer_format
        self.timeout_s = timeout_s
        self.float_rounding = float_rounding
        self.strict = strict
        self.scorer = IsolatedMath(timeout_s=timeout_s, float_rounding=float_rounding,
                                   strict=strict, memory_mb=memory_mb, isolation=isolation,
                                   workers=workers)

    def score_batch(self, completions: Sequence[str], examples: Sequence[Example]
                    ) -> list[VerifierResult | Exception]:
        out: list[VerifierResult | Exception] = []
        todo: list[tuple[int, str]] = []  # (row, answer) to score in the pool
        for i, (completion, example) in enumerate(zip(completions, examples)):
            answer = extract_answer(completion, self.answer_format)
            if example.answer is None:
                out.append(ValueError(f"example {example.id} has no reference answer for math_verify"))
            elif answer is None:
                out.append(VerifierResult(0.0, False, {"extracted": None}))
            else:
                out.append(VerifierResult(0.0, False))  # replaced below
                todo.append((i, answer))
        if todo:
            replies = self.scorer.score_batch([a for _, a in todo], [examples[i].answer for i, _ in todo])
            for (i, answer), reply in zip(todo, replies):
                out[i] = self._result(answer, reply)
        return out

    @staticmethod
    def _result(answer: str, reply: dict | Exception) -> VerifierResult | Exception:
        if isinstance(reply, Exception):
            if getattr(reply, "kind", None) == "timeout":  # the pool's ScorerFailure
                return VerifierTimeout(str(reply).removeprefix("timeout: "))
            return reply
        details: dict[str, Any] = {"extracted": answer}
        if reply.get("unparsed"):
            details["unparsed"] = True
        ok = reply["score"] >= 1.0
        return VerifierResult(float(ok), ok, details)


class ExactMatchVerifier:
    """Equality after normalising whitespace, a final period and (unless case_sensitive) case."""

    name = "exact_match"

    def __init__(self, *, answer_format: str = "tags", case_sensitive: bool = False) -> None:
        self.answer_format = answer_format
        self.case_sensitive = case_sensitive

    def __call__(self, completion: str, example: Example) -> VerifierResult:
        if example.answer is None:
            raise ValueError(f"example {example.id} has no reference answer for exact_match")
        answer = extract_answer(completion, self.answer_format)
        if answer is None:
            return VerifierResult(0.0, False, {"extracted": None})
        cs = self.case_sensitive
        ok = normalize_answer(answer, case_sensitive=cs) == normalize_answer(
            example.answer, case_sensitive=cs
        )
        return VerifierResult(float(ok), ok, {"extracted": answer})


class FormatVerifier:
    """1 when the completion holds exactly one non-empty answer in the format. Shaping only: it
    never makes a sample correct."""

    name = "format"

    def __init__(self, *, answer_format: str = "tags") -> None:
        self.answer_format = answer_format

    def __call__(self, completion: str, example: Example) -> VerifierResult:
        return VerifierResult(float(is_well_formed(completion, self.answer_format)), None)


def load_callable(target: str, what: str = "reward function"):
    """``package.module:function`` or ``path/to/file.py:function`` (``Class.method`` qualnames
    too); a function this process gave the config as an object is that object. A file that cannot
    be loaded is one line naming it, its line and the fix (reinforge/config/callables.py)."""
    return _load_callable(target, what)


class PythonVerifier:
    """A user's own reward function, ``fn(completion, example) -> float | VerifierResult``, loaded
    from a module or file the user trusts (it runs in the trainer's process; model-written code
    never does). A float counts as correct when it reaches reward.correct_threshold; return a
    VerifierResult to give the verdict explicitly. What it returns is checked, not converted: a
    string such as "0.75", None or 1e39 is a reward error (RewardFunction, score_check.py)."""

    name = "python"

    def __init__(self, function: str) -> None:
        self.target = function
        self.fn = load_callable(function)

    def __call__(self, completion: str, example: Example) -> VerifierResult:
        out = self.fn(completion, example)
        if isinstance(out, VerifierResult):
            return out
        return VerifierResult(out)  # checked (not float()-converted) where it is scored
