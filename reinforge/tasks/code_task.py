"""Programming problems checked by running the model's code against tests (the `code` verifier in
reinforge.rewards runs them in a sandbox; this module only loads and checks the problems).

One problem per JSONL line. Function problems (the program defines a function that is called):

    {"id": "sum_list",
     "prompt": "Write a function `sum_list(xs)` that returns the sum of the numbers in xs.",
     "entry_point": "sum_list",
     "signature": "def sum_list(xs: list[int]) -> int:",            (optional, shown to the model)
     "tests": [{"args": [[1, 2, 3]], "expected": 6},
               {"args": [[]], "kwargs": {}, "expected": 0}]}

Standard input/output problems (no entry_point; the program is run once per test):

    {"id": "shout", "prompt": "Read a line from standard input and print it in upper case.",
     "tests": [{"stdin": "abc\\n", "stdout": "ABC\\n"}]}

args, kwargs and expected are JSON values; a returned tuple counts as a list, and floats are
compared with a relative tolerance of 1e-6. stdout is compared line by line ignoring trailing
whitespace and trailing empty lines. Optional fields: "solution" (a reference solution, never
shown to the model; the test suite checks it passes), "difficulty", "tags". Unknown fields are
kept in the example's metadata.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from reinforge.tasks.base import Example, PromptFormat, Task, TaskError

# Bundled problem sets: name -> file in reinforge/tasks/data.
BUNDLED_CODE_SETS = {"basic": "code_basic.jsonl"}


@dataclass(frozen=True)
class CodeProblem:
    """A problem's tests, as the code verifier needs them. mode: "function" or "stdio"."""

    id: str
    mode: str
    tests: tuple[dict[str, Any], ...]
    entry_point: str | None = None

    @classmethod
    def from_metadata(cls, metadata: dict) -> "CodeProblem":
        if "tests" not in metadata:
            raise TaskError(
                "this example has no code tests (metadata has no 'tests'); the code verifier's "
                "mode 'tests' needs task.source=code, or use its mode 'stdout_answer' to score a "
                "program's output with the task's own scorer"
            )
        return cls(
            id=str(metadata.get("id", "?")),
            mode="function" if metadata.get("entry_point") else "stdio",
            tests=tuple(metadata["tests"]),
            entry_point=metadata.get("entry_point"),
        )


def _check_row(row: Any, where: str) -> dict:
    if not isinstance(row, dict):
        raise TaskError(f"{where} is a {type(row).__name__}, not an object of fields")
    if not isinstance(row.get("prompt"), str) or not row["prompt"].strip():
        raise TaskError(f"{where} needs a non-empty string field 'prompt' (the problem statement)")
    entry = row.get("entry_point")
    if entry is not None and (not isinstance(entry, str) or not entry.isidentifier()):
        raise TaskError(f"{where}: 'entry_point' must be a Python function name, got {entry!r}")
    tests = row.get("tests")
    if not isinstance(tests, list) or not tests:
        raise TaskError(f"{where} needs a non-empty list field 'tests'")
    for k, t in enumerate(tests):
        if not isinstance(t, dict):
            raise TaskError(f"{where} tests[{k}] is a {type(t).__name__}, not an object")
        if entry is not None:
            if "expected" not in t or not isinstance(t.get("args", []), list) or not isinstance(
                t.get("kwargs", {}), dict
            ):
                raise TaskError(
                    f"{where} tests[{k}]: a function problem's test is "
                    '{"args": [...], "kwargs": {...} (optional), "expected": value}; got '
                    f"{json.dumps(t)[:200]}"
                )
        elif not isinstance(t.get("stdin", ""), str) or not isinstance(t.get("stdout"), str):
            raise TaskError(
                f"{where} tests[{k}]: a problem without 'entry_point' is a stdin/stdout problem, "
                'whose test is {"stdin": "...", "stdout": "..."}; got ' + json.dumps(t)[:200]
            )
    return row


