"""Strategies over several sets of training examples: a difficulty schedule over a task's options,
and weighted multi-task mixtures. Both train on a ``PooledTask``: the sets end to end, each
example's id prefixed with its set's label, and scoring sent to the task the example came from."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..tasks import Example, Task, TaskError
from .base import Curriculum, EpochSampler


class _PooledExamples(Sequence):
    """The parts' training examples end to end, made on first access. ``heldout`` question texts
    are never returned: such a slot takes the next example of its part that is not held out (a
    level built with other options may draw a question the configured task holds out)."""

    def __init__(self, parts: list[tuple[str, Sequence[Example]]], heldout: set[str]):
        self.parts = parts
        self.heldout = heldout
        self.offsets = [0]
        for _, ex in parts:
            self.offsets.append(self.offsets[-1] + len(ex))
        self._cache: dict[int, Example] = {}

    def __len__(self) -> int:
        return self.offsets[-1]

    def part_of(self, i: int) -> int:
        return bisect.bisect_right(self.offsets, i) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"training example {i} out of range ({len(self)})")
        ex = self._cache.get(i)
        if ex is None:
            p = self.part_of(i)
            label, examples = self.parts[p]
            j, n = i - self.offsets[p], len(examples)
            for step in range(n):
                ex = examples[(j + step) % n]
                if ex.prompt_text not in self.heldout:
                    break
            else:
                raise TaskError(f"every training question of {label!r} is held out by the `task` section; widen "
                                "that level's options or lower task.eval_size")
            ex = self._cache[i] = dataclasses.replace(ex, id=f"{label}/{ex.id}")
        return ex


class PooledTask(Task):
    """Training examples from several tasks (or one task at several option levels); scores each
    example with the task it came from (by the label its id starts with), and held-out examples
    from ``eval_from`` (label, task) pairs, relabelled the same way (a None label keeps the
    task's own ids)."""

    def __init__(self, name: str, parts: list[tuple[str, Task]], *, eval_from: list[tuple[str | None, Task]]):
        self.name = name
        self.labels = [label for label, _ in parts]
        self._tasks = dict(parts)
        self._fallback = eval_from[0][1]
        self._eval: list[Example] = []
        for label, task in eval_from:
            for ex in task.eval_examples():
                self._eval.append(ex if label is None else dataclasses.replace(ex, id=f"{label}/{ex.id}"))
        heldout = {ex.prompt_text for ex in self._eval}
        self._train = _PooledExamples([(label, task.train_examples()) for label, task in parts], heldout)

    def part_range(self, p: int) -> tuple[int, int]:
        return self._train.offsets[p], self._train.offsets[p + 1] - self._train.offsets[p]

    def part_of(self, index: int) -> int:
        return self._train.part_of(index)

    def train_examples(self) -> Sequence[Example]:
        return self._train

    def eval_examples(self) -> Sequence[Example]:
        return self._eval

    def score(self, answer: str, example: Example) -> float:
        return self._tasks.get(example.id.split("/", 1)[0], self._fallback).score(answer, example)


class _PartsCurriculum(Curriculum):
    """Common ground: a PooledTask, an epoch sampler per part, per-part step counts."""

    def __init__(self, task: PooledTask, seed: int, **kw):
        super().__init__(len(task.train_examples()), seed, task=task, **kw)
        self.parts = [EpochSampler(task.part_range(p)[1], [seed, p]) for p in range(len(task.labels))]
        self._reset_parts()

    def _reset_parts(self) -> None:
        self._part_step = [[0, 0, 0] for _ in self.task.labels]  # prompts, successes, samples

    def _draw(self, p: int, k: int) -> list[int]:
        offset, _ = self.task.part_range(p)
        out = [offset + i for i in self.parts[p].next(k)]
        self._part_step[p][0] += k
        self._step["prompts"] += k
        return out

    def observe(self, indices: list[int], rewards: torch.Tensor, group_index: torch.Tensor) -> None:
        for i, (c, m, _) in zip(indices, self._record(rewards, group_index)):
            counts = self._part_step[self.task.part_of(i)]
            counts[1] += c
            counts[2] += m


class DifficultySchedule(_PartsCurriculum):
    """A difficulty schedule over a task's options: level l trains on the task built with
    ``task.options | levels[l]`` (its own seeded dataset, so a level's prompts are the same in
    every run), easiest first. After each step, when the training accuracy over the last
    ``window`` steps at the current level reaches ``threshold``, the next level starts
    (competence-based curriculum, Platanios et al., 2019, arXiv:1903.09848; reasoning-gym's
    curricula grow a level the same way). Levels never go back. Held-out evaluation stays on
    the configured task, so accuracy is comparable across levels."""

    def __init__(self, task: PooledTask, seed: int, *, threshold: float, window: int, **kw):
        super().__init__(task, seed, **kw)
        self.threshold, self.window = threshold, window
        self.level = 0
        self.history: list[list[int]] = []  # [successes, samples] per step at this level

    def sample(self, k: int) -> list[int]:
        return self._draw(self.level, k)

    def finish_step(self) -> dict[str, float]:
        _, succ, samples = self._part_step[self.level]
        trained = self.level
        self.history.append([succ, samples])
        recent = self.history[-self.window :]
        total = sum(m for _, m in recent)
        accuracy = sum(c for c, _ in recent) / total if total else 0.0
        up = len(self.history) >= self.window and accuracy >= self.threshold and self.level + 1 < len(self.parts)
        if up:
            self.level += 1
            self.history = []
        metrics = super().finish_step()
        metrics.update({"curriculum/level": float(trained), "curriculum/level_accuracy": accuracy,
                        "curriculum/level_up": float(up)})
        self._reset_parts()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"level": self.level, "history": [list(h) for h in self.history],
                "parts": [s.state() for s in self.parts]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.level = int(state["level"])
        self.history = [list(h) for h in state["history"]]
        for s, st in zip(self.parts, state["parts"]):
            s.load(st)


class TaskMixture(_PartsCurriculum):
    """Several tasks in one run: each of a step's prompts comes from task i with probability
    ``w_i / sum(w)``, then from that task's own seeded epochs. With ``adapt``, the probabilities
    follow absolute learning progress (Teacher-Student Curriculum Learning, Matiisen et al.,
    2017, arXiv:1707.00183): per task a fast and a slow moving average of its training accuracy,
    ``LP_i = |fast_i - slow_i|``, and ``p_i = (1 - explore) LP_i / sum(LP) + explore w_i / sum(w)``
    (the configured weights alone until some task has progressed). A task that is learning now
    gets more prompts; one that is solved or hopeless fades to its exploration share."""

    def __init__(self, task: PooledTask, seed: int, *, weights: list[float], adapt: bool, explore: float,
                 ema: tuple[float, float], **kw):
        super().__init__(task, seed, **kw)
        w = np.asarray(weights, dtype=np.float64)
        self.weights = w / w.sum()
        self.adapt, self.explore = adapt, explore
        self.fast_rate, self.slow_rate = ema
        self.fast: list[float | None] = [None] * len(weights)
        self.slow: list[float | None] = [None] * len(weights)
        self.rng = np.random.default_rng([seed, 0x313])

    def probabilities(self) -> np.ndarray:
        if not self.adapt:
            return self.weights
        lp = np.array([abs(f - s) if f is not None else 0.0 for f, s in zip(self.fast, self.slow)])
        if lp.sum() <= 0:
            return self.weights
        return (1 - self.explore) * lp / lp.sum() + self.explore * self.weights

    def sample(self, k: int) -> list[int]:
        choice = self.rng.choice(len(self.parts), size=k, p=self.probabilities())
        return [self._draw(int(p), 1)[0] for p in choice]

    def finish_step(self) -> dict[str, float]:
        prompts = sum(c[0] for c in self._part_step)
        metrics = {}
        for p, (n, succ, samples) in enumerate(self._part_step):
            label = self.task.labels[p]
            metrics[f"curriculum/mix/{label}"] = n / prompts if prompts else 0.0
            if samples:
                acc = succ / samples
                metrics[f"curriculum/accuracy/{label}"] = acc
                if self.fast[p] is None:
                    self.fast[p] = self.slow[p] = acc
                else:
                    self.fast[p] += self.fast_rate * (acc - self.fast[p])
                    self.slow[p] += self.slow_rate * (acc - self.slow[p])
        for p, prob in enumerate(self.probabilities()):
            metrics[f"curriculum/weight/{self.task.labels[p]}"] = float(prob)
        metrics.update(super().finish_step())
        self._reset_parts()
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"parts": [s.state() for s in self.parts], "rng": self.rng.bit_generator.state,
                "fast": list(self.fast), "slow": list(self.slow)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for s, st in zip(self.parts, state["parts"]):
            s.load(st)
        self.rng.bit_generator.state = state["rng"]
        self.fast, self.slow = list(state["fast"]), list(state["slow"])
