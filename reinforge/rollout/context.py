"""Prompts against the model's context, checked once before any weights load.

A prompt as the trainer encodes it (the chat template, system prompt and few-shot turns included)
plus the ``rollout.max_new_tokens`` written after it must fit the positions the model has. Past
them a model with learned positions fails with an index error, and a rotary one (most of today's)
trains silently on positions it never saw, so a prompt that does not fit is refused with its
example id and the numbers, or, when ``task.truncate_prompts=left`` asks for it, cut from the left
and counted. Every prompt is encoded here anyway, into the cache the steps read, so the check costs
no second encoding.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError
from ..tasks import Example
from ..tasks.prompts import encode_prompts

__all__ = ["PromptFit", "fit_prompts", "model_context"]

log = logging.getLogger("reinforge")

# transformers' tokenizers state int(1e30) as their model_max_length when they know none
_NO_LIMIT = 10**9
# The config.json keys that hold the positions a model has, in the order they are trusted
# (n_positions and n_ctx: GPT-2 style; seq_length: some remote-code models).
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def model_context(model_path: str | Path, tokenizer=None) -> tuple[int | None, str]:
    """The most tokens (prompt and completion together) the model at ``model_path`` takes, and
    where that number comes from: its config.json's ``max_position_embeddings`` (or the name its
    architecture uses, also under ``text_config``), else the tokenizer's ``model_max_length`` when
    it states a real one. ``(None, "")`` when neither says (nothing is checked then)."""
    cfg_file = Path(model_path) / "config.json"
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, ValueError):
        raw = {}
    for section in (raw, raw.get("text_config") if isinstance(raw, dict) else None):
        if not isinstance(section, dict):
            continue
        for key in _POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value, f"{key} in {cfg_file}"
    limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(limit, int) and 0 < limit < _NO_LIMIT:
        return limit, "the tokenizer's model_max_length"
    return None, ""


@dataclass
class PromptFit:
    """What :func:`fit_prompts` found: the longest training prompt as it is trained on (after any
    cut; the memory guard reads it), the context, and what was cut."""

    longest_train: int
    context: int | None
    prompts: int = 0
    cut_prompts: int = 0
    cut_tokens: int = 0


def fit_prompts(cfg, model_path: str | Path, tokenizer, splits: Mapping[str, Sequence[Example]],
                cache: dict[str, list[int]], *, budget_name: str = "rollout.max_new_tokens") -> PromptFit:
    """Encode every prompt of ``splits`` (``{"training": [...], "held-out": [...]}``) into
    ``cache`` (example id -> token ids, the ids generation uses) and check each plus
    ``cfg.rollout.max_new_tokens`` against the model's context (``rollout.vllm_max_model_len`` when
    the vLLM backend is given a smaller one). A prompt that does not fit raises a one-line
    ConfigError naming the longest one and the numbers, unless ``cfg.task.truncate_prompts`` is
    ``left``: then such prompts lose their first tokens in the cache, and the cut is logged.
    A multi-turn run (``env``) is checked with ``env.max_tokens`` (every token after the opening
    prompt: the model's turns and the observations) in place of ``rollout.max_new_tokens``, on the
    prompts as the task gives them, and is never cut: the environment may open with other
    messages, and its conversation grows turn by turn. ``budget_name``: what the messages call the
    completion budget (``reinforge eval`` passes its ``--max-new-tokens``)."""
    context, source = model_context(model_path, tokenizer)
    if cfg.env is not None:
        return _fit_env(cfg.env.max_tokens, context, source, tokenizer, splits)
    rollout = cfg.rollout
    if rollout.backend == "vllm" and rollout.vllm_max_model_len and (context is None or rollout.vllm_max_model_len < context):
        context, source = rollout.vllm_max_model_len, "rollout.vllm_max_model_len"
    new = rollout.max_new_tokens
    lengths: list[tuple[int, str, Example]] = []
    for split, examples in splits.items():
        todo = [e for e in examples if e.id not in cache]
        cache.update(zip((e.id for e in todo), encode_prompts(tokenizer, todo)))
        lengths.extend((len(cache[e.id]), split, e) for e in examples)
    fit = PromptFit(longest_train=max((n for n, s, _ in lengths if s == "training"), default=1), context=context,
                    prompts=len(lengths))
    if context is None or not lengths:
        return fit
    n, split, worst = max(lengths, key=lambda t: t[0])
    where = f"the model's context of {context} tokens ({source})"
    if new >= context:
        fix = (f"lower {budget_name} to at most {context - n}" if n < context else
               f"lower {budget_name}, and shorten the prompts or set task.truncate_prompts=left")
        raise ConfigError(f"{budget_name}={new} leaves no room for a prompt in {where}: {fix} (the "
                          f"longest prompt, {split} example {worst.id!r}, has {n} tokens)")
    room = context - new
    over = [(k, s, e) for k, s, e in lengths if k > room]
    if not over:
        return fit
    if cfg.task.truncate_prompts == "off":
        lower = f"lower {budget_name} to {context - n} or less, " if context - n > 0 else ""
        raise ConfigError(
            f"prompt too long for the model: {split} example {worst.id!r} has {n} tokens (chat template, system "
            f"prompt and few-shot turns included) + {budget_name}={new} = {n + new}, beyond {where}; "
            f"{len(over)} of {len(lengths)} prompts do not fit. Shorten the prompts, {lower}or set "
            f"task.truncate_prompts=left to cut the start of those that do not fit"
        )
    for k, _, e in over:  # "left": keep the end, where the question and the assistant's turn are
        cache[e.id] = cache[e.id][-room:]
    fit.cut_prompts, fit.cut_tokens = len(over), sum(k - room for k, _, _ in over)
    fit.longest_train = max((min(k, room) for k, s, _ in lengths if s == "training"), default=1)
    per_split = ", ".join(f"{sum(s == name for _, s, _ in over)} {name}" for name in splits)
    log.warning("task.truncate_prompts=left: cut the start of %d of %d prompts (%s), %d tokens in all, to at most "
                "%d tokens each so that %s=%d fits %s; the longest was %s example %r (%d tokens)",
                fit.cut_prompts, len(lengths), per_split, fit.cut_tokens, room, budget_name, new, where, split,
                worst.id, n)
    return fit


def _fit_env(budget: int, context: int | None, source: str, tokenizer,
             splits: Mapping[str, Sequence[Example]]) -> PromptFit:
    """A multi-turn run's opening prompts plus ``env.max_tokens`` against the context (nothing is
    cached: the agent loop renders its own conversation); the memory guard reads the longest."""
    lengths = [(len(ids), split, e) for split, examples in splits.items()
               for e, ids in zip(examples, encode_prompts(tokenizer, list(examples)))]
    fit = PromptFit(longest_train=max((n for n, s, _ in lengths if s == "training"), default=1), context=context,
                    prompts=len(lengths))
    if context is None or not lengths:
        return fit
    n, split, worst = max(lengths, key=lambda t: t[0])
    if n + budget > context:
        lower = f"lower env.max_tokens to {context - n} or less" if context - n > 0 else "shorten the prompts"
        raise ConfigError(
            f"a multi-turn trajectory may not fit the model: {split} example {worst.id!r} opens with {n} tokens "
            f"(chat template, system prompt and few-shot turns included), and env.max_tokens={budget} more may follow "
            f"(turns and observations), {n + budget} in all, beyond the model's context of {context} tokens "
            f"({source}); {lower}")
    return fit
