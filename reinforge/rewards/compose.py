"""Weighted composition of verifiers into one reward per trajectory (and, where verifiers give
them, token rewards), then length shaping: the score phase of a training step."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from reinforge.batch import RolloutBatch, Trajectory
from reinforge.config.base import ConfigError
from reinforge.rewards._deadline import call_with_deadline
from reinforge.rewards.score_check import (
    DEFAULT_MAX_ABS_SCORE,
    FLOAT32_MAX,
    InvalidScore,
    checked_score,
    checked_token_rewards,
)
from reinforge.rewards.registry import VERIFIER_PLUGINS, build_plugin_verifier, verifier_plugin
from reinforge.rewards.shaping import LengthShaping
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
    verifier that raised (its score is then 0). token_rewards: sum of weight * token rewards of
    the verifiers that gave them (None when none did)."""

    reward: float
    correct: bool
    components: dict[str, float]
    errors: list[str] = field(default_factory=list)
    token_rewards: list[float] | None = None


@dataclass
class Scores:
    """A batch's scores, row by row (N rows, T tokens after the prompt, as in RolloutBatch).

    outcomes:       one RewardOutcome per row.
    rewards:        [N] float32, the verifiers' weighted sum before shaping (what accuracy and
                    DAPO's dynamic-sampling filter read).
    shaped:         [N] float32, ``rewards`` plus length shaping (what advantages are computed from).
    token_rewards:  [N, T] float32 or None, the verifiers' token rewards on the model's own
                    tokens (0 elsewhere); None when no verifier gave any.
    """

    outcomes: list[RewardOutcome]
    rewards: torch.Tensor
    shaped: torch.Tensor
    token_rewards: torch.Tensor | None = None

    @property
    def correct(self) -> torch.Tensor:
        return torch.tensor([float(o.correct) for o in self.outcomes])

    def select(self, rows: torch.Tensor, width: int) -> "Scores":
        """The given rows, token rewards trimmed to ``width`` (as RolloutBatch.select trims)."""
        picked = rows.tolist()
        return Scores(
            outcomes=[self.outcomes[i] for i in picked], rewards=self.rewards[rows], shaped=self.shaped[rows],
            token_rewards=None if self.token_rewards is None else self.token_rewards[rows, :width],
        )


def concat_scores(parts: list[Scores], width: int) -> Scores:
    """One Scores from several (the rounds of dynamic sampling), token rewards right-padded."""
    token = None
    if any(p.token_rewards is not None for p in parts):
        token = torch.cat([
            torch.nn.functional.pad(p.token_rewards, (0, width - p.token_rewards.shape[1]))
            if p.token_rewards is not None else torch.zeros(len(p.rewards), width)
            for p in parts
        ])
    return Scores(
        outcomes=[o for p in parts for o in p.outcomes], rewards=torch.cat([p.rewards for p in parts]),
        shaped=torch.cat([p.shaped for p in parts]), token_rewards=token,
    )


