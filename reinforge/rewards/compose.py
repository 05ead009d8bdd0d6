"""Weighted composition of verifiers into one reward per completion."""

from __future__ import annotations

import logging
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from reinforge.rewards._deadline import call_with_deadline
from reinforge.rewards.verifiers import (
    ExactMatchVerifier,
    FormatVerifier,
    MathVerifyVerifier,
    PythonVerifier,
    TaskVerifier,
    Verifier,
)
from reinforge.tasks.base import Example, Task

if TYPE_CHECKING:
    from reinforge.config import RewardConfig

logger = logging.getLogger(__name__)

# Verifiers that judge whether an answer is right; the others (format) only shape the reward.
CORRECTNESS_VERIFIERS = frozenset({"task", "math_verify", "exact_match", "python", "code"})


@dataclass
class RewardOutcome:
    """reward: sum of weight * score. correct: some correctness verifier judged it right.
    components: each verifier's unweighted score, by name. errors: "name: Type: message" for each
    verifier that raised (its score is then 0)."""

    reward: float
    correct: bool
    components: dict[str, float]
    errors: list[str] = field(default_factory=list)


class RewardFunction:
    """Scores a batch; one verifier failing on one sample costs that component, not the batch.

    verifiers:         (verifier, weight) pairs. Components are keyed by verifier.name, with
                       "_2", "_3", ... added to repeated names.
    correctness_names: names of the verifiers whose judgement counts as correct
                       (default: task, math_verify, exact_match).
    correct_threshold: the score that counts as correct for a verifier that gives no verdict.
    timeout_s:         time limit of one verifier call (any thread); over it, the call is an error.

    A verifier with a ``score_batch(completions, examples)`` method (the code verifier, which runs
    a batch in parallel) is called once per batch instead; it returns one VerifierResult or
    Exception per sample and bounds its own time.
    """

    def __init__(
        self,
        verifiers: Sequence[tuple[Verifier, float]],
        correctness_names: Collection[str] = CORRECTNESS_VERIFIERS,
        *,
        correct_threshold: float = 1.0,
        timeout_s: float | None = 30.0,
    ) -> None:
        if not verifiers:
            raise ValueError("a reward function needs at least one verifier")
        self.correctness_names = frozenset(correctness_names)
        self.correct_threshold = correct_threshold
        self.timeout_s = timeout_s
        self.error_count = 0
        self._warned: set[tuple[str, str]] = set()
        self._entries: list[tuple[str, Verifier, float, bool]] = []
        seen: dict[str, int] = {}
        for verifier, weight in verifiers:
            base = verifier.name
            seen[base] = seen.get(base, 0) + 1
            key = base if seen[base] == 1 else f"{base}_{seen[base]}"
            self._entries.append((key, verifier, float(weight), base in self.correctness_names))

    @property
    def component_names(self) -> list[str]:
        return [key for key, *_ in self._entries]

    def __call__(self, completions: Sequence[str], examples: Sequence[Example]) -> list[RewardOutcome]:
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions but {len(examples)} examples")
        batched: dict[str, list] = {}
        for key, verifier, _, _ in self._entries:
            if hasattr(verifier, "score_batch"):
                try:
                    batched[key] = list(verifier.score_batch(completions, examples))
                except Exception as err:  # noqa: BLE001 - every sample gets this error
                    batched[key] = [err] * len(completions)
        return [self._score_one(c, e, {k: v[i] for k, v in batched.items()})
                for i, (c, e) in enumerate(zip(completions, examples))]

    def _score_one(self, completion: str, example: Example, batched: dict | None = None) -> RewardOutcome:
        reward, correct = 0.0, False
        components: dict[str, float] = {}
        errors: list[str] = []
        for key, verifier, weight, judges in self._entries:
            try:
                if batched and key in batched:
                    result = batched[key]
                    if isinstance(result, BaseException):
                        raise result
                else:
                    result = call_with_deadline(lambda: verifier(completion, example), self.timeout_s)
                score = float(result.score)
                if not math.isfinite(score):
                    raise ValueError(f"non-finite score {score}")
            except Exception as err:  # noqa: BLE001 - a verifier bug must not stop the batch
                errors.append(self._record_error(key, err, example))
                components[key] = 0.0
                continue
            components[key] = score
            reward += weight * score
            if judges:
                verdict = result.correct
                correct = correct or bool(score >= self.correct_threshold if verdict is None else verdict)
        return RewardOutcome(reward=reward, correct=correct, components=components, errors=errors)

    def _record_error(self, key: str, err: Exception, example: Example) -> str:
        self.error_count += 1
        kind = type(err).__name__
        message = f"{key}: {kind}: {str(err)[:200]}"
        if (key, kind) not in self._warned:
            self._warned.add((key, kind))
            logger.warning(
                "verifier %s raised %s on %s (scored 0; later %s errors of %s are counted, not "
                "logged): %s", key, kind, example.id, kind, key, str(err)[:500],
            )
        return message


