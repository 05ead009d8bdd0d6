"""What one step trains on: the scored groups, and where they come from in this process.

``LocalExperienceSource.gather(step, timer)`` runs rounds of collect (the curriculum picks
prompts, the generator samples) and score (the reward function) until the curriculum keeps
``trainer.prompts_per_step`` groups; the Ray rollout workers' source (scale/ray_source.py) has the
same ``gather(step, timer)`` and returns the same ``Scored``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from .batch import RolloutBatch, concat_rollouts
from .rewards import Scores, concat_scores
from .rollout import SamplingParams
from .rollout.seeding import seeded_sampling
from .tasks import Example

__all__ = ["Collected", "Scored", "PhaseTimer", "LocalExperienceSource"]


@dataclass
class Collected:
    """The collect phase: ``rollout`` sampled for ``examples`` (one per group, in group order),
    which are the training examples at ``indices``."""

    rollout: RolloutBatch
    examples: list[Example]
    indices: list[int]


@dataclass
class Scored:
    """The score phase, after the curriculum kept its groups: the rollout, its examples (one per
    group), the scores (one per row), and the rounds it took (``info``)."""

    rollout: RolloutBatch
    examples: list[Example]
    scores: Scores
    info: dict[str, float] = field(default_factory=dict)

    @property
    def row_examples(self) -> list[Example]:
        return [self.examples[int(g)] for g in self.rollout.group_index]


class PhaseTimer:
    """Wall time per named phase within one step (phases that repeat, like collect and score
    under dynamic sampling, add up)."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t0

    def metrics(self) -> dict[str, float]:
        return {f"time_{k}": v for k, v in self.times.items()}


class LocalExperienceSource:
    """Collect and score in this process: ``generator`` samples ``examples`` (each encoded by
    ``encode``), ``reward_fn`` scores them, ``curriculum`` picks prompts and keeps groups.
    ``agent``: the generator is a multi-turn agent, which takes examples rather than token prompts
    and records its episodes."""

    def __init__(self, *, examples: list[Example], encode: Callable[[Example], list[int]], generator, reward_fn,
                 curriculum, sampling: SamplingParams, prompts_per_step: int, seed: int, agent: bool = False):
        self.examples, self.encode, self.generator, self.reward_fn = examples, encode, generator, reward_fn
        self.curriculum, self.sampling, self.prompts_per_step, self.seed = curriculum, sampling, prompts_per_step, seed
        self.agent = agent

    def collect(self, indices: list[int], num_samples: int | None = None, key: tuple[int, int] = (0, 0)) -> Collected:
        """Sample ``rollout.num_samples`` (or ``num_samples``) trajectories for each training
        example in ``indices``, under the seed of ``key`` = (step, round) (rollout/seeding.py: a
        Ray worker sampling the same request draws the same tokens)."""
        examples = [self.examples[i] for i in indices]
        sampling = self.sampling if num_samples is None else dataclasses.replace(self.sampling, num_samples=num_samples)
        with seeded_sampling(self.seed, *key):
            if self.agent:
                rollout = self.generator.generate_examples(examples, sampling, record=True)
            else:
                rollout = self.generator.generate([self.encode(e) for e in examples], sampling)
        seats = getattr(rollout, "group_examples", None)
        if seats is not None and len(seats) != len(examples):
            # A game of several trained seats: a group per (example, seat), each with its own
            # example (agents/seats.py), and the example's index once per seat.
            per = len(seats) // len(examples)
            return Collected(rollout, list(seats), [i for i in indices for _ in range(per)])
        return Collected(rollout, examples, indices)

    def score(self, collected: Collected) -> Scores:
        """The reward function's scores of every row (verifier rewards, shaped rewards, token
        rewards)."""
        rows = [collected.examples[int(g)] for g in collected.rollout.group_index]
        return self.reward_fn.score(collected.rollout, rows)

    def gather(self, step: int, timer: PhaseTimer) -> Scored:
        """Rounds of collect and score until the curriculum has ``prompts_per_step`` groups it
        keeps, or its round limit is reached (then the last round is used whole, if nothing was
        kept)."""
        need = self.prompts_per_step
        cur = self.curriculum
        if cur.adaptive_samples:
            return self._gather_adaptive(step, timer)
        kept: list[tuple[RolloutBatch, list[Example], Scores]] = []
        n_kept = rounds = 0
        sampled_tokens = 0.0
        last = None
        need_groups = need  # a game of several trained seats has a group per seat
        while n_kept < need_groups and rounds < cur.max_rounds:
            rounds += 1
            with timer("collect"):
                indices = cur.sample(need)
                collected = self.collect(indices, key=(step, rounds))
            if rounds == 1:
                need_groups = need * max(1, len(collected.examples) // max(1, len(indices)))
            with timer("score"):
                scores = self.score(collected)
            rollout = collected.rollout
            sampled_tokens += float(rollout.action_lengths.sum())
            cur.observe(collected.indices, scores.rewards, rollout.group_index)
            last = (rollout, collected.examples, scores)
            good = cur.keep(scores.rewards, rollout.group_index).nonzero().squeeze(1)[: need_groups - n_kept]
            if len(good) == rollout.num_groups:
                kept.append(last)
            elif len(good):
                rows = torch.isin(rollout.group_index, good).nonzero().squeeze(1)
                part = rollout.select(rows)
                kept.append((part, [collected.examples[int(g)] for g in good],
                             scores.select(rows, part.completion_ids.shape[1])))
            n_kept += len(good)
        info = {"sampling_rounds": float(rounds), "informative_groups": float(n_kept)} if cur.max_rounds > 1 else {}
        # Every round's tokens, kept or not (generated_tokens counts the trained-on rows only).
        info.update(sampled_tokens=sampled_tokens, **cur.finish_step())
        if not kept:
            return Scored(*last, info=info)
        if len(kept) == 1:
            return Scored(*kept[0], info=info)
        rollout = concat_rollouts([k[0] for k in kept], pad_id=self.generator.pad_id)
        return Scored(rollout, [e for k in kept for e in k[1]],
                      concat_scores([k[2] for k in kept], rollout.completion_ids.shape[1]), info=info)

    def _gather_adaptive(self, step: int, timer: PhaseTimer) -> Scored:
        """Adaptive samples per prompt (Reinforce-Ada): the step's prompts are sampled in rounds of
        ``curriculum.samples_per_round``, each round only for the prompts ``curriculum.resample()``
        names, then ``curriculum.form_groups()`` picks each prompt's group from its samples."""
        cur = self.curriculum
        indices = cur.sample(self.prompts_per_step)
        examples = [self.examples[i] for i in indices]
        parts: list[tuple[RolloutBatch, Scores]] = []
        row_prompt: list[int] = []   # the step's prompt (position in indices) of each pooled row
        active, rounds = list(range(len(indices))), 0
        while active and rounds < cur.max_rounds:
            rounds += 1
            with timer("collect"):
                collected = self.collect([indices[p] for p in active], num_samples=cur.samples_per_round,
                                         key=(step, rounds))
            with timer("score"):
                scores = self.score(collected)
            cur.observe(collected.indices, scores.rewards, collected.rollout.group_index)
            parts.append((collected.rollout, scores))
            row_prompt += [active[int(g)] for g in collected.rollout.group_index]
            active = cur.resample()
        rollout = concat_rollouts([p[0] for p in parts], pad_id=self.generator.pad_id)
        width = rollout.completion_ids.shape[1]
        scores = concat_scores([p[1] for p in parts], width)
        sampled_tokens = float(rollout.action_lengths.sum())
        rows_of: dict[int, list[int]] = {}
        for row, p in enumerate(row_prompt):
            rows_of.setdefault(p, []).append(row)
        rows = torch.tensor([rows_of[p][k] for p, picks in enumerate(cur.form_groups()) for k in picks])
        # Rows of one prompt from different rounds become one group.
        rollout = dataclasses.replace(rollout, group_index=torch.tensor(row_prompt)).select(rows)
        scores = scores.select(rows, rollout.completion_ids.shape[1])
        info = {"sampling_rounds": float(rounds), "sampled_tokens": sampled_tokens, **cur.finish_step()}
        return Scored(rollout, examples, scores, info=info)
