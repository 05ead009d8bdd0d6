"""Policy losses that replace PPO's per-token ratio clip with another trust region: a smooth gate
(SAPO), a clipped geometric mean over the sequence (GMPO), a direct divergence test per token
(DPPO) and a quadratic penalty on the log-ratio (DRO).

Same signature, shapes and padding rules as the losses in ``losses.py`` (registered there by
``register_policy_loss``; importing ``reinforge.algorithms`` registers these too).
"""

from __future__ import annotations

import torch
from torch import Tensor

from reinforge.algorithms.losses import (
    _LOG_RATIO_CLAMP,
    _masked_log_ratio,
    _ratio_stats,
    _token_advantages,
    register_policy_loss,
)

__all__ = ["sapo_loss", "gmpo_loss", "dppo_tv_loss", "dppo_kl_loss", "dro_loss"]


@register_policy_loss("sapo", advantage_weighted=True, options=("sapo_tau_pos", "sapo_tau_neg"))
def sapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip: float | None = None,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO: a smooth, temperature-controlled gate on the ratio in place of the hard clip.

    "Soft Adaptive Policy Optimization", Gao et al. (Qwen Team), 2025, arXiv:2511.20347 (verl's
    ``sapo``)::

        f_tau(rho) = sigmoid(tau (rho - 1)) * 4 / tau          tau = tau_pos if A_t > 0 else tau_neg
        loss_t     = -f_tau(rho_t) * A_t
        gradient   = -4 sigmoid(.) (1 - sigmoid(.)) * rho_t * A_t * grad logp_t

    At ``rho = 1`` the gradient is the policy gradient; away from 1 it fades smoothly instead of
    dropping to 0 at a clip boundary. ``tau_neg > tau_pos`` (paper: 1.05 and 1.0) makes it fade
    faster for negative advantages, whose updates spread probability over the vocabulary. The
    paper aggregates with ``seq_mean_token_mean`` (verl forces it; here the recipe sets it). The
    log-ratio is clamped to [-20, 20] as in the other losses. Clip ranges and ``dual_clip`` are not
    used; ``clip_fraction`` is 0 (no token loses its gradient).
    """
    mask = mask.bool()
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    adv = _token_advantages(advantages, mask, ratio.dtype)
    tau = torch.where(adv > 0, torch.full_like(adv, sapo_tau_pos), torch.full_like(adv, sapo_tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    per_token = torch.where(mask, -gate * adv, zero)
    return per_token, _ratio_stats(ratio, mask, torch.zeros_like(mask))


@register_policy_loss("gmpo", advantage_weighted=True)
def gmpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.4,
    clip_eps_high: float = 0.4,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GMPO: the geometric mean of the token ratios, clipped token by token in log space.

    "Geometric-Mean Policy Optimization", Zhao et al., 2025, arXiv:2507.20673 (verl's
    ``geo_mean``). With ``l_t = logp_t - logp_old_t`` and ``s = sign(A_t)``::

        l~_t   = s * min(s * l_t, s * clip(l_t, -eps_low, eps_high))    pessimistic clip, per token
        rho_i  = exp( mean_t l~_t )                                      over sequence i's real tokens
        A_i    = mean_t A_t
        loss_i = -A_i * rho_i

    The clip range is on the LOG-ratio (``clip_eps_*`` are ``eps``, the ratio range is
    ``[e^-eps_low, e^eps_high]``; the paper uses 0.4 and 0.4). A geometric mean is far less moved
    by one outlier token ratio than GRPO's arithmetic mean. Returned per token as ``loss_i`` on
    each of sequence i's real tokens, so ``loss_agg=seq_mean_token_mean`` gives the paper's
    ``mean_i loss_i`` (the recipe sets it; ``token_mean`` would weigh long sequences more). The
    log-ratio is clamped to [-20, 20] first, as in the other losses (verl leaves it unclamped, so
    the two differ only beyond that). ``clip_fraction``: tokens whose clipped branch was taken
    (they get no gradient). ``dual_clip`` is not used.
    """
    mask = mask.bool()
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    adv = _token_advantages(advantages, mask, log_ratio.dtype)
    sgn = torch.sign(adv)
    clamped = log_ratio.clamp(-clip_eps_low, clip_eps_high)
    pessimistic = sgn * torch.minimum(sgn * log_ratio, sgn * clamped)
    zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
    lengths = mask.sum(dim=1).clamp_min(1).to(log_ratio.dtype)
    seq_ratio = torch.exp(torch.where(mask, pessimistic, zero).sum(dim=1) / lengths)
    seq_adv = adv.sum(dim=1) / lengths
    seq_loss = -seq_adv * seq_ratio
    per_token = torch.where(mask, seq_loss[:, None].expand_as(log_ratio), zero)
    cut = (sgn * clamped) < (sgn * log_ratio)
    return per_token, _ratio_stats(seq_ratio[:, None].expand_as(log_ratio), mask, cut)


def _dppo(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, valid_pos: Tensor,
          valid_neg: Tensor, cap: float) -> tuple[Tensor, dict[str, Tensor]]:
    """DPPO's loss given its trust-region masks (the two variants differ only in those)."""
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    weight = ratio.clamp(max=cap).detach()
    adv = _token_advantages(advantages, mask, ratio.dtype)
    valid = torch.where(adv > 0, valid_pos, valid_neg) & mask
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    lp = torch.where(mask, logprobs, zero)
    per_token = torch.where(valid, -adv * weight * lp, zero)
    return per_token, _ratio_stats(ratio, mask, mask & ~valid)


