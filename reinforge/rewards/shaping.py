"""Reward shaping that depends on the completion's token length, not its text."""

from __future__ import annotations

import torch

__all__ = ["LengthShaping", "soft_overlong_penalty"]


def soft_overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, buffer: int, penalty: float = 1.0) -> torch.Tensor:
    """DAPO's soft overlong punishment ("DAPO: An Open-Source LLM Reinforcement Learning System
    at Scale", Yu et al., 2025, arXiv:2503.14476), added to the reward. With L = ``lengths``,
    L_max = ``max_new_tokens``, L_cache = ``buffer``::

        0                                  if L <= L_max - L_cache
        penalty * (L_max - L_cache - L) / L_cache   if L_max - L_cache < L <= L_max
        -penalty                           if L > L_max

    A completion that runs into the buffer zone loses reward linearly, instead of the hard cliff
    of truncation. Returns [N] float32.
    """
    if buffer <= 0 or buffer > max_new_tokens:
        raise ValueError(f"the overlong buffer must be in 1..max_new_tokens={max_new_tokens}, got {buffer}")
    length = lengths.to(torch.float32)
    start = max_new_tokens - buffer
    out = torch.where(length <= start, torch.zeros_like(length), penalty * (start - length) / buffer)
    return torch.where(length > max_new_tokens, torch.full_like(length, -penalty), out)


class LengthShaping:
    """The length shaping a run's reward config asks for, added to each row's reward by the
    score phase: DAPO's soft overlong punishment over the last ``reward.overlong_buffer`` x
    ``max_new_tokens`` tokens (``soft_overlong_penalty``). Lengths count the model's own tokens."""

    def __init__(self, max_new_tokens: int, buffer: int, penalty: float = 1.0):
        self.max_new_tokens, self.buffer, self.penalty = max_new_tokens, buffer, penalty

    @classmethod
    def from_config(cls, reward_cfg, max_new_tokens: int) -> "LengthShaping | None":
        if reward_cfg.overlong_buffer <= 0:
            return None
        buffer = max(1, round(reward_cfg.overlong_buffer * max_new_tokens))
        return cls(max_new_tokens, buffer, reward_cfg.overlong_penalty)

    def __call__(self, lengths: torch.Tensor) -> torch.Tensor:
        return soft_overlong_penalty(lengths, self.max_new_tokens, self.buffer, self.penalty)