_OPTIONS: dict[str, tuple[str, ...]] = {
    "task": ("timeout_s", "memory_mb", "isolation", "workers"),
    "math_verify": ("timeout_s", "float_rounding", "strict"),
    "exact_match": ("case_sensitive",),
    "format": (),
    "python": ("function",),
    "code": ("mode", "partial_credit", "timeout_s", "memory_mb", "max_processes", "max_output_bytes",
             "total_memory_mb", "isolation", "workers", "scorer_timeout_s"),
}


def _make_verifier(name: str, options: dict[str, Any], cfg: "RewardConfig", task: Task, i: int):
    accepted = _OPTIONS[name]
    unknown = [k for k in options if k not in accepted]
    if unknown:
        raise ValueError(
            f"reward.verifiers[{i}].options: unknown option(s) {', '.join(map(repr, unknown))} for "
            f"verifier {name!r}; accepted: {', '.join(accepted) or '(none)'}"
        )
    fmt = cfg.answer_format
    if name == "task":  # a third-party scorer starts its sandboxed pool here
        try:
            return TaskVerifier(task, answer_format=fmt, threshold=cfg.correct_threshold, **options)
        except (TypeError, ValueError) as err:
            raise ValueError(f"reward.verifiers[{i}].options (task verifier): {err}") from None
    if name == "math_verify":
        return MathVerifyVerifier(answer_format=fmt, **options)
    if name == "exact_match":
        return ExactMatchVerifier(answer_format=fmt, **options)
    if name == "python":
        if "function" not in options:
            raise ValueError(f"reward.verifiers[{i}].options.function is required for the python "
                             "verifier, e.g. 'my_rewards:score' or 'rewards.py:score'")
        return PythonVerifier(options["function"])
    if name == "code":
        from reinforge.rewards.code import CodeVerifier  # the sandbox probe runs only when asked

        try:
            return CodeVerifier(task, threshold=cfg.correct_threshold, **options)
        except (TypeError, ValueError) as err:
            raise ValueError(f"reward.verifiers[{i}].options (code verifier): {err}") from None
    return FormatVerifier(answer_format=fmt)


def build_reward(cfg: "RewardConfig", task: Task) -> RewardFunction:
    """The reward function a config describes; bad verifier options fail here, before any model
    loads."""
    needed = getattr(task, "needs_verifier", None)  # e.g. code tasks: only running code scores them
    if needed and not any(spec.name == needed for spec in cfg.verifiers):
        raise ValueError(f"task {task.name} is scored by the {needed!r} verifier; set "
                         f"reward.verifiers=[{{name: {needed}}}]")
    verifiers = [
        (_make_verifier(spec.name, dict(spec.options), cfg, task, i), spec.weight)
        for i, spec in enumerate(cfg.verifiers)
    ]
    if not any(v.name in CORRECTNESS_VERIFIERS for v, _ in verifiers):
        logger.warning(
            "reward.verifiers has no correctness verifier (task, math_verify or exact_match): "
            "accuracy will read 0"
        )
    return RewardFunction(verifiers, CORRECTNESS_VERIFIERS, correct_threshold=cfg.correct_threshold)
