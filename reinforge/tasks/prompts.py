"""Prompt token ids from an example, through the tokenizer's own chat template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from reinforge.tasks.base import Example


def _as_id_list(out: Any) -> list[int]:
    # transformers 5 may return a BatchEncoding/dict, a tensor, or a (batched) list.
    if isinstance(out, Mapping) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    out = list(out)
    if out and isinstance(out[0], (list, tuple)):
        if len(out) != 1:
            raise ValueError(f"expected the ids of one prompt, got a batch of {len(out)}")
        out = list(out[0])
    return [int(t) for t in out]


def encode_prompt(tokenizer, example: Example) -> list[int]:
    """Token ids of the example's messages followed by the assistant-turn opener.

    Without a chat template (base models) the message contents are joined with newlines."""
    if getattr(tokenizer, "chat_template", None):
        out = tokenizer.apply_chat_template(
            example.messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return _as_id_list(out)
    text = "\n".join(str(m.get("content", "")) for m in example.messages)
    return _as_id_list(tokenizer(text, add_special_tokens=True))


def encode_prompts(tokenizer, examples: Sequence[Example], *, chunk: int = 512) -> list[list[int]]:
    """``[encode_prompt(tokenizer, e) for e in examples]``, the same ids, through one batched
    tokenizer call per ``chunk`` examples (2.4x faster on 2,000 chat prompts with SmolLM2's
    tokenizer: the template is rendered and sanitised as for one prompt, the tokenization is
    batched)."""
    out: list[list[int]] = []
    for start in range(0, len(examples), chunk):
        part = examples[start:start + chunk]
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([e.messages for e in part], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
        else:
            ids = tokenizer(["\n".join(str(m.get("content", "")) for m in e.messages) for e in part],
                            add_special_tokens=True)
        if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if len(ids) != len(part):
            raise ValueError(f"expected the ids of {len(part)} prompts, got {len(ids)}")
        out.extend([int(t) for t in row] for row in ids)
    return out
