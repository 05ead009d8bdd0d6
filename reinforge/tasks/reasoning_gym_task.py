"""Procedural tasks from reasoning-gym.

Held-out prompts are generated from a seed stream of their own and are never trained on: a
training slot whose question text equals a held-out question takes its item from a spare stream
instead. Doing it this way round (rather than dropping held-out questions that appear in the
training set) keeps the held-out set a function of (name, options, seed, eval_size) only, so runs
with different train_size are evaluated on the same prompts, and it lets the training set stay
lazy: some reasoning-gym generators take ~0.5 s per item, so 5000 of them cannot be made up front.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import threading
from collections.abc import Sequence
from typing import Any, overload

from reinforge.tasks.base import Example, PromptFormat, Task, TaskError

logger = logging.getLogger(__name__)

# numpy-seeded generators (e.g. pool_matrix) need seed + index < 2**32.
_SEED_MOD = 2**31
_STREAM_STRIDE = 1_000_003  # seed distance between streams: train, eval, spare 1, spare 2, ...
_EVAL_STREAM = 1
_SPARE_STREAMS = 8  # spare seed streams tried before falling back to another training slot
_RESERVED_OPTIONS = {"seed": "task.seed", "size": "task.train_size / task.eval_size"}


def _derive_seed(seed: int, stream: int) -> int:
    return (seed + stream * _STREAM_STRIDE) % _SEED_MOD


def _registry() -> dict[str, tuple[type, type]]:
    from reasoning_gym.factory import DATASETS

    return DATASETS


def _accepted_options(config_cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(config_cls) if f.name not in _RESERVED_OPTIONS]


def _check_name(name: str) -> tuple[type, type]:
    registry = _registry()
    if name in registry:
        return registry[name]
    close = difflib.get_close_matches(name, list(registry), n=5, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    raise TaskError(
        f"task.name: unknown reasoning-gym task {name!r}.{hint} All {len(registry)} names: "
        "python -c \"import reasoning_gym.factory as f; print(sorted(f.DATASETS))\""
    )


def _check_options(name: str, config_cls: type, options: dict[str, Any]) -> None:
    accepted = _accepted_options(config_cls)
    for key in options:
        if key in _RESERVED_OPTIONS:
            raise TaskError(
                f"task.options.{key}: set by reinforge for task {name!r}; use "
                f"{_RESERVED_OPTIONS[key]} instead. Accepted options: {', '.join(accepted)}"
            )
    unknown = [k for k in options if k not in accepted]
    if unknown:
        raise TaskError(
            f"task.options: unknown option(s) {', '.join(map(repr, unknown))} for reasoning-gym "
            f"task {name!r}; accepted options: {', '.join(accepted) or '(none)'}"
        )


class _TrainSequence(Sequence[Example]):
    """Training examples made on first access (and cached), so a large train_size is free."""

    def __init__(self, task: "ReasoningGymTask") -> None:
        self._task = task
        self._cache: dict[int, Example] = {}

    def __len__(self) -> int:
        return self._task.train_size

    @overload
    def __getitem__(self, i: int) -> Example: ...
    @overload
    def __getitem__(self, i: slice) -> list[Example]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"training example {i} out of range (train_size={n})")
        ex = self._cache.get(i)
        if ex is None:
            ex = self._task._make_example(self._task._train_entry(i), split="train", index=i)
            self._cache[i] = ex
        return ex


class ReasoningGymTask(Task):
    """A reasoning-gym dataset by name; score() is the dataset's own score_answer."""

    def __init__(
        self,
        name: str,
        *,
        options: dict[str, Any] | None = None,
        train_size: int = 5000,
        eval_size: int = 200,
        seed: int = 0,
        prompt_format: PromptFormat = PromptFormat(),
    ) -> None:
        import reasoning_gym  # noqa: F401  (registers every dataset)

        self.name = name
        self.options = dict(options or {})
        self.train_size = int(train_size)
        self.eval_size = int(eval_size)
        self.seed = int(seed)
        self.prompt_format = prompt_format
        self._dataset_cls, self._config_cls = _check_name(name)
        _check_options(name, self._config_cls, self.options)
        self._streams: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._train = self._stream(0)  # also validates the options
        self._eval, self._eval_questions = self._build_eval()
        self._train_view = _TrainSequence(self)

    # -- generation ---------------------------------------------------------------------------

    def _create(self, seed: int, size: int):
        from reasoning_gym import create_dataset

        try:
            return create_dataset(self.name, seed=seed, size=size, **self.options)
        except Exception as err:  # reasoning-gym validates with asserts, TypeErrors, ...
            accepted = ", ".join(_accepted_options(self._config_cls))
            raise TaskError(
                f"task.options {self.options!r} are invalid for reasoning-gym task {self.name!r}: "
                f"{type(err).__name__}: {err}. Accepted options: {accepted}"
            ) from None

    def _stream(self, k: int):
        """Seed stream k (0 = train, 1 = eval, 2.. = spares), created on first use."""
        with self._lock:
            ds = self._streams.get(k)
            if ds is None:
                ds = self._create(_derive_seed(self.seed, k), self.train_size)
                self._streams[k] = ds
            return ds

    def _build_eval(self) -> tuple[list[Example], set[str]]:
        # Distinct questions only; a small question space shows itself as many repeats.
        max_draws = 4 * self.eval_size + 64
        ds = self._create(_derive_seed(self.seed, _EVAL_STREAM), max_draws)
        examples: list[Example] = []
        seen: set[str] = set()
        for idx in range(max_draws):
            entry = ds[idx]
            q = entry["question"]
            if q in seen:
                continue
            seen.add(q)
            examples.append(self._make_example(entry, split="eval", index=len(examples)))
            if len(examples) == self.eval_size:
                return examples, seen
        raise TaskError(
            f"reasoning-gym task {self.name!r} with task.options {self.options!r} gave only "
            f"{len(examples)} distinct questions in {max_draws} draws, too few to hold out "
            f"task.eval_size={self.eval_size} questions and still train on others; lower "
            "task.eval_size or widen task.options"
        )

    def _train_entry(self, i: int) -> dict:
        """Item i of the train stream, unless its question is held out: then item i of the first
        spare stream that is not, else the next training slot that is not."""
        for k in [0, *range(_EVAL_STREAM + 1, _EVAL_STREAM + 1 + _SPARE_STREAMS)]:
            entry = self._stream(k)[i]
            if entry["question"] not in self._eval_questions:
                return entry
        for j in range(1, self.train_size):
            entry = self._train[(i + j) % self.train_size]
            if entry["question"] not in self._eval_questions:
                return entry
        raise TaskError(
            f"every question of reasoning-gym task {self.name!r} is held out; lower "
            "task.eval_size or widen task.options"
        )

    def _make_example(self, entry: dict, *, split: str, index: int) -> Example:
        answer = entry.get("answer")
        return Example(
            id=f"{self.name}/{split}/{index}",
            messages=self.prompt_format.messages(entry["question"]),
            answer=None if answer is None else str(answer),
            metadata=entry,
        )

    # -- Task API -----------------------------------------------------------------------------

    def train_examples(self) -> Sequence[Example]:
        return self._train_view

    def eval_examples(self) -> Sequence[Example]:
        return self._eval

    def score(self, answer: str, example: Example) -> float:
        return float(self._train.score_answer(answer=answer, entry=example.metadata))
