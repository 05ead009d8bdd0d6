"""Off-policy corrections: how the policy loss accounts for samples drawn by another policy.

The tokens a batch trains on were sampled by the *behaviour* policy: the generator's copy of the
weights, which differs from the learner's by numerics (another engine or precision) and, with
asynchronous rollouts, by whole policy versions (staleness). The learner computes the
*proximal* log-probs of those tokens with its weights at the start of the update (the batch's
``old_logprobs``), against which the ratio of the clipped objective is taken. A correction turns
the two into a detached per-token weight that multiplies the per-token policy loss (0 drops a
token from the loss without changing the loss's normaliser)::

    d_t = logp_prox_t - logp_behav_t        (0 on padding)
    loss_t  <-  w_t * loss_t

Corrections are registered by their ``algorithm.off_policy`` name (``register_off_policy``), each
with its :class:`Needs` (all but "none" need the proximal log-probs, one no-grad forward per
step). Every correction also reports the sampler/learner mismatch (:func:`mismatch_stats`).
"""

from __future__ import annotations

from typing import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from reinforge.algorithms.losses import _LOG_RATIO_CLAMP, _masked_log_ratio, truncated_importance_weights
from reinforge.algorithms.registry import Needs, Registry

__all__ = ["OFF_POLICY_CORRECTIONS", "TIS_LEVELS", "Correction", "register_off_policy", "off_policy_correction",
           "mismatch_stats", "no_correction", "tis_correction", "icepop_correction", "decoupled_correction"]

#: Every off-policy correction, by its ``algorithm.off_policy`` name.
OFF_POLICY_CORRECTIONS = Registry("off-policy correction", "algorithm.off_policy")
TIS_LEVELS = ("token", "sequence")


@dataclass
class Correction:
    """``weights``: [N, T] float32 multipliers of the per-token policy loss (1 on padding), or
    None for no change; ``stats``: scalars for the step's metrics."""

    weights: Tensor | None
    stats: dict[str, float] = field(default_factory=dict)


def register_off_policy(name: str, *, needs: Needs = Needs(old_logprobs=True)) -> Callable[[Callable], Callable]:
    """Decorator: register ``fn(proximal_logprobs, sampler_logprobs, mask, **options) ->
    Correction`` as ``algorithm.off_policy=name``. Options it does not use arrive too (``**_``)."""
    return OFF_POLICY_CORRECTIONS.register(name, needs=needs)


def off_policy_correction(name: str, proximal_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor,
                          **options) -> Correction:
    """The correction ``name`` of a batch; its stats include :func:`mismatch_stats`."""
    corr = OFF_POLICY_CORRECTIONS.lookup(name)(proximal_logprobs, sampler_logprobs, mask, **options)
    return Correction(corr.weights, {**mismatch_stats(proximal_logprobs, sampler_logprobs, mask), **corr.stats})


def _log_ratio(proximal: Tensor, sampler: Tensor, mask: Tensor) -> Tensor:
    return _masked_log_ratio(proximal.detach().float(), sampler.detach().float(), mask.bool())


def mismatch_stats(learner_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor) -> dict[str, float]:
    """How far the sampler's log-probs of its own tokens are from the learner's, over real tokens:
    the mean and max of ``|d_t|`` (``logprob_diff_mean``, ``logprob_diff_max``), the share with
    ``|d_t| > 0.1`` nats, and ``mismatch_kl``: the k3 estimate of KL(sampler || learner) from the
    sampled tokens, mean over tokens of ``r - 1 - log r`` with ``r = p_learner / p_sampler``
    (Schulman, "Approximating KL Divergence", 2020; >= 0, unbiased under the sampler)."""
    mask = mask.bool()
    d = _log_ratio(learner_logprobs, sampler_logprobs, mask)
    n = max(int(mask.sum()), 1)
    a = d.abs()
    dc = d.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    k3 = torch.where(mask, torch.exp(dc) - 1.0 - dc, torch.zeros_like(dc))
    return {
        "logprob_diff_mean": float(a.sum()) / n,
        "logprob_diff_max": float(a.max()) if mask.any() else 0.0,
        "logprob_diff_frac_gt_0.1": float(((a > 0.1) & mask).sum()) / n,
        "mismatch_kl": float(k3.sum()) / n,
    }


def _weight_stats(weights: Tensor, mask: Tensor) -> dict[str, float]:
    n = max(int(mask.sum()), 1)
    return {"is_weight_mean": float(torch.where(mask, weights, torch.zeros_like(weights)).sum()) / n,
            "is_weight_max": float(weights[mask].max()) if mask.any() else 0.0}


@register_off_policy("none", needs=Needs())
def no_correction(proximal_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, **_) -> Correction:
    """No correction: the samples are treated as the proximal policy's own (exact only when the
    generator samples from the learner's weights in the learner's numerics)."""
    return Correction(None)