def load_code_problems(path: str | Path, key: str = "task.path") -> list[dict]:
    """Rows of a code-problem JSONL file, each checked; errors name the line and the fix."""
    from reinforge.config.textfile import read_utf8  # (here: importing the tasks loads no config)

    path = Path(path)
    if not path.is_file():
        raise TaskError(f"{key}: no such file: {str(path)!r}")
    rows, ids = [], set()
    for lineno, line in enumerate(read_utf8(path, key, TaskError).splitlines(), 1):
        if not line.strip():
            continue
        where = f"{str(path)!r} line {lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise TaskError(f"{where} is not valid JSON: {err}") from None
        row = _check_row(row, where)
        row.setdefault("id", f"line{lineno}")
        if row["id"] in ids:
            raise TaskError(f"{where}: id {row['id']!r} is used twice; ids must be unique")
        ids.add(row["id"])
        rows.append(row)
    if not rows:
        raise TaskError(f"{key}: {str(path)!r} has no problems")
    return rows


def bundled_code_path(name: str) -> Path:
    if name not in BUNDLED_CODE_SETS:
        raise TaskError(
            f"task.name: no bundled code problem set {name!r}; bundled: "
            f"{', '.join(BUNDLED_CODE_SETS)}. Or give task.path, a JSONL file of problems "
            "(format: docs/sandbox.md)"
        )
    return Path(str(resources.files("reinforge.tasks") / "data" / BUNDLED_CODE_SETS[name]))


class CodeTask(Task):
    """Programming problems from a JSONL file or a bundled set, split into train and held-out by
    a seeded shuffle. Examples carry the problem (with its tests) in metadata; answer is None.
    Scored by the `code` verifier, which runs the code: score() here refuses."""

    needs_verifier = "code"

    def __init__(
        self,
        path: str | None = None,
        *,
        name: str | None = None,
        eval_path: str | None = None,
        train_size: int = 5000,
        eval_size: int = 10,
        seed: int = 0,
        prompt_format: PromptFormat = PromptFormat(),
    ) -> None:
        if path is None:
            if name is None:
                raise TaskError("task.source=code needs task.path (a JSONL file of problems) or "
                                f"task.name of a bundled set: {', '.join(BUNDLED_CODE_SETS)}")
            file = bundled_code_path(name)
            self.name = f"code:{name}"
        else:
            file = Path(path)
            self.name = f"code:{file.name}"
        self.prompt_format = prompt_format
        rows = load_code_problems(file)
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        if eval_path is not None:
            eval_rows = load_code_problems(eval_path, "task.eval_path")
            train_rows = [rows[i] for i in order]
        else:
            if eval_size >= len(rows):
                raise TaskError(
                    f"task.eval_size={eval_size} but {self.name} has only {len(rows)} problems; "
                    "lower task.eval_size or give a separate task.eval_path"
                )
            eval_rows = [rows[i] for i in sorted(order[:eval_size])]
            train_rows = [rows[i] for i in sorted(order[eval_size:])]
        held = {r["prompt"] for r in eval_rows}
        train_rows = [r for r in train_rows if r["prompt"] not in held][:train_size]
        if not train_rows:
            raise TaskError(f"{self.name} has no training problems left after holding out")
        self._train = [self._example(r, "train") for r in train_rows]
        self._eval = [self._example(r, "eval") for r in eval_rows]

    def _example(self, row: dict, split: str) -> Example:
        question = row["prompt"].rstrip()
        if row.get("signature"):
            question += f"\n\nUse this signature:\n```python\n{row['signature'].strip()}\n```"
        metadata = {k: v for k, v in row.items() if k != "solution"}  # never near the model
        return Example(
            id=f"{self.name}/{split}/{row['id']}",
            messages=self.prompt_format.messages(question),
            answer=None,
            metadata=metadata,
        )

    def train_examples(self) -> Sequence[Example]:
        return self._train

    def eval_examples(self) -> Sequence[Example]:
        return self._eval

    def score(self, answer: str, example: Example) -> float:
        raise TaskError(
            f"{self.name} is scored by running the code against its tests: use "
            "reward.verifiers=[{name: code}] instead of the 'task' verifier"
        )
