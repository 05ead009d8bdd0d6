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

    def __init__(self, n: int, seed: int | list[int]):
        if n <= 0:
            raise ValueError("there are no training prompts to sample from (task.train_size, or the data file)")
        self.n, self.seed = n, seed
        self.epoch, self.pos = 0, 0
        self._perm = self._permutation()

    def _permutation(self) -> np.ndarray:
        seed = self.seed if isinstance(self.seed, list) else [self.seed]
        return np.random.default_rng([*seed, self.epoch]).permutation(self.n)

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


def group_outcomes(rewards: torch.Tensor, group_index: torch.Tensor, success_threshold: float) -> list[tuple[int, int, bool]]:
    """Per group (in group order): (successes, samples, zero_variance). A success is a reward
    >= ``success_threshold``; a group is zero-variance when all its rewards are equal (its
    group-relative advantage is zero, whatever the threshold)."""
    informative = informative_groups(rewards, group_index) if len(rewards) else torch.zeros(0, dtype=torch.bool)
    out = []
    for g in range(len(informative)):
        r = rewards[group_index == g]
        out.append((int((r >= success_threshold).sum()), len(r), not bool(informative[g])))
    return out


class Curriculum:
    """Every step trains on ``prompts_per_step`` prompts drawn in seeded epochs; every group is
    kept, in one round.

    A strategy overrides some of:
      ``sample(k)``        the next k training prompts (indices into ``task``'s training examples);
      ``keep(rewards, group_index)``  [G] bool, which groups of a scored round to train on;
      ``observe(indices, rewards, group_index)``  what was scored this round (per-prompt stats);
      ``finish_step()``    called once the step's rounds are done: per-step updates (GRESO's
                           exploration rates, a level change, mixture weights) and the step's
                           ``curriculum/*`` metrics;
      ``max_rounds``       how many rounds a step may take to fill ``prompts_per_step`` groups.
    Adaptive sample counts (``adaptive_samples = True``, Reinforce-Ada) replace the rounds of new
    prompts with rounds over the step's own prompts: ``resample()`` names the prompts (positions
    in the step's ``sample`` result) that get another ``samples_per_round`` samples, and
    ``form_groups()`` picks, per prompt, which of its samples form its group.
    ``rewards`` are the verifiers' rewards before length shaping. ``task`` is the task the run
    trains on: the configured one, or one made of several (difficulty levels, mixtures).
    Everything a strategy learns goes into ``state_dict``, which is saved as JSON in every
    checkpoint, so a resumed run makes the same choices as an uninterrupted one.
    """

    max_rounds = 1
    adaptive_samples = False
    samples_per_round: int | None = None

    def __init__(self, num_examples: int, seed: int, *, success_threshold: float = 1.0, task=None):
        self.sampler = EpochSampler(num_examples, seed)
        self.seed = seed
        self.success_threshold = success_threshold
        self.task = task
        self._reset_step()

    # -- the step's bookkeeping (every strategy logs these) ------------------------------------
    def _reset_step(self) -> None:
        self._step = {"prompts": 0, "samples": 0, "groups": 0, "zero_variance": 0, "successes": 0, "skipped": 0}

    def _record(self, rewards: torch.Tensor, group_index: torch.Tensor) -> list[tuple[int, int, bool]]:
        outcomes = group_outcomes(rewards, group_index, self.success_threshold)
        s = self._step
        s["groups"] += len(outcomes)
        s["samples"] += len(rewards)
        s["zero_variance"] += sum(z for _, _, z in outcomes)
        s["successes"] += sum(c for c, _, _ in outcomes)
        return outcomes

    # -- the interface -------------------------------------------------------------------------
    def sample(self, k: int) -> list[int]:
        out = self.sampler.next(k)
        self._step["prompts"] += len(out)
        return out

    def keep(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        return torch.ones(int(group_index.max()) + 1 if len(group_index) else 0, dtype=torch.bool)

    def observe(self, indices: list[int], rewards: torch.Tensor, group_index: torch.Tensor) -> None:
        """Called after every scored round with the round's prompts (one per group)."""
        self._record(rewards, group_index)

    def finish_step(self) -> dict[str, float]:
        """The step's curriculum metrics (and the per-step updates of a strategy that has them):
        prompts rolled out and skipped before rollout, samples generated, the share of rolled-out
        groups whose rewards were all equal (they teach nothing), and the share of successes."""
        s = self._step
        metrics = {
            "curriculum/prompts_rolled_out": float(s["prompts"]),
            "curriculum/prompts_skipped": float(s["skipped"]),
            "curriculum/samples_spent": float(s["samples"]),
            "curriculum/zero_variance_frac": s["zero_variance"] / s["groups"] if s["groups"] else 0.0,
            "curriculum/success_rate": s["successes"] / s["samples"] if s["samples"] else 0.0,
        }
        self._reset_step()
        return metrics

    def resample(self) -> list[int]:
        return []

    def form_groups(self) -> list[list[int]]:
        raise NotImplementedError(f"{type(self).__name__} does not adapt sample counts")

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

    def __init__(self, num_examples: int, seed: int, *, max_rounds: int, **kw):
        super().__init__(num_examples, seed, **kw)
        self.max_rounds = max_rounds

    def keep(self, rewards: torch.Tensor, group_index: torch.Tensor) -> torch.Tensor:
        return informative_groups(rewards, group_index)
