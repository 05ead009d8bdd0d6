"""Demonstrations for supervised fine-tuning: where they come from, how they become tokens, and
how a batch of them becomes the learner's batch.

A demonstration is chat messages (the prompt) and the assistant's response. Its tokens are the
prompt through the tokenizer's chat template with the assistant-turn opener (exactly what
generation is given, ``tasks.encode_prompt``), then the response's tokens up to and including
the stop token the generator stops on. Only the response tokens are trained on: in the learner's
batch they are the action mask, and the prompt, template included, is context.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..batch import RolloutBatch
from ..tasks import Example, PromptFormat, Task, TaskError, encode_prompt
from ..tasks.prompts import _as_id_list

log = logging.getLogger(__name__)

__all__ = ["Demo", "TokenizedDemo", "DemoError", "format_response", "demos_from_task", "demos_from_file",
           "tokenize_demo", "tokenize_demos", "collate", "stop_token_id"]


class DemoError(TaskError):
    """A demonstration that cannot be used; the message names the file, the row and the fix."""


@dataclass
class Demo:
    """One demonstration. ``id`` names where it came from (a task example's id, or
    ``file:<name>/line N``); ``messages`` are the prompt's chat messages."""

    id: str
    messages: list[dict]
    response: str
    metadata: dict = field(default_factory=dict)


@dataclass
class TokenizedDemo:
    id: str
    prompt_ids: list[int]
    response_ids: list[int]   # ends with the stop token

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)


# ----------------------------------------------------------------------------- responses


def format_response(answer: str, answer_format: str, solution: str | None = None) -> str:
    """The response a verifier reading ``answer_format`` (rewards/extract.py) takes ``answer``
    from, after the worked ``solution`` when there is one."""
    if answer_format == "tags":
        final = f"<answer>{answer}</answer>"
    elif answer_format == "boxed":
        final = f"\\boxed{{{answer}}}"
    elif answer_format in ("last_line", "raw"):
        if answer_format == "raw" and solution:
            # raw reads the whole completion: a solution before the answer would be part of it
            raise DemoError("reward.answer_format=raw takes the whole completion as the answer, so a worked "
                            "solution cannot precede it; set sft.solution_keys=[] or use answer_format=tags")
        final = str(answer)
    else:
        raise DemoError(f"unknown reward.answer_format {answer_format!r}")
    solution = (solution or "").strip()
    return f"{solution}\n{final}" if solution else final


def demos_from_task(task: Task, *, num_examples: int | None, answer_format: str,
                    solution_keys: Sequence[str] = ()) -> list[Demo]:
    """Demonstrations from the first ``num_examples`` training examples (never the held-out
    ones): the gold answer in the format the verifier reads, after the worked solution found
    under the first of ``solution_keys`` present in the example's metadata."""
    train = task.train_examples()
    n = len(train) if num_examples is None else min(num_examples, len(train))
    demos = []
    for i in range(n):
        ex: Example = train[i]
        if ex.answer is None:
            raise DemoError(f"training example {ex.id} of task {task.name!r} has no reference answer, so no "
                            "demonstration can be made from it; give demonstrations as a file (sft.source=file)")
        meta = ex.metadata.get("metadata", ex.metadata) if isinstance(ex.metadata, dict) else {}
        solution = next((str(meta[k]) for k in solution_keys if isinstance(meta, dict) and meta.get(k)), None)
        demos.append(Demo(ex.id, ex.messages, format_response(ex.answer, answer_format, solution),
                          {"answer": ex.answer, "worked_solution": solution is not None}))
    return demos


def _is_messages(value: Any) -> bool:
    return isinstance(value, list) and len(value) > 0 and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in value)


def demos_from_file(path: str | Path, *, prompt_field: str = "prompt", response_field: str = "response",
                    messages_field: str = "messages", prompt_format: PromptFormat | None = None,
                    limit: int | None = None) -> list[Demo]:
    """Demonstrations from a JSONL/JSON/Parquet/CSV file. A row is either ``{prompt_field:
    str or chat messages, response_field: str}`` or ``{messages_field: [..., {"role":
    "assistant", "content": ...}]}`` (the last message is the response). Every row is checked
    before any model loads; a bad one raises DemoError naming the file, the row and the fix."""
    from ..tasks.file_task import _load_rows

    path = Path(path)
    located = _load_rows(path, "sft.path")
    if not located:
        raise DemoError(f"sft.path: {str(path)!r} has no rows")
    demos = []
    for loc, row in located[: limit if limit is not None else len(located)]:
        where = f"{str(path)!r} {loc}"
        if not isinstance(row, dict):
            raise DemoError(f"{where} is a {type(row).__name__}, not an object of fields")
        fix = (f"each row needs {prompt_field!r} and {response_field!r} (sft.prompt_field / sft.response_field), "
               f"or {messages_field!r}: chat messages ending with the assistant's reply (sft.messages_field)")
        if row.get(messages_field) is not None:
            msgs = row[messages_field]
            if not _is_messages(msgs):
                raise DemoError(f"{where}: field {messages_field!r} must be a list of {{'role': ..., 'content': ...}} "
                                f"messages, got {type(msgs).__name__}")
            if msgs[-1]["role"] != "assistant":
                raise DemoError(f"{where}: the last message of {messages_field!r} has role {msgs[-1]['role']!r}; it "
                                "must be the assistant's response (the one trained on)")
            if len(msgs) < 2:
                raise DemoError(f"{where}: {messages_field!r} holds only the assistant's reply; add the user turn "
                                "before it")
            prompt: Any = [dict(m) for m in msgs[:-1]]
            response = msgs[-1]["content"]
        else:
            missing = [f for f in (prompt_field, response_field) if row.get(f) is None]
            if missing:
                present = ", ".join(map(repr, row)) or "(none)"
                raise DemoError(f"{where} has no {' or '.join(map(repr, missing))} (fields present: {present}); {fix}")
            prompt, response = row[prompt_field], row[response_field]
            if not isinstance(prompt, str) and not _is_messages(prompt):
                raise DemoError(f"{where}: field {prompt_field!r} must be a string or a list of chat messages, got "
                                f"{type(prompt).__name__}")
        if not isinstance(response, str) or not response.strip():
            raise DemoError(f"{where}: the response is {'empty' if isinstance(response, str) else type(response).__name__}"
                            "; it must be non-empty text")
        messages = (prompt_format or PromptFormat()).messages(prompt)
        demos.append(Demo(f"file:{path.name}/{loc.replace(' ', '_')}", messages, response))
    return demos


