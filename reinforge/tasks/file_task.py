"""Prompts and reference answers from a local file: JSONL, JSON, Parquet, CSV, or a directory
written by `datasets.Dataset.save_to_disk`. Every row is checked when the task is built, so a bad
row fails before any model loads, with the file, row and field named."""

from __future__ import annotations

import csv
import io
import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from reinforge.tasks.base import Example, PromptFormat, Task, TaskError, normalize_answer

logger = logging.getLogger(__name__)

_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def _load_rows(path: Path, key: str) -> list[tuple[str, Any]]:
    """(location, row) pairs; location is "line N" for JSONL (1-based) and "row N" otherwise."""
    from reinforge.config.textfile import read_utf8  # (here: importing the tasks loads no config)

    if not path.exists():
        raise TaskError(f"{key}: no such file or directory: {str(path)!r}")
    if path.is_dir():
        return _load_saved_dataset(path, key)
    suffix = path.suffix.lower()
    if suffix == ".jsonl" or suffix == ".json":
        text = read_utf8(path, key, TaskError)
        if suffix == ".json" and text.lstrip().startswith("["):
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                raise TaskError(f"{key}: {str(path)!r} is not valid JSON: {err}") from None
            return [(f"row {i}", r) for i, r in enumerate(data, 1)]
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((f"line {lineno}", json.loads(line)))
            except json.JSONDecodeError as err:
                raise TaskError(
                    f"{key}: {str(path)!r} line {lineno} is not valid JSON: {err}"
                ) from None
        return rows
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return [(f"row {i}", r) for i, r in enumerate(pq.read_table(path).to_pylist(), 1)]
    if suffix == ".csv":
        with io.StringIO(read_utf8(path, key, TaskError), newline="") as f:
            return [(f"row {i}", dict(r)) for i, r in enumerate(csv.DictReader(f), 1)]
    raise TaskError(
        f"{key}: {str(path)!r} has an unsupported extension {suffix!r}; accepted: "
        f"{', '.join(_SUFFIXES)}, or a directory written by datasets' save_to_disk"
    )


def _load_saved_dataset(path: Path, key: str) -> list[tuple[str, Any]]:
    import datasets

    try:
        ds = datasets.load_from_disk(str(path))
    except Exception as err:  # noqa: BLE001 - any failure means: not a saved dataset
        raise TaskError(
            f"{key}: {str(path)!r} is a directory but not one written by datasets' save_to_disk "
            f"({type(err).__name__}: {err})"
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds)
        if len(splits) == 1:
            ds = ds[splits[0]]
        elif "train" in ds:
            logger.info("%s: using split 'train' of %s", str(path), splits)
            ds = ds["train"]
        else:
            raise TaskError(
                f"{key}: {str(path)!r} holds several splits ({', '.join(splits)}) and none is "
                "named 'train'; save the split you want on its own"
            )
    return [(f"row {i}", r) for i, r in enumerate(ds.to_list(), 1)]


def _is_messages(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) > 0
        and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)
    )


