"""Prompt token ids from an example, through the tokenizer's own chat template."""

from __future__ import annotations

from collections.abc import Mapping
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