# ----------------------------------------------------------------------------- tokens


def stop_token_id(model, tokenizer) -> int:
    """The token a response ends with: the one generation stops on (the model's generation
    config, else the tokenizer's EOS), so a fine-tuned model learns to stop where it is cut."""
    gc = getattr(model, "generation_config", None)
    eos = gc.eos_token_id if gc is not None else None
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("the tokenizer has no EOS token and the model's generation config names none: "
                         "a response cannot be given a stop token")
    return int(eos)


def tokenize_demo(tokenizer, demo: Demo, stop_id: int) -> TokenizedDemo:
    """Prompt ids exactly as generation sees them, then the response's ids and ``stop_id``.

    The chat template's rendering of the whole conversation is used when it begins with the
    prompt's ids (the usual case), so the response is tokenized in context; its tokens run up to
    the template's end-of-turn (the stop token). Otherwise the response is tokenized alone."""
    prompt_ids = encode_prompt(tokenizer, Example(demo.id, demo.messages, None))
    response_ids: list[int] | None = None
    if getattr(tokenizer, "chat_template", None):
        full = _as_id_list(tokenizer.apply_chat_template(
            demo.messages + [{"role": "assistant", "content": demo.response}], tokenize=True, return_dict=False))
        if full[: len(prompt_ids)] == prompt_ids:
            rest = full[len(prompt_ids):]
            if stop_id in rest:
                response_ids = rest[: rest.index(stop_id)]
    if response_ids is None:
        response_ids = _as_id_list(tokenizer(demo.response, add_special_tokens=False))
    return TokenizedDemo(demo.id, prompt_ids, response_ids + [stop_id])


def tokenize_demos(tokenizer, demos: Sequence[Demo], stop_id: int, *, max_tokens: int,
                   context: tuple[int, str] | None = None) -> list[TokenizedDemo]:
    """Every demonstration's tokens; those over ``max_tokens`` (``sft.max_tokens``), or over the
    model's ``context`` = (tokens, where that number comes from) when it is smaller, are left out
    and counted: past its positions a rotary model trains silently on positions it never saw."""
    limit, name, fix = max_tokens, f"sft.max_tokens={max_tokens} tokens", "raise sft.max_tokens"
    if context is not None and context[0] < max_tokens:
        limit, name = context[0], f"the model's context of {context[0]} tokens ({context[1]})"
        fix = "shorten the demonstrations or use a model with a longer context"
    out = [tokenize_demo(tokenizer, d, stop_id) for d in demos]
    kept = [t for t in out if len(t) <= limit]
    if len(kept) < len(out):
        longest = max(out, key=len)
        log.warning("%d of %d demonstrations are longer than %s and are left out (the longest, %r, has %d)",
                    len(out) - len(kept), len(out), name, longest.id, len(longest))
    if not kept:
        raise DemoError(f"no demonstration fits in {name}; {fix}")
    return kept


def collate(demos: Sequence[TokenizedDemo], pad_id: int) -> RolloutBatch:
    """The learner's batch: one row (and group) per demonstration, prompts left-padded,
    responses right-padded; ``action_mask`` (what the loss reads) is True on response tokens
    only."""
    from ..rollout import left_pad

    prompt_ids, prompt_mask = left_pad([d.prompt_ids for d in demos], pad_id)
    width = max(len(d.response_ids) for d in demos)
    ids = torch.full((len(demos), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(demos), width), dtype=torch.bool)
    for i, d in enumerate(demos):
        ids[i, : len(d.response_ids)] = torch.tensor(d.response_ids, dtype=torch.long)
        mask[i, : len(d.response_ids)] = True
    n = len(demos)
    return RolloutBatch(
        prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=mask,
        sampler_logprobs=torch.zeros(ids.shape), truncated=torch.zeros(n, dtype=torch.bool),
        group_index=torch.arange(n), texts=[""] * n,
    )
