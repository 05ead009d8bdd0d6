"""The curriculum interface, its default (seeded epochs, every group kept) and DAPO's dynamic
sampling."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..algorithms import informative_groups


class EpochSampler:
    """Seeded epochs over ``n`` training prompts: each epoch is a fresh permutation drawn from
    ``(seed, epoch)``, so the order is reproducible and its position is a small state."""

    def __init__(self, n: int, seed: int):
        if n <= 0:
            raise ValueError("there are no training prompts to sample from (task.train_size, or the data file)")
        self.n, self.seed = n, seed
        self.epoch, self.pos = 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> np.ndarray:
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.n)

    def next(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos >= self.n:
                self.epoch, self.pos = self.epoch + 1, 0
                self._perm = self._permutation()
            take = min(k - len(out), self.n - self.pos)
            out.extend(int(i) for i in self._perm[self.pos : self.pos + take])
            self.pos += take
        return out

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._perm = self._permutation()


class Curriculum:
    """Every step trains on ``prompts_per_step`` prompts drawn in seeded epochs; every group is
    kept, in one round.

    A strategy overrides some of:
      ``sample(k)``        the next k training prompts (indices into the task's training examples);
      ``keep(rewards, group_index)``  [G] bool, which groups of a scored round to train on;
      ``observe(indices, rewards, group_index)``  what was scored this round (per-prompt stats);
      ``max_rounds``       how many rounds a step may take to fill ``prompts_per_step`` groups.
    ``rewards`` are the verifiers' rewards before length shaping.
    """

    max_rounds = 1

    def __init__(self, num_examples: int, seed: int):
        self.sampler = EpochSampler(num_examples, seed)

    def sample(self, k: int) -> list[int]:
        return self.sampler.next(k)

    def keep(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        return torch.ones(int(group_index.max()) + 1 if len(group_index) else 0, dtype=torch.bool)

    def observe(self, indices: list[int], rewards: torch.Tensor, group_index: torch.Tensor) -> None:
        """Called after every scored round with the round's prompts (one per group)."""

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load(state)


class DynamicSampling(Curriculum):
    """DAPO's dynamic sampling ("DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
    Yu et al., 2025, arXiv:2503.14476): a group whose rewards are all equal has zero
    group-relative advantage and only dilutes the batch, so it is dropped, and more prompts are
    drawn until the step has its groups or ``max_rounds`` rounds were generated. The filter reads
    rewards before length shaping (for 0/1 rewards, DAPO's accuracy filter): completions that
    differ only in length do not make a group count."""

    def __init__(self, num_examples: int, seed: int, *, max_rounds: int):
        super().__init__(num_examples, seed)
        self.max_rounds = max_rounds

    def keep(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        return informative_groups(rewards, group_index)


def build_curriculum(cfg, num_examples: int) -> Curriculum:
    """The curriculum a run config asks for (``algorithm.dynamic_sampling`` and
    ``algorithm.max_sampling_rounds`` today)."""
    algo, seed = cfg.algorithm, cfg.trainer.seed
    if algo.dynamic_sampling:
        return DynamicSampling(num_examples, seed, max_rounds=algo.max_sampling_rounds)
    return Curriculum(num_examples, seed)