class FileTask(Task):
    """Rows of a local file; score() is exact match after normalisation (the reward side can use
    math-verify or others instead)."""

    def __init__(
        self,
        path: str,
        *,
        eval_path: str | None = None,
        prompt_field: str = "prompt",
        answer_field: str = "answer",
        id_field: str | None = None,
        train_size: int = 5000,
        eval_size: int = 200,
        seed: int = 0,
        prompt_format: PromptFormat = PromptFormat(),
    ) -> None:
        self.path = Path(path)
        self.name = f"file:{self.path.name}"
        self.prompt_field = prompt_field
        self.answer_field = answer_field
        self.id_field = id_field
        self.prompt_format = prompt_format

        rows = self._checked_rows(self.path, "task.path")
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        if eval_path is not None:
            eval_file = Path(eval_path)
            eval_rows = self._checked_rows(eval_file, "task.eval_path")
            eval_name = f"file:{eval_file.name}"
            eval_pairs = [(i, eval_rows[i]) for i in range(len(eval_rows))]
            train_order = order
        else:
            if eval_size >= len(rows):
                raise TaskError(
                    f"task.eval_size={eval_size} but {str(self.path)!r} has only {len(rows)} rows; "
                    "lower task.eval_size or give a separate task.eval_path"
                )
            eval_name = self.name
            eval_pairs = [(i, rows[i]) for i in sorted(order[:eval_size])]
            train_order = order[eval_size:]

        self._eval = [self._example(r, eval_name, "eval", i) for i, r in eval_pairs]
        # A training row that is a held-out row is left out: the same prompt, or, for rows that
        # carry their own identity (task.id_field: an episode's seed), the same id, so distinct
        # episodes opening with the same text (a game's opening prompt) all stay.
        def key(row: dict) -> str:
            return _prompt_key_row(row, id_field or prompt_field)

        held_out = {key(r) for _, r in eval_pairs}
        train = [i for i in train_order if key(rows[i]) not in held_out]
        dropped = len(train_order) - len(train)
        same = f"{'id (task.id_field=' + id_field + ')' if id_field else 'prompt'} equals a held-out row's"
        fix = "" if id_field else _id_field_hint(rows, prompt_field, answer_field)
        if not train:
            raise TaskError(f"{str(self.path)!r} has no training rows left after holding out: the {dropped} "
                            f"others' {same}{fix}")
        if dropped * 2 > len(train_order):
            logger.warning("%s: the held-out split left out %d of %d training rows, whose %s%s", self.name,
                           dropped, len(train_order), same, fix)
        elif dropped:
            logger.info("%s: %d training rows repeat a held-out %s; left out", self.name, dropped,
                        "id" if id_field else "prompt")
        if len(train) > train_size:
            logger.info(
                "%s: using %d of %d training rows (task.train_size)", self.name, train_size, len(train)
            )
        self._train = [self._example(rows[i], self.name, "train", i) for i in sorted(train[:train_size])]

    def _checked_rows(self, path: Path, key: str) -> list[dict]:
        located = _load_rows(path, key)
        if not located:
            raise TaskError(f"{key}: {str(path)!r} has no rows")
        rows = []
        for loc, row in located:
            if not isinstance(row, dict):
                raise TaskError(f"{str(path)!r} {loc} is a {type(row).__name__}, not an object of fields")
            fields = [(self.prompt_field, "prompt_field"), (self.answer_field, "answer_field")]
            for field, fkey in fields + ([(self.id_field, "id_field")] if self.id_field else []):
                if row.get(field) is None:
                    present = ", ".join(map(repr, row)) or "(none)"
                    what = "has an empty (null)" if field in row else "has no"
                    raise TaskError(
                        f"{str(path)!r} {loc} {what} field {field!r} (task.{fkey}); fields present: "
                        f"{present}. Set task.prompt_field / task.answer_field{' / task.id_field' if self.id_field else ''} "
                        "to the names your data uses"
                    )
            prompt = row[self.prompt_field]
            if not isinstance(prompt, str) and not _is_messages(prompt):
                raise TaskError(
                    f"{str(path)!r} {loc}: field {self.prompt_field!r} (task.prompt_field) must be a "
                    "string or a list of chat messages ({'role': ..., 'content': ...}), got "
                    f"{type(prompt).__name__}"
                )
            rows.append(row)
        return rows

    def _example(self, row: dict, file_name: str, split: str, index: int) -> Example:
        return Example(
            id=f"{file_name}/{split}/{index}",
            messages=self.prompt_format.messages(row[self.prompt_field]),
            answer=str(row[self.answer_field]),
            metadata=row,
        )

    def train_examples(self) -> Sequence[Example]:
        return self._train

    def eval_examples(self) -> Sequence[Example]:
        return self._eval

    def score(self, answer: str, example: Example) -> float:
        if answer is None or example.answer is None:
            return 0.0
        return float(normalize_answer(answer) == normalize_answer(example.answer))


def _prompt_key_row(row: dict, prompt_field: str) -> str:
    prompt = row[prompt_field]
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


def _id_field_hint(rows: list[dict], prompt_field: str, answer_field: str) -> str:
    """The fix for a split that drops rows sharing a prompt: task.id_field, naming a field of the
    data that tells the rows apart when one does (an answer is no identity)."""
    fields = sorted((f for f in rows[0] if f not in (prompt_field, answer_field)),
                    key=lambda f: ("seed" not in f.lower() and "id" not in f.lower(), f))
    distinct = [f for f in fields if all(f in r for r in rows)
                and len({_prompt_key_row(r, f) for r in rows}) == len(rows)]
    named = f" (e.g. task.id_field={distinct[0]}: its values are distinct)" if distinct else ""
    return (f"; if rows with the same prompt are distinct episodes (an environment's seeds), set task.id_field to "
            f"the field that tells them apart{named}, or give a separate task.eval_path")

