"""Strategies that choose which prompts are trained on from their pass rates: online difficulty
filtering (after rollout) and GRESO (before rollout)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..algorithms import informative_groups
from .base import Curriculum, group_outcomes

# GRESO never skips a prompt with certainty: the chance to roll it out again is floored (the
# authors' code uses 0.01), so a prompt that became learnable is eventually seen.
GRESO_MIN_KEEP = 0.01


def _int_keys(d: dict[str, Any]) -> dict[int, Any]:
    return {int(k): v for k, v in d.items()}


def _sample_skipping(cur: Curriculum, k: int, skip) -> list[int]:
    """``k`` prompts from ``cur``'s epoch sampler, passing over those ``skip(i)`` rejects, with at
    most one epoch of skips per call (``skip`` is not asked after that), so a step always gets its
    prompts even when nearly every prompt would be skipped. Counts go to the step's metrics."""
    out: list[int] = []
    skipped = 0
    while len(out) < k:
        i = cur.sampler.next(1)[0]
        if skipped < cur.sampler.n and skip(i):
            skipped += 1
            continue
        out.append(i)
    cur._step["prompts"] += len(out)
    cur._step["skipped"] += skipped
    return out


class DifficultyFilter(Curriculum):
    """Online difficulty filtering ("Online Difficulty Filtering for Reasoning Oriented
    Reinforcement Learning", Bae et al., 2025, arXiv:2504.03380; PRIME's online prompt filter,
    Cui et al., 2025, arXiv:2502.01456): a group is trained on only when its pass rate
    ``successes / samples`` lies in ``[lo, hi]``; more prompts are drawn, up to ``max_rounds``
    rounds, until the step has its groups. Prompts of intermediate difficulty maximise the
    variance of the success probability, which lower-bounds the expected improvement.

    With ``skip_known``, a prompt whose last observed pass rate fell outside the band is skipped
    before rollout (Kimi k1.5's offline pass-rate filter, arXiv:2501.12599, applied online); it
    stays skipped, so use it on a large prompt set."""

    def __init__(self, num_examples: int, seed: int, *, band: tuple[float, float], max_rounds: int,
                 skip_known: bool = False, **kw):
        super().__init__(num_examples, seed, **kw)
        self.lo, self.hi = band
        self.max_rounds = max_rounds
        self.skip_known = skip_known
        self.last_pass: dict[int, float] = {}   # prompt -> pass rate at its latest rollout

    def _in_band(self, rate: float) -> bool:
        return self.lo <= rate <= self.hi

    def sample(self, k: int) -> list[int]:
        if not self.skip_known:
            return super().sample(k)
        return _sample_skipping(self, k, lambda i: self.last_pass.get(i) is not None
                                and not self._in_band(self.last_pass[i]))

    def keep(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        rates = [c / m for c, m, _ in group_outcomes(rewards, group_index, self.success_threshold)]
        return torch.tensor([self._in_band(r) for r in rates], dtype=torch.bool)

    def observe(self, indices: list[int], rewards: torch.Tensor, group_index: torch.Tensor) -> None:
        for i, (c, m, _) in zip(indices, self._record(rewards, group_index)):
            self.last_pass[i] = c / m

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state(), "last_pass": {str(k): v for k, v in self.last_pass.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load(state["sampler"])
        self.last_pass = _int_keys(state["last_pass"])


class Greso(Curriculum):
    """GRESO ("Act Only When It Pays: Efficient Reinforcement Learning for LLM Reasoning via
    Selective Rollouts", Zheng et al., 2025, arXiv:2506.02177): a prompt whose groups were
    zero-variance in its latest visits tends to stay so, so it is skipped before rollout.

    Per prompt the history keeps the kind (all correct: easy; all wrong: hard) and the number z
    of its latest consecutive visits that were zero-variance of that kind. Drawn from the epoch
    order, such a prompt is rolled out with probability ``max(p_kind ** z, 0.01)`` and skipped
    otherwise. After each step (from the second epoch on, when skipping could have acted) the
    exploration probabilities move towards a target zero-variance share ``alpha``:
    ``p_easy -= step`` if the step's share of all-correct groups reached ``alpha / 3``, else
    ``p_easy += step`` (and ``p_hard`` with ``2 alpha / 3``), clipped to ``[p_min, p_max]``.
    As in the paper, GRESO runs on top of dynamic sampling: zero-variance groups that were still
    rolled out are dropped, and rounds repeat up to ``max_rounds``."""

    def __init__(self, num_examples: int, seed: int, *, max_rounds: int, target_zero_variance: float,
                 p_init: float, p_step: float, p_range: tuple[float, float], **kw):
        super().__init__(num_examples, seed, **kw)
        self.max_rounds = max_rounds
        self.target = {"easy": target_zero_variance / 3, "hard": 2 * target_zero_variance / 3}
        self.p = {"easy": p_init, "hard": p_init}
        self.p_step, (self.p_min, self.p_max) = p_step, p_range
        self.streak: dict[int, tuple[str, int]] = {}
        # Its own seeded stream, so skipping does not shift the sampling of completions.
        self.rng = np.random.default_rng([seed, 0x6E350])
        self._kinds = {"easy": 0, "hard": 0}

    def keep_probability(self, i: int) -> float:
        st = self.streak.get(i)
        if st is None:
            return 1.0
        kind, z = st
        return max(self.p[kind] ** z, GRESO_MIN_KEEP)

    def sample(self, k: int) -> list[int]:
        def skip(i: int) -> bool:
            prob = self.keep_probability(i)
            return prob < 1.0 and self.rng.random() >= prob

        return _sample_skipping(self, k, skip)

    def keep(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        return informative_groups(rewards, group_index)

    def observe(self, indices: list[int], rewards: torch.Tensor, group_index: torch.Tensor) -> None:
        for i, (c, m, zero_var) in zip(indices, self._record(rewards, group_index)):
            if not zero_var:
                self.streak.pop(i, None)
                continue
            kind = "easy" if c == m else "hard"
            self._kinds[kind] += 1
            prev = self.streak.get(i)
            self.streak[i] = (kind, prev[1] + 1 if prev and prev[0] == kind else 1)

    def finish_step(self) -> dict[str, float]:
        groups = self._step["groups"]
        shares = {kind: (n / groups if groups else 0.0) for kind, n in self._kinds.items()}
        if self.sampler.epoch > 0 and groups:
            for kind, share in shares.items():
                # More zero-variance groups than the target: explore less (skip more), and back.
                delta = -self.p_step if share >= self.target[kind] else self.p_step
                self.p[kind] = min(max(self.p[kind] + delta, self.p_min), self.p_max)
        metrics = super().finish_step()
        metrics.update({"curriculum/easy_frac": shares["easy"], "curriculum/hard_frac": shares["hard"],
                        "curriculum/p_easy": self.p["easy"], "curriculum/p_hard": self.p["hard"]})
        self._kinds = {"easy": 0, "hard": 0}
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state(), "p": dict(self.p), "rng": self.rng.bit_generator.state,
                "streak": {str(i): list(v) for i, v in self.streak.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load(state["sampler"])
        self.p = dict(state["p"])
        self.rng.bit_generator.state = state["rng"]
        self.streak = {i: (v[0], int(v[1])) for i, v in _int_keys(state["streak"]).items()}
