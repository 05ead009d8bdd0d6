"""Per-token policy losses and KL penalties.

Shapes follow ``reinforge.batch``: N completions, T completion tokens (right-padded), masks bool
with True on real tokens. Every function returns a per-token tensor [N, T] that is exactly 0 on
padding, whatever garbage (even ±inf or NaN) the padded positions of its inputs hold, in the
forward pass and in the gradients; turning it into a scalar is ``aggregation.aggregate_loss``'s job.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["clipped_surrogate_loss", "kl_penalty", "KL_ESTIMATORS"]

# exp(20) ~ 4.9e8: far beyond any ratio a clipped objective lets through, far below overflow.
_LOG_RATIO_CLAMP = 20.0

KL_ESTIMATORS = ("k1", "k2", "k3")


def _masked_log_ratio(num: Tensor, den: Tensor, mask: Tensor) -> Tensor:
    """``num - den`` on real tokens, 0 on padding (``where``, so padded inf/NaN never leak,
    not even into gradients)."""
    if num.shape != den.shape or num.shape != mask.shape:
        raise ValueError(
            f"shape mismatch: {tuple(num.shape)}, {tuple(den.shape)}, mask {tuple(mask.shape)}"
        )
    mask = mask.bool()
    zero = torch.zeros((), dtype=num.dtype, device=num.device)
    return torch.where(mask, num - den, zero)


def clipped_surrogate_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped surrogate objective, per token, as a loss to minimise.

    "Proximal Policy Optimization Algorithms", Schulman et al., 2017, arXiv:1707.06347, with the
    decoupled ("clip-higher") range of "DAPO: An Open-Source LLM Reinforcement Learning System
    at Scale", Yu et al., 2025, arXiv:2503.14476::

        ratio_t = exp(logp_t - logp_old_t)
        loss_t  = -min(ratio_t * A_t, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A_t)

    The log-ratio is clamped to [-20, 20] before ``exp``, and set to 0 on padding.

    Args:
        logprobs: [N, T] log-probs of the sampled tokens under the policy being trained (grad).
        old_logprobs: [N, T] log-probs under the policy that generated the batch (no grad needed).
        advantages: [N] (one per completion, broadcast over its tokens) or [N, T].
        mask: [N, T] bool, True on real completion tokens.
        clip_eps_low, clip_eps_high: the ratio is clipped to [1 - eps_low, 1 + eps_high].

    Returns:
        ``(per_token_loss [N, T], stats)``; the loss is 0 on padding. ``stats`` holds detached
        scalars over real tokens (0 when there are none): ``clip_fraction`` (share of tokens where
        the clipped branch is the smaller one, i.e. clipping changed the objective and the token
        gets no gradient), ``ratio_mean`` and ``ratio_max``.
    """
    mask = mask.bool()
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))

    if advantages.dim() == 1:
        if advantages.shape[0] != mask.shape[0]:
            raise ValueError(f"advantages {tuple(advantages.shape)} vs mask {tuple(mask.shape)}")
        advantages = advantages.unsqueeze(1).expand_as(mask)
    elif advantages.shape != mask.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} vs mask {tuple(mask.shape)}")
    zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    adv = torch.where(mask, advantages.to(ratio.dtype), zero)

    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    per_token = torch.where(mask, -torch.minimum(unclipped, clipped), zero)

    with torch.no_grad():
        n = mask.sum()
        denom = n.clamp_min(1).to(ratio.dtype)
        is_clipped = (clipped < unclipped) & mask
        r = ratio.detach()
        masked_max = torch.where(mask, r, torch.full_like(r, -torch.inf)).amax() if n > 0 else zero
        stats = {
            "clip_fraction": is_clipped.sum().to(ratio.dtype) / denom,
            "ratio_mean": torch.where(mask, r, zero).sum() / denom,
            "ratio_max": masked_max.clone(),
        }
    return per_token, stats


def kl_penalty(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, estimator: str = "k3"
) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi.

    Estimators of "Approximating KL Divergence", J. Schulman, 2020,
    http://joschu.net/blog/kl-approx.html, with ``d = logp - logp_ref``::

        k1 = d                          unbiased, high variance, can be negative
        k2 = d^2 / 2                    biased, low variance, >= 0
        k3 = exp(-d) - (-d) - 1         unbiased, low variance, >= 0 (GRPO's choice)

    For k3 the log-ratio is clamped to [-20, 20] so ``exp`` cannot overflow.

    Args:
        logprobs: [N, T] log-probs under the policy being trained.
        ref_logprobs: [N, T] log-probs under the reference policy.
        mask: [N, T] bool, True on real tokens.
        estimator: "k1", "k2" or "k3".

    Returns:
        [N, T], 0 on padding.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")
    d = _masked_log_ratio(logprobs, ref_logprobs, mask)  # 0 on padding, so every k is 0 there
    if estimator == "k1":
        return d
    if estimator == "k2":
        return 0.5 * d * d
    neg = (-d).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # log(pi_ref / pi)
    return torch.exp(neg) - neg - 1.0
