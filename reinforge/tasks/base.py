"""What a task is: prompts with reference answers, split into train and held-out, and the task's
own notion of a correct answer. Tasks know nothing of models or training."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


class TaskError(ValueError):
    """A task that cannot be built from its config or data; the message names the key to fix."""


@dataclass
class Example:
    """One prompt.

    id:       stable across runs with the same config, e.g. "leg_counting/train/17" or
              "file:data.jsonl/train/3", so samples and evaluations can be joined later.
    messages: chat messages, an optional system message then the user turn.
    answer:   reference answer as a string (None when the data has none).
    metadata: reasoning-gym: the full dataset entry (its scorer needs it); files: the raw row.
    """

    id: str
    messages: list[dict]
    answer: str | None
    metadata: dict = field(default_factory=dict)

    @property
    def prompt_text(self) -> str:
        """The user-visible text of the prompt (all message contents), for logs and dedup."""
        return "\n".join(str(m.get("content", "")) for m in self.messages)


class Task:
    """Base class of tasks. Held-out examples never share a question with training examples."""

    name: str = "task"

    def train_examples(self) -> Sequence[Example]:
        raise NotImplementedError

    def eval_examples(self) -> Sequence[Example]:
        raise NotImplementedError

    def score(self, answer: str, example: Example) -> float:
        """The task's own correctness score of an extracted answer, in [0, 1]."""
        raise NotImplementedError


@dataclass(frozen=True)
class PromptFormat:
    """How a question becomes chat messages: an optional system prompt, a suffix on the question
    (e.g. the answer-format instruction) and solved few-shot turns. Every task holds one."""

    system_prompt: str | None = None
    suffix: str = ""
    few_shot: tuple[dict[str, str], ...] = ()

    def messages(self, question: str | list[dict[str, Any]]) -> list[dict]:
        return build_messages(question, system_prompt=self.system_prompt, prompt_suffix=self.suffix,
                              few_shot=self.few_shot)


_WS = re.compile(r"\s+")


def normalize_answer(text: str, *, case_sensitive: bool = False) -> str:
    """Forgive what a human grader would: surrounding/duplicated whitespace, case, a final period."""
    out = _WS.sub(" ", str(text)).strip()
    # Final periods and the spaces between them in one strip (the only whitespace left is " "):
    # dropping them one at a time copied the string each time, quadratic on "....".
    out = out.rstrip(". ")
    return out if case_sensitive else out.lower()


def build_messages(
    question: str | list[dict[str, Any]],
    *,
    system_prompt: str | None,
    prompt_suffix: str,
    few_shot: Sequence[dict[str, str]] = (),
) -> list[dict]:
    """Chat messages from a question (plain text or existing messages) plus the config's system
    prompt and suffix. The configured system prompt replaces one already present, so the config
    alone decides it; the suffix goes on the last user turn. ``few_shot`` pairs
    ({"user": ..., "assistant": ...}) become solved turns placed before the question; their user
    text gets the suffix too, so the demonstration matches the instruction."""
    if isinstance(question, str):
        messages = [{"role": "user", "content": question + prompt_suffix}]
    else:
        messages = [dict(m) for m in question]
        if prompt_suffix:
            for m in reversed(messages):
                if m.get("role") == "user":
                    m["content"] = str(m.get("content", "")) + prompt_suffix
                    break
    if few_shot:
        shots = []
        for shot in few_shot:
            shots += [{"role": "user", "content": shot["user"] + prompt_suffix},
                      {"role": "assistant", "content": shot["assistant"]}]
        first_user = next((i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages))
        messages[first_user:first_user] = shots
    if system_prompt is not None:
        messages = [m for m in messages if m.get("role") != "system"]
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages
