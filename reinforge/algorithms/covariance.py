"""Clip-Cov and KL-Cov: entropy control through the tokens whose log-prob and advantage co-vary
most ("The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", Cui et al.,
2025, arXiv:2505.22617). Which tokens (``covariance_token_selection``), which may be drawn
(``clip_cov_candidates``), and how the policy loss changes on them (``apply_cov_penalty``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from reinforge.algorithms.losses import (
    _LOG_RATIO_CLAMP,
    _masked_log_ratio,
    _ratio_stats,
    _token_advantages,
    policy_loss,
)

__all__ = ["COV_PENALTIES", "tokens_with_gradient", "clip_cov_candidates", "covariance_token_selection",
           "kl_cov_loss", "apply_cov_penalty"]

COV_PENALTIES = ("none", "clip_cov", "kl_cov")


def tokens_with_gradient(
    loss_name: str, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, **loss_opts
) -> Tensor:
    """[N, T] bool: the tokens whose policy-loss gradient is not zero at these log-probs.

    A token the ratio clip (or the dual clip) has cut off, or one with a zero advantage, already
    gets no gradient; Clip-Cov leaves those out of its draw, since detaching them would change
    nothing and use up the budget. Computed by differentiating the registered loss ``loss_name``
    itself (with ``loss_opts``: the clip ranges), so it holds for every loss. No gradient flows
    into the inputs."""
    mask = mask.bool()
    with torch.enable_grad():
        lp = logprobs.detach().clone().requires_grad_(True)
        per_token, _ = policy_loss(loss_name, lp, old_logprobs.detach(), advantages.detach(), mask, **loss_opts)
        (grad,) = torch.autograd.grad(per_token.sum(), lp, allow_unused=True)
    if grad is None:
        return torch.zeros_like(mask)
    return mask & (grad != 0)


def clip_cov_candidates(
    loss_name: str, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, **loss_opts
) -> Tensor:
    """[N, T] bool: the tokens Clip-Cov may draw (Cui et al., 2025, arXiv:2505.22617): every real
    token except those whose non-zero advantage the policy loss's clip (or dual clip) has cut off
    at these log-probs (:func:`tokens_with_gradient`), as the authors' code and verl leave out the
    tokens the PPO clip cuts.

    Tokens with a zero advantage stay candidates, as in the paper and the authors' code, although
    detaching them changes nothing: the paper's ``cov_ratio`` (2e-4) was tuned with them in the
    draw, and leaving them out would make Clip-Cov stronger than the method it is named after (in
    a GRPO batch every token of a group with equal rewards has A = 0). With log-probs
    [-1, -5, -1, -1, -1] and advantages [4, 0, 0, 0, 0], tokens 0 and 1 are in the window (1, 5),
    and one draw detaches token 0 half of the time."""
    mask = mask.bool()
    adv = _token_advantages(advantages.detach(), mask, torch.float64)
    return tokens_with_gradient(loss_name, logprobs, old_logprobs, advantages, mask, **loss_opts) | (mask & (adv == 0))


def covariance_token_selection(
    logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    mode: str,
    *,
    ratio: float,
    bounds: tuple[float, float] = (1.0, 5.0),
    generator: torch.Generator | None = None,
    eligible: Tensor | None = None,
) -> Tensor:
    """The tokens Clip-Cov or KL-Cov act on, from the covariance of log-prob and advantage.

    "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models", Cui et al.,
    2025, arXiv:2505.22617. Entropy falls fastest through tokens whose log-prob and advantage
    co-vary strongly. Per real token, with means over all real tokens of the batch::

        cov_t = (logp_t - mean(logp)) * (A_t - mean(A))

    - "clip_cov": among tokens with ``bounds[0] < cov_t < bounds[1]`` that are ``eligible``,
      pick ``max(1, int(ratio * n_tokens))`` at random (``generator``); their gradient is then
      dropped. ``eligible`` (default: every real token) should leave out the tokens the policy
      loss's clip cut off (:func:`clip_cov_candidates`), as the authors' code does.
    - "kl_cov": the ``max(1, int(ratio * n_tokens))`` tokens with the largest ``cov_t``; they get a
      penalty ``coef * |logp - logp_old|`` (:func:`kl_cov_loss`).

    ``n_tokens`` and the means count every real token, eligible or not. Returns [N, T] bool
    (False on padding and for mode "none").

    ``logprobs`` are the CURRENT policy's (the paper's ``Cov(log pi_theta, A)`` at the parameters
    being updated; verl computes it from each micro-batch's current log-probs): on the second
    and later updates of a batch (``epochs`` or ``mini_batches`` > 1) they differ from the
    rollout-time ones. The learner passes them, over the whole (mini-)batch, so the micro-batch
    split cannot change the selection (verl's means are per micro-batch).
    """
    mask = mask.bool()
    sel = torch.zeros(mask.shape, dtype=torch.bool, device=mask.device)
    if mode == "none" or not mask.any():
        return sel
    if mode not in COV_PENALTIES:
        raise ValueError(f"unknown covariance penalty {mode!r}; expected one of {COV_PENALTIES}")
    lp = logprobs.detach().to(torch.float64)
    adv = _token_advantages(advantages.detach(), mask, torch.float64)
    n = int(mask.sum())
    lp_c = lp - lp[mask].mean()
    adv_c = adv - adv[mask].mean()
    cov = torch.where(mask, lp_c * adv_c, torch.full_like(lp, -torch.inf))
    k = max(1, int(ratio * n))
    flat = cov.flatten()
    if mode == "kl_cov":
        idx = torch.topk(flat, min(k, n)).indices
    else:
        window = (flat > bounds[0]) & (flat < bounds[1])
        if eligible is not None:
            window &= eligible.bool().flatten()
        cand = window.nonzero().squeeze(1)
        if len(cand) == 0:
            return sel
        perm = torch.randperm(len(cand), generator=generator)[: min(k, len(cand))].to(cand.device)
        idx = cand[perm]
    sel.view(-1)[idx] = True
    return sel


def kl_cov_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    selected: Tensor,
    *,
    coef: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """KL-Cov's per-token loss (Cui et al., 2025, arXiv:2505.22617): the UNCLIPPED surrogate on
    every token, plus a penalty on the ``selected`` high-covariance tokens, in place of PPO's clip::

        loss_t = -A_t * rho_t  +  [t in selected] * coef * |logp_t - logp_old_t|

    with ``rho_t = exp(logp_t - logp_old_t)`` (log clamped to [-20, 20]). On a fresh batch
    (``logp_old = sg(logp)``) it is the plain policy gradient. Returns ``(per_token [N, T], stats)``
    like the policy losses, ``clip_fraction`` 0 (nothing is clipped)."""
    mask = mask.bool()
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    adv = _token_advantages(advantages, mask, ratio.dtype)
    zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    penalty = torch.where(selected.bool() & mask, coef * log_ratio.abs(), zero)
    per_token = torch.where(mask, -adv * ratio + penalty, zero)
    return per_token, _ratio_stats(ratio, mask, torch.zeros_like(mask))


def apply_cov_penalty(
    mode: str,
    per_token: Tensor,
    stats: dict[str, Tensor],
    *,
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    selected: Tensor,
    kl_coef: float = 1.0,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy loss ``(per_token, stats)`` with the covariance regulariser ``mode`` applied on
    the ``selected`` tokens (:func:`covariance_token_selection`):

    - "clip_cov": the selected tokens keep their loss value and lose their gradient.
    - "kl_cov": the loss becomes :func:`kl_cov_loss` (the ratio clip is replaced, as in the paper
      and its authors' code, not stacked under the penalty).
    - "none": unchanged.
    """
    if mode == "none":
        return per_token, stats
    sel = selected.bool() & mask.bool()
    if mode == "clip_cov":
        return torch.where(sel, per_token.detach(), per_token), stats
    if mode == "kl_cov":
        return kl_cov_loss(logprobs, old_logprobs, advantages, mask, sel, coef=kl_coef)
    raise ValueError(f"unknown covariance penalty {mode!r}; expected one of {COV_PENALTIES}")