@register_off_policy("tis")
def tis_correction(proximal_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *,
                   tis_cap: float | None = None, tis_level: str = "token", **_) -> Correction:
    """Truncated importance sampling (TIS) of the sampler/learner mismatch.

    "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", Yao, Liu et al.,
    2025 (fengyao.notion.site), with ``C = tis_cap`` (2.0 in their runs)::

        token:     w_t = min(exp(d_t), C)
        sequence:  w_t = min(exp(sum_s d_s), C)   for every token t of the sequence

    The sequence-level weight is the likelihood ratio of the whole completion (unbiased for a
    sequence-level objective, higher variance; "When Speed Kills Stability: Demystifying RL
    Collapse from the Training-Inference Mismatch", Liu, Li et al., 2025); ``tis_truncated_frac``
    is the share of tokens (of sequences, at sequence level) whose weight was truncated.
    """
    if tis_cap is None:
        raise ValueError("off-policy correction 'tis' needs algorithm.tis_cap (Yao et al. use 2.0)")
    if tis_level not in TIS_LEVELS:
        raise ValueError(f"unknown tis_level {tis_level!r}; expected one of {TIS_LEVELS}")
    mask = mask.bool()
    if tis_level == "token":
        weights, stats = truncated_importance_weights(proximal_logprobs, sampler_logprobs, mask, tis_cap)
        out = {"tis_truncated_frac": stats["tis_truncated_frac"]}
    else:
        d = _log_ratio(proximal_logprobs, sampler_logprobs, mask)
        seq_ratio = torch.exp(d.sum(dim=1).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
        rows = mask.any(dim=1)
        weights = torch.where(mask, seq_ratio.clamp(max=tis_cap)[:, None].expand_as(d), torch.ones_like(d))
        out = {"tis_truncated_frac": float(((seq_ratio > tis_cap) & rows).sum()) / max(int(rows.sum()), 1)}
    return Correction(weights, {**out, **_weight_stats(weights, mask)})


@register_off_policy("icepop")
def icepop_correction(proximal_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *,
                      icepop_band: tuple[float, float] = (0.5, 5.0), **_) -> Correction:
    """Masked importance sampling, IcePop: tokens whose probability ratio leaves a band are
    dropped from the loss; the others are weighted by their ratio.

    "Small Leak Can Sink a Great Ship: Boost RL Training on MoE with IcePop!", Ling Team (Ant
    Group), Sep 2025 (ringtech.notion.site/icepop; used to train Ring-1T), with
    ``k_t = exp(d_t)`` = p_learner / p_sampler and ``icepop_band = (alpha, beta)``::

        w_t = k_t   if alpha <= k_t <= beta
              0     otherwise (no gradient from that token)

    Unlike truncation, a token the two engines disagree on badly contributes nothing instead of a
    capped, still wrong, gradient. ``icepop_masked_frac`` is the share of tokens dropped.
    """
    low, high = (float(x) for x in icepop_band)
    if not 0 < low <= 1 <= high:
        raise ValueError(f"icepop_band must be (low, high) with 0 < low <= 1 <= high, got {tuple(icepop_band)}")
    mask = mask.bool()
    d = _log_ratio(proximal_logprobs, sampler_logprobs, mask)
    ratio = torch.exp(d.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    inside = (ratio >= low) & (ratio <= high)
    weights = torch.where(mask, torch.where(inside, ratio, torch.zeros_like(ratio)), torch.ones_like(ratio))
    n = max(int(mask.sum()), 1)
    return Correction(weights, {"icepop_masked_frac": float((mask & ~inside).sum()) / n,
                                **_weight_stats(weights, mask)})


@register_off_policy("decoupled")
def decoupled_correction(proximal_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, *,
                         decoupled_cap: float | None = None, **_) -> Correction:
    """AReaL's decoupled PPO objective: the clip is taken against a proximal policy, and the
    behaviour policy's samples are reweighted to it.

    "AReaL: A Large-Scale Asynchronous Reinforcement Learning System for Language Reasoning", Fu
    et al., 2025, arXiv:2505.24298. With samples from a stale behaviour policy
    ``pi_behav`` (the generator's weights, maybe several versions old) and the proximal policy
    ``pi_prox`` (the learner's weights at the start of the update: the batch's old log-probs)::

        r_t = pi_theta / pi_prox                               (the clipped ratio)
        w_t = sg(pi_prox / pi_behav) = exp(d_t), optionally min(w_t, decoupled_cap)
        loss_t = -w_t * min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)

    The trust region is around the recent proximal policy, not the stale one that sampled, so
    staleness widens neither the region nor the step. The formula is token-level TIS's; they
    differ in purpose and default: this weight corrects policy lag and is not truncated unless
    ``decoupled_cap`` is set (``decoupled_truncated_frac`` then counts truncated tokens).
    """
    mask = mask.bool()
    d = _log_ratio(proximal_logprobs, sampler_logprobs, mask)
    ratio = torch.exp(d.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    capped = ratio if decoupled_cap is None else ratio.clamp(max=decoupled_cap)
    weights = torch.where(mask, capped, torch.ones_like(ratio))
    stats = _weight_stats(weights, mask)
    if decoupled_cap is not None:
        stats["decoupled_truncated_frac"] = float(((ratio > decoupled_cap) & mask).sum()) / max(int(mask.sum()), 1)
    return Correction(weights, stats)