class RewardFunction:
    """Scores a batch; one verifier failing on one sample costs that component, not the batch.

    verifiers:         (verifier, weight) pairs. Components are keyed by verifier.name, with
                       "_2", "_3", ... added to repeated names.
    correctness_names: names of the verifiers whose judgement counts as correct
                       (default: task, math_verify, exact_match).
    correct_threshold: the score that counts as correct for a verifier that gives no verdict.
    timeout_s:         time limit of one verifier call (any thread); over it, the call is an error.
    shaping:           length shaping added to the reward in ``score`` (DAPO's soft overlong
                       punishment), or None.
    max_abs_score:     the largest |score| (and |token reward|) a verifier may return. A score that
                       is not a finite real number within it (a string, None, NaN, 1e39) is a
                       reward error like a raise: that component scores 0 and the error is counted
                       with its reason (rewards/score_check.py).

    A verifier with a ``score_batch(completions, examples)`` method (the code verifier, which runs
    a batch in parallel) is called once per batch instead; it returns one VerifierResult or
    Exception per sample and bounds its own time. A verifier with ``takes_trajectory = True`` is
    called with the row's ``Trajectory`` (tokens, action mask, segments) instead of its text (a
    batched one, such as a reward model, with the batch's trajectories). A result with
    ``in_reward=False`` is recorded in ``components`` but only its token rewards enter the reward.
    """

    def __init__(
        self,
        verifiers: Sequence[tuple[Verifier, float]],
        correctness_names: Collection[str] = CORRECTNESS_VERIFIERS,
        *,
        correct_threshold: float = 1.0,
        timeout_s: float | None = 30.0,
        shaping: LengthShaping | None = None,
        max_abs_score: float = DEFAULT_MAX_ABS_SCORE,
    ) -> None:
        if not verifiers:
            raise ValueError("a reward function needs at least one verifier")
        self.correctness_names = frozenset(correctness_names)
        self.correct_threshold = correct_threshold
        self.timeout_s = timeout_s
        self.shaping = shaping
        self.max_abs_score = float(max_abs_score)
        self.error_count = 0
        self._warned: set[tuple[str, str]] = set()
        self._entries: list[tuple[str, Verifier, float, bool]] = []
        seen: dict[str, int] = {}
        for verifier, weight in verifiers:
            base = verifier.name
            seen[base] = seen.get(base, 0) + 1
            key = base if seen[base] == 1 else f"{base}_{seen[base]}"
            self._entries.append((key, verifier, float(weight), base in self.correctness_names))

    def __call__(
        self, completions: Sequence[str], examples: Sequence[Example],
        trajectories: Sequence[Trajectory] | None = None,
    ) -> list[RewardOutcome]:
        """One RewardOutcome per completion text (and its trajectory, when given: verifiers that
        take trajectories need it)."""
        if len(completions) != len(examples):
            raise ValueError(f"{len(completions)} completions but {len(examples)} examples")
        batched: dict[str, list] = {}
        for key, verifier, _, _ in self._entries:
            if hasattr(verifier, "score_batch"):
                try:
                    # A batched trajectory verifier (a reward model on the learner's device) gets
                    # the rows' trajectories, one forward pass per batch.
                    if getattr(verifier, "takes_trajectory", False):
                        if trajectories is None:
                            raise ValueError("this verifier scores trajectories; score the batch with RewardFunction.score")
                        batched[key] = list(verifier.score_batch(trajectories, examples))
                    else:
                        batched[key] = list(verifier.score_batch(completions, examples))
                except Exception as err:  # noqa: BLE001 - every sample gets this error
                    batched[key] = [err] * len(completions)
        return [self._score_one(c, e, {k: v[i] for k, v in batched.items()},
                                trajectories[i] if trajectories is not None else None)
                for i, (c, e) in enumerate(zip(completions, examples))]

    @property
    def reward_model_keys(self) -> list[str]:
        """Component names of the reward-model verifiers (what the reward-hacking guard watches)."""
        return [key for key, verifier, _, _ in self._entries if getattr(verifier, "is_reward_model", False)]

    def learn(self, rollout: RolloutBatch, examples: Sequence[Example], outcomes: Sequence[RewardOutcome]) -> None:
        """Verifiers that learn online from outcome labels (PRIME's implicit PRM:
        ``learn_from_outcomes``) take one step on this scored batch. The trainer calls it in the
        update phase, after the batch was scored and never in a step that may be abandoned, so a
        checkpoint never holds a reward model that learned from a batch the policy did not."""
        learners = [v for _, v, _, _ in self._entries if hasattr(v, "learn_from_outcomes")]
        if not learners:
            return
        trajectories = [rollout.trajectory(i) for i in range(len(rollout))]
        correct = torch.tensor([float(o.correct) for o in outcomes])
        for verifier in learners:
            verifier.learn_from_outcomes(trajectories, examples, correct)

    def state_dict(self) -> dict[str, Any]:
        """The state of the verifiers that change during a run (PRIME's implicit PRM), by component
        key; empty when none does. A run's checkpoints keep it."""
        out = {}
        for key, verifier, _, _ in self._entries:
            state = verifier.state_dict() if hasattr(verifier, "state_dict") else None
            if state is not None:  # None: nothing changed since it was loaded from its path
                out[key] = state
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict()``'s output. A learning verifier with no saved state (a checkpoint
        from before it learned, or a new segment that added it) starts from its path; saved state
        of a verifier this reward no longer has is dropped. Both are logged."""
        stateful = {key: v for key, v, _, _ in self._entries if hasattr(v, "load_state_dict")}
        for key, verifier in stateful.items():
            if key in state:
                verifier.load_state_dict(state[key])
            elif getattr(verifier, "update", False):
                logger.info("reward component %r: no saved state in the checkpoint, it starts from its path", key)
        for key in sorted(set(state) - set(stateful)):
            logger.warning("the checkpoint holds the state of reward component %r, which this run's reward.verifiers "
                        "no longer has: dropped", key)

    def score(self, rollout: RolloutBatch, examples: Sequence[Example]) -> Scores:
        """Score every row of ``rollout`` (``examples``: one per row) and shape the rewards by the
        number of tokens the model wrote. Verifiers that learn online update in ``learn``."""
        trajectories = [rollout.trajectory(i) for i in range(len(rollout))]
        outcomes = self(rollout.texts, examples, trajectories)
        rewards = torch.tensor([o.reward for o in outcomes], dtype=torch.float32)
        shaped = rewards if self.shaping is None else rewards + self.shaping(rollout.action_lengths)
        token = None
        if any(o.token_rewards is not None for o in outcomes):
            token = torch.zeros(rollout.completion_ids.shape, dtype=torch.float32)
            for i, o in enumerate(outcomes):
                if o.token_rewards is not None:
                    token[i, : len(o.token_rewards)] = torch.tensor(o.token_rewards, dtype=torch.float32)
            token = token.masked_fill(~rollout.action_mask, 0.0)
        return Scores(outcomes=outcomes, rewards=rewards, shaped=shaped, token_rewards=token)

    def _score_one(
        self, completion: str, example: Example, batched: dict | None = None, trajectory: Trajectory | None = None
    ) -> RewardOutcome:
        reward, correct = 0.0, False
        components: dict[str, float] = {}
        errors: list[str] = []
        token: list[float] | None = None
        for key, verifier, weight, judges in self._entries:
            try:
                if batched and key in batched:
                    result = batched[key]
                    if isinstance(result, BaseException):
                        raise result
                elif getattr(verifier, "takes_trajectory", False):
                    if trajectory is None:
                        raise ValueError("this verifier scores trajectories; score the batch with RewardFunction.score")
                    result = call_with_deadline(lambda: verifier(trajectory, example), self.timeout_s)
                else:
                    result = call_with_deadline(lambda: verifier(completion, example), self.timeout_s)
                score = checked_score(result.score, self.max_abs_score)
                token_rewards = getattr(result, "token_rewards", None)
                if token_rewards is not None:
                    token_rewards = checked_token_rewards(token_rewards, self.max_abs_score)
                    n = len(trajectory) if trajectory is not None else None
                    if n is None or len(token_rewards) != n:
                        raise ValueError(f"{len(token_rewards)} token rewards for a trajectory of {n} tokens")
            except Exception as err:  # noqa: BLE001 - a verifier bug must not stop the batch
                errors.append(self._record_error(key, err, example))
                components[key] = 0.0
                continue
            components[key] = score
            if getattr(result, "in_reward", True):
                reward += weight * score
            if token_rewards is not None:
                token = [0.0] * len(token_rewards) if token is None else token
                token = [t + weight * x for t, x in zip(token, token_rewards)]
            if judges:
                verdict = result.correct
                correct = correct or bool(score >= self.correct_threshold if verdict is None else verdict)
        if abs(reward) > FLOAT32_MAX or (token is not None and any(abs(t) > FLOAT32_MAX for t in token)):
            # bounded scores times huge weights: the reward tensor (float32) would hold inf
            errors.append(self._record_error("reward", InvalidScore(
                f"the weighted sum {reward:g} overflows float32: lower reward.verifiers' weights or "
                "reward.max_abs_score"), example))
            reward, token, correct = 0.0, None, False
        return RewardOutcome(reward=reward, correct=correct, components=components, errors=errors, token_rewards=token)

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
    "math_verify": ("timeout_s", "float_rounding", "strict", "memory_mb", "isolation", "workers"),
    "exact_match": ("case_sensitive",),
    "format": (),
    "python": ("function",),
    "code": ("mode", "partial_credit", "timeout_s", "memory_mb", "max_processes", "max_output_bytes",
             "total_memory_mb", "isolation", "workers", "scorer_timeout_s"),
}


def _make_verifier(name: str, options: dict[str, Any], cfg: "RewardConfig", task: Task, i: int,
                   device=None, policy_tokenizer=None):
    if name not in _OPTIONS:
        plugin = verifier_plugin(name)  # registered by a plugin, or an installed package's entry point
        if plugin is not None:
            return build_plugin_verifier(plugin, options, task=task, answer_format=cfg.answer_format,
                                         where=f"reward.verifiers[{i}]")
        # a reward model (reinforge/rewards/models): loads on the learner's device
        from reinforge.rewards.models.verifiers import build_reward_model_verifier

        return build_reward_model_verifier(name, options, device=device or "cpu", policy_tokenizer=policy_tokenizer,
                                           where=f"reward.verifiers[{i}]")
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
        try:
            return PythonVerifier(options["function"])
        except ConfigError as err:  # one line: the file, its line and the fix
            raise ConfigError(f"reward.verifiers[{i}].options.function: {err}") from None
    if name == "code":
        from reinforge.rewards.code import CodeVerifier  # the sandbox probe runs only when asked

        try:
            return CodeVerifier(task, threshold=cfg.correct_threshold, **options)
        except (TypeError, ValueError) as err:
            raise ValueError(f"reward.verifiers[{i}].options (code verifier): {err}") from None
    return FormatVerifier(answer_format=fmt)


def build_reward(cfg: "RewardConfig", task: Task, *, max_new_tokens: int | None = None, device=None,
                 policy_tokenizer=None) -> RewardFunction:
    """The reward function a config describes; bad verifier options fail here, before the policy
    loads. With ``max_new_tokens`` (training), the configured length shaping is part of it.
    Reward-model verifiers load on ``device`` (the learner's) and place token rewards on the
    policy's tokens through ``policy_tokenizer`` (without it they give scores only)."""
    needed = getattr(task, "needs_verifier", None)  # e.g. code tasks: only running code scores them
    if needed and not any(spec.name == needed for spec in cfg.verifiers):
        raise ValueError(f"task {task.name} is scored by the {needed!r} verifier; set "
                         f"reward.verifiers=[{{name: {needed}}}]")
    verifiers = [
        (_make_verifier(spec.name, dict(spec.options), cfg, task, i, device, policy_tokenizer), spec.weight)
        for i, spec in enumerate(cfg.verifiers)
    ]
    correctness = CORRECTNESS_VERIFIERS | {n for n, p in VERIFIER_PLUGINS.items() if p.correctness}
    if not any(v.name in correctness for v, _ in verifiers):
        logger.warning(
            "reward.verifiers has no correctness verifier (task, math_verify or exact_match): "
            "accuracy will read 0"
        )
    shaping = LengthShaping.from_config(cfg, max_new_tokens) if max_new_tokens is not None else None
    return RewardFunction(verifiers, correctness, correct_threshold=cfg.correct_threshold, shaping=shaping,
                          max_abs_score=cfg.max_abs_score)