def _detached_logprobs(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Detached log-probs of the sampled tokens now and at ``old_logprobs`` (0 on padding)."""
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    return (torch.where(mask, logprobs.detach(), zero),
            torch.where(mask, old_logprobs.detach().to(logprobs.dtype), zero))


_DPPO_DOC = """

    "Rethinking the Trust Region in LLM Reinforcement Learning", Qi et al., 2026, arXiv:2602.04879
    (DPPO, verl's ``dppo_tv`` / ``dppo_kl``). PPO's ratio clip is a noisy one-sample estimate of
    the policy's divergence: it over-restricts rare tokens (1e-5 -> 1e-3 is a ratio of 100) and
    lets a likely token's probability fall from 0.99 to 0.8 unclipped. DPPO masks a token when a
    direct estimate of the divergence at that token leaves the trust region in the direction the
    advantage pushes, and otherwise takes a truncated-IS policy gradient::

        w_t    = sg( min(rho_t, dppo_ratio_cap) )
        loss_t = -[t inside the region] * w_t * A_t * logp_t

    ``clip_eps_low`` / ``clip_eps_high`` are the divergence thresholds (``delta``) for negative /
    positive advantages, as in verl. ``dppo_ratio_cap`` truncates the weight (paper section 5.4: a
    large cap, 20 by default). ``clip_fraction`` counts masked tokens. ``dual_clip`` is not used."""


@register_policy_loss("dppo_tv", advantage_weighted=True, options=("dppo_ratio_cap",))
def dppo_tv_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.15,
    clip_eps_high: float = 0.15,
    dual_clip: float | None = None,
    dppo_ratio_cap: float = 20.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    mask = mask.bool()
    lp, lp_old = _detached_logprobs(logprobs, old_logprobs, mask)
    p, p_old = torch.exp(lp), torch.exp(lp_old)
    return _dppo(logprobs, old_logprobs, advantages, mask, (p - p_old) <= clip_eps_high,
                 (p - p_old) >= -clip_eps_low, dppo_ratio_cap)


dppo_tv_loss.__doc__ = """DPPO-Binary-TV: the trust region is ``|p_t - p_old_t| <= delta`` (the
    total variation between the two Bernoulli distributions "this token / any other"): a token
    is masked when ``p - p_old > delta_high`` with ``A > 0`` or ``p - p_old < -delta_low`` with
    ``A <= 0``. The paper's threshold: 0.15.""" + _DPPO_DOC


@register_policy_loss("dppo_kl", advantage_weighted=True, options=("dppo_ratio_cap",))
def dppo_kl_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.05,
    clip_eps_high: float = 0.05,
    dual_clip: float | None = None,
    dppo_ratio_cap: float = 20.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    mask = mask.bool()
    lp, lp_old = _detached_logprobs(logprobs, old_logprobs, mask)
    p, p_old = torch.exp(lp), torch.exp(lp_old)
    kl = p_old * (lp_old - lp) + (1.0 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    return _dppo(logprobs, old_logprobs, advantages, mask, (kl <= clip_eps_high) | (p <= p_old),
                 (kl <= clip_eps_low) | (p >= p_old), dppo_ratio_cap)


dppo_kl_loss.__doc__ = """DPPO-Binary-KL: the trust region is ``KL(Bern(p_old_t) || Bern(p_t)) <=
    delta``, ``p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8))``; a
    token is masked when it is outside and the probability moved the advantage's way (up for
    ``A > 0``, down for ``A <= 0``). The paper's threshold: 0.05.""" + _DPPO_DOC


@register_policy_loss("dro", options=("dro_beta",))
def dro_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip: float | None = None,
    dro_beta: float = 0.1,
) -> tuple[Tensor, dict[str, Tensor]]:
    """DRO-style policy gradient with a quadratic trust region instead of a clip (verl's ``dro``).

    After Direct Reward Optimisation, "Offline Regularised Reinforcement Learning for Large
    Language Models Alignment", Richemond et al., 2024, arXiv:2405.19107, whose squared loss
    regularises the policy's log-ratio quadratically; here in the per-token form of verl's and
    Tinker's ``dro`` loss, against the proximal policy::

        loss_t   = -( A_t * logp_t - beta/2 * (logp_t - logp_old_t)^2 )
        gradient = -( A_t - beta * (logp_t - logp_old_t) ) * grad logp_t

    On a fresh batch (``logp_old = sg(logp)``) the penalty and its gradient are 0: the plain
    policy gradient. The penalty acts on every token, whatever its advantage, so this loss is not
    advantage-weighted (rows with advantage 0 are still run). Clip ranges and ``dual_clip`` are
    not used; ``clip_fraction`` is 0. The log-ratio is not clamped (a square cannot overflow).
    """
    mask = mask.bool()
    d = _masked_log_ratio(logprobs, old_logprobs, mask)
    adv = _token_advantages(advantages, mask, logprobs.dtype)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    lp = torch.where(mask, logprobs, zero)
    per_token = torch.where(mask, -(adv * lp - 0.5 * dro_beta * d * d), zero)
    ratio = torch.exp(d.detach().clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    return per_token, _ratio_stats(ratio, mask, torch.zeros_like(mask))
