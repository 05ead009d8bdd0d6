"""Reinforce-Ada: adaptive numbers of samples per prompt."""

from __future__ import annotations

from typing import Any

import torch

from ..config.curriculum import check_ada_budget
from .base import Curriculum


class ReinforceAda(Curriculum):
    """Reinforce-Ada ("Reinforce-Ada: An Adaptive Sampling Framework for Reinforce-Style LLM
    Training", Xiong et al., 2025, arXiv:2510.04996): instead of one group of n samples per
    prompt, a step's prompts are sampled in rounds of ``samples_per_round``; a prompt leaves the
    active set once it has at least n samples and its samples meet the target, or when
    ``max_rounds`` rounds were spent on it (successive elimination). Targets:
    ``positive`` at least one success (Reinforce-Ada-pos), ``both`` a success and a failure,
    ``balanced`` at least n/2 of each (Reinforce-Ada-balance).

    Each prompt's group is then n of its samples, balanced: ``s = min(#successes,
    max(n/2, n - #failures))`` successes and ``n - s`` failures, the earliest of each (samples of
    one outcome are i.i.d., so the earliest are as good as a random subset, and reproducible).
    The advantage estimator thus sees a fixed group size with both outcomes wherever the budget
    found them. (The paper also computes the baseline from all of a prompt's samples; here the
    estimator reads the formed group only.)"""

    adaptive_samples = True

    def __init__(self, num_examples: int, seed: int, *, group_size: int, samples_per_round: int, max_rounds: int,
                 target: str, **kw):
        super().__init__(num_examples, seed, **kw)
        check_ada_budget(group_size, samples_per_round, max_rounds)
        if target not in ("positive", "both", "balanced"):
            raise ValueError(f"curriculum.ada_target={target!r}: accepted: positive, both, balanced")
        self.n, self.samples_per_round, self.max_rounds, self.target = group_size, samples_per_round, max_rounds, target
        self._pools: list[list[float]] = []
        self._requested: list[int] = []
        self._active: list[int] = []
        self._formed = {"exhausted": 0, "pool_max": 0}

    def sample(self, k: int) -> list[int]:
        indices = super().sample(k)
        self._pools = [[] for _ in indices]
        self._requested = list(range(len(indices)))
        return indices

    def _satisfied(self, pool: list[float]) -> bool:
        succ = sum(r >= self.success_threshold for r in pool)
        fail = len(pool) - succ
        if len(pool) < self.n:
            return False
        if self.target == "positive":
            return succ >= 1
        if self.target == "both":
            return succ >= 1 and fail >= 1
        return succ >= self.n // 2 and fail >= self.n // 2

    def observe(self, indices: list[int], rewards: torch.Tensor, group_index: torch.Tensor) -> None:
        """The round's groups are the prompts ``resample`` (or ``sample``) asked for, in order."""
        self._step["samples"] += len(rewards)
        self._step["successes"] += int((rewards >= self.success_threshold).sum())
        for g, slot in enumerate(self._requested):
            self._pools[slot].extend(float(r) for r in rewards[group_index == g])
        self._active = [s for s in self._requested if not self._satisfied(self._pools[s])]

    def resample(self) -> list[int]:
        self._requested = list(self._active)
        return self._requested

    def form_groups(self) -> list[list[int]]:
        """Per prompt of the step, the positions (in arrival order) of the samples in its group."""
        out = []
        for pool in self._pools:
            succ = [i for i, r in enumerate(pool) if r >= self.success_threshold]
            fail = [i for i, r in enumerate(pool) if r < self.success_threshold]
            s = min(len(succ), max(self.n // 2, self.n - len(fail)))
            picked = sorted(succ[:s] + fail[: self.n - s])
            out.append(picked)
            chosen = [pool[i] for i in picked]
            self._step["groups"] += 1
            self._step["zero_variance"] += int(len(set(chosen)) <= 1)
            self._formed["exhausted"] += int(not self._satisfied(pool))
            self._formed["pool_max"] = max(self._formed["pool_max"], len(pool))
        return out

    def finish_step(self) -> dict[str, float]:
        prompts = self._step["prompts"]
        metrics = super().finish_step()
        metrics.update({
            "curriculum/samples_per_prompt": metrics["curriculum/samples_spent"] / prompts if prompts else 0.0,
            "curriculum/samples_per_prompt_max": float(self._formed["pool_max"]),
            "curriculum/budget_exhausted": float(self._formed["exhausted"]),
        })
        self._formed = {"exhausted": 0, "pool_max": 0}
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load(state["sampler"])
