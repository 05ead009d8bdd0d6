"""Turning a per-token loss [N, T] into the scalar the learner backpropagates.

The learner splits a batch into micro-batches and sums their losses before the optimiser step,
so every normaliser here is the WHOLE batch's, passed in by the caller. With the whole batch's
normalisers, the loss of the batch equals the sum of its micro-batches' losses, whatever the split.
The defaults (computed from the tensor given) are right only when it is the whole batch.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["aggregate_loss", "LOSS_AGG_MODES"]

LOSS_AGG_MODES = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "token_sum_norm")


def _positive(value: float | Tensor | None, default: Tensor, name: str) -> float | Tensor:
    """The normaliser to divide by; 0 (an empty batch, whose loss sum is 0) becomes 1 so the
    loss is 0 instead of NaN."""
    if value is None:
        return default.clamp_min(1)
    if isinstance(value, Tensor):
        return torch.where(value > 0, value, torch.ones_like(value))
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value if value > 0 else 1.0


def aggregate_loss(
    per_token: Tensor,
    mask: Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
) -> Tensor:
    """Reduce a per-token loss to a scalar.

    With ``x = per_token * mask`` (padding never contributes, even if it holds inf/NaN),
    ``len_i = sum_t mask[i, t]``, N_tok = ``num_tokens``, N_seq = ``num_sequences``:

    - ``token_mean``: ``sum_{i,t} x[i,t] / N_tok``. Every token weighs the same, so long
      completions are not under-weighted ("DAPO", Yu et al., 2025, arXiv:2503.14476).
      ``num_tokens`` defaults to ``mask.sum()``.
    - ``seq_mean_token_mean``: ``sum_i (sum_t x[i,t] / len_i) / N_seq``, the original GRPO
      (Shao et al., 2024, arXiv:2402.03300). A sequence of length 0 contributes 0.
      ``num_sequences`` defaults to N.
    - ``seq_mean_token_sum``: ``sum_i sum_t x[i,t] / N_seq``.
    - ``token_sum_norm``: ``sum_{i,t} x[i,t] / C`` with a constant C given as ``num_tokens``, free
      of the length bias ("Understanding R1-Zero-Like Training: A Critical Perspective", Liu et
      al., 2025, arXiv:2503.20783). Pass C = (sequences in the whole batch) x max_new_tokens;
      defaults to ``mask.numel()`` (N x T of this tensor).

    A normaliser of 0 is treated as 1 (the loss of an empty batch is 0, not NaN).

    Args:
        per_token: [N, T] float.
        mask: [N, T] bool, True on real tokens.
        mode: one of ``LOSS_AGG_MODES``.
        num_tokens: whole-batch token count (token_mean) or constant (token_sum_norm).
        num_sequences: whole-batch sequence count (seq_mean_*).

    Returns:
        A scalar tensor.
    """
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {LOSS_AGG_MODES}")
    if per_token.shape != mask.shape or per_token.dim() != 2:
        raise ValueError(f"per_token {tuple(per_token.shape)} and mask {tuple(mask.shape)} must be [N, T]")
    mask = mask.bool()
    zero = torch.zeros((), dtype=per_token.dtype, device=per_token.device)
    x = torch.where(mask, per_token, zero)

    if mode == "token_mean":
        return x.sum() / _positive(num_tokens, mask.sum().to(x.dtype), "num_tokens")
    if mode == "token_sum_norm":
        default = torch.tensor(float(mask.numel()), dtype=x.dtype, device=x.device)
        return x.sum() / _positive(num_tokens, default, "num_tokens")

    n_seq = _positive(
        num_sequences,
        torch.tensor(float(mask.shape[0]), dtype=x.dtype, device=x.device),
        "num_sequences",
    )
    seq_sum = x.sum(dim=1)
    if mode == "seq_mean_token_sum":
        return seq_sum.sum() / n_seq
    lengths = mask.sum(dim=1).clamp_min(1).to(x.dtype)  # empty rows: 0 / 1 = 0
    return (seq_sum / lengths).sum() / n_seq
