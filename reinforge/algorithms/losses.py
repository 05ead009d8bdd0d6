"""Per-token policy losses and KL penalties.

Shapes follow ``reinforge.batch``: N completions, T completion tokens (right-padded), masks bool
with True on real tokens. Every function returns a per-token tensor [N, T] that is exactly 0 on
padding, whatever garbage (even ±inf or NaN) the padded positions of its inputs hold, in the
forward pass and in the gradients; turning it into a scalar is ``aggregation.aggregate_loss``'s job.
Masks may have holes (an action mask: tokens the model did not write are False); everything here
is per token or sums over the mask, so holes are simply not trained on.

Policy losses are registered by their ``algorithm.policy_loss`` name with ``register_policy_loss``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reinforge.algorithms.registry import Needs, Registry

__all__ = [
    "register_policy_loss",
    "clipped_surrogate_loss",
    "gspo_loss",
    "cispo_loss",
    "reinforce_loss",
    "gpg_loss",
    "policy_loss",
    "policy_loss_options",
    "POLICY_LOSSES",
    "value_loss",
    "kl_penalty",
    "KL_ESTIMATORS",
    "entropy_from_logits",
    "truncated_importance_weights",
    "K3_MAX",
]

# exp(20) ~ 4.9e8: far beyond any ratio a clipped objective lets through, far below overflow.
_LOG_RATIO_CLAMP = 20.0
# GSPO's sequence log-ratio is bounded above at 10 (e^10 ~ 2.2e4), as verl does; see gspo_loss.
_GSPO_LOG_RATIO_MAX = 10.0
#: The k3 KL estimate is clamped to at most this (zero gradient beyond), as common practice does
#: (e.g. verl's low_var_kl): one token far below the reference must not dominate the loss.
K3_MAX = 10.0

KL_ESTIMATORS = ("k1", "k2", "k3", "k3+", "abs")

#: Every policy loss, by its ``algorithm.policy_loss`` name; add one with ``register_policy_loss``.
POLICY_LOSSES = Registry("policy loss", "algorithm.policy_loss")


#: Losses whose every token's value and gradient is exactly 0 where its advantage is 0.
_ADVANTAGE_WEIGHTED: set[str] = set()
#: The extra keyword options each loss takes, by loss name (read from ``algorithm`` by that name).
_OPTIONS: dict[str, tuple[str, ...]] = {}


def register_policy_loss(
    name: str, *, needs: Needs = Needs(), advantage_weighted: bool = False, options: tuple[str, ...] = ()
):
    """Decorator: register a per-token policy loss as ``algorithm.policy_loss=name``. Signature
    ``(logprobs, old_logprobs, advantages, mask, *, clip_eps_low, clip_eps_high, dual_clip,
    **options) -> (per_token [N, T], 0 off the mask, {"clip_fraction", "ratio_mean",
    "ratio_max"})``; ``needs`` declares what it needs beyond the batch (see ``Needs``).
    ``advantage_weighted``: a row whose advantages are all 0 contributes exactly 0 to the loss and
    its gradient, and a row's loss reads no other row, which lets the learner leave such rows out
    of the update (``learner.skip_zero_advantage``). ``options``: names of further keyword
    arguments the loss takes, each an ``algorithm`` config key of the same name
    (:func:`policy_loss_options` reads them)."""
    register = POLICY_LOSSES.register(name, needs=needs)

    def add(fn):
        register(fn)
        if advantage_weighted:
            _ADVANTAGE_WEIGHTED.add(name)
        else:
            _ADVANTAGE_WEIGHTED.discard(name)
        _OPTIONS[name] = tuple(options)
        return fn

    return add


def policy_loss_options(name: str, algo) -> dict:
    """The keyword arguments the loss ``name`` is called with, from an ``AlgorithmConfig`` (read by
    attribute): the clip ranges and dual clip every loss takes, plus the options it registered."""
    opts = dict(clip_eps_low=algo.clip_eps_low, clip_eps_high=algo.clip_eps_high, dual_clip=algo.dual_clip)
    for key in _OPTIONS.get(POLICY_LOSSES.check(name), ()):
        opts[key] = getattr(algo, key)
    return opts


def is_advantage_weighted(name: str) -> bool:
    """Whether the policy loss ``name`` was registered as advantage-weighted."""
    return name in _ADVANTAGE_WEIGHTED


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


@register_policy_loss("clipped", advantage_weighted=True)
def clipped_surrogate_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's clipped surrogate objective, per token, as a loss to minimise.

    "Proximal Policy Optimization Algorithms", Schulman et al., 2017, arXiv:1707.06347, with the
    decoupled ("clip-higher") range of "DAPO: An Open-Source LLM Reinforcement Learning System
    at Scale", Yu et al., 2025, arXiv:2503.14476::

        ratio_t = exp(logp_t - logp_old_t)
        loss_t  = -min(ratio_t * A_t, clip(ratio_t, 1 - eps_low, 1 + eps_high) * A_t)

    The log-ratio is clamped to [-20, 20] before ``exp``, and set to 0 on padding.

    Dual clip ("Mastering Complex Control in MOBA Games with Deep Reinforcement Learning", Ye et
    al., 2020, arXiv:1912.09729), ``dual_clip=c > 1``: for negative advantages the loss is capped
    at ``-c * A_t``, so a token whose ratio has exploded cannot dominate the update::

        loss_t = min(loss_t, -c * A_t)   where A_t < 0

    Args:
        logprobs: [N, T] log-probs of the sampled tokens under the policy being trained (grad).
        old_logprobs: [N, T] log-probs under the policy that generated the batch (no grad needed).
        advantages: [N] (one per completion, broadcast over its tokens) or [N, T].
        mask: [N, T] bool, True on real completion tokens.
        clip_eps_low, clip_eps_high: the ratio is clipped to [1 - eps_low, 1 + eps_high].
        dual_clip: the constant c (> 1) of dual clipping, or None.

    Returns:
        ``(per_token_loss [N, T], stats)``; the loss is 0 on padding. ``stats`` holds detached
        scalars over real tokens (0 when there are none): ``clip_fraction`` (share of tokens where
        the clipped branch is the smaller one, i.e. clipping changed the objective and the token
        gets no gradient), ``ratio_mean`` and ``ratio_max``.
    """
    mask = mask.bool()
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
    ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    adv = _token_advantages(advantages, mask, ratio.dtype)
    zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)
    per_token = torch.where(mask, loss, zero)
    return per_token, _ratio_stats(ratio, mask, clipped < unclipped)


def _token_advantages(advantages: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """[N] or [N, T] advantages as [N, T] in ``dtype``, 0 on padding."""
    if advantages.dim() == 1:
        if advantages.shape[0] != mask.shape[0]:
            raise ValueError(f"advantages {tuple(advantages.shape)} vs mask {tuple(mask.shape)}")
        advantages = advantages.unsqueeze(1).expand_as(mask)
    elif advantages.shape != mask.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} vs mask {tuple(mask.shape)}")
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return torch.where(mask.bool(), advantages.to(dtype), zero)


def _ratio_stats(ratio: Tensor, mask: Tensor, clipped: Tensor) -> dict[str, Tensor]:
    with torch.no_grad():
        n = mask.sum()
        zero = torch.zeros((), dtype=ratio.dtype, device=ratio.device)
        denom = n.clamp_min(1).to(ratio.dtype)
        r = ratio.detach()
        masked_max = torch.where(mask, r, torch.full_like(r, -torch.inf)).amax() if n > 0 else zero
        return {
            "clip_fraction": (clipped & mask).sum().to(ratio.dtype) / denom,
            "ratio_mean": torch.where(mask, r, zero).sum() / denom,
            "ratio_max": masked_max.clone(),
        }


@register_policy_loss("gspo", advantage_weighted=True)
def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 3e-4,
    clip_eps_high: float = 4e-4,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: one importance ratio per sequence, the geometric mean of its token ratios.

    "Group Sequence Policy Optimization", Zheng et al., 2025, arXiv:2507.18071, in its
    GSPO-token form (identical to GSPO for sequence-level advantages)::

        s_i    = exp( mean_t (logp_t - logp_old_t) )                 over sequence i's real tokens
        s_i,t  = sg(s_i) * exp(logp_t - sg(logp_t))                  value s_i, gradient s_i * grad logp_t
        loss_t = -min(s_i,t * A_i,t, clip(s_i,t, 1 - eps_low, 1 + eps_high) * A_i,t)

    Aggregated with ``seq_mean_token_mean`` this is GSPO's objective, whose gradient is
    ``-(1/G) sum_i s_i A_i mean_t grad logp_t`` for unclipped sequences. Clipping removes whole
    sequences, not tokens. The paper's ranges are 3e-4 and 4e-4 (the ratio is length-normalised).
    ``dual_clip`` is not used. Returns ``(per_token [N, T], stats)`` as :func:`clipped_surrogate_loss`.

    The log of ``s_i,t`` is clamped to at most 10, value and gradient, as verl does (the paper
    sets no bound). With a negative advantage the PPO clip does not bound the loss from above: a
    sequence whose mean token log-ratio is 15 would weigh ``e^15 ~ 3.3e6`` and, after gradient-norm
    clipping, be the whole update. Beyond ``e^10 ~ 2.2e4`` a length-normalised ratio means the
    sequence is so far off-policy that its gradient is noise, so it keeps the bounded value
    ``e^10 |A|`` and gets no gradient. (Before, the bound was 20 on both sides; the lower side
    needs none: a tiny ratio only shrinks the term.)
    """
    mask = mask.bool()
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask)
    lengths = mask.sum(dim=1).clamp_min(1).to(log_ratio.dtype)
    seq_log_ratio = log_ratio.sum(dim=1) / lengths
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    lp = torch.where(mask, logprobs, zero)
    # The whole log-ratio is clamped, not only its detached part: beyond the bound the value stays
    # at exp(10) AND the gradient is 0.
    token_log_ratio = (seq_log_ratio.detach()[:, None] + lp - lp.detach()).clamp(max=_GSPO_LOG_RATIO_MAX)
    ratio = torch.exp(token_log_ratio)
    adv = _token_advantages(advantages, mask, ratio.dtype)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_eps_low, 1.0 + clip_eps_high) * adv
    per_token = torch.where(mask, -torch.minimum(unclipped, clipped), zero)
    return per_token, _ratio_stats(ratio, mask, clipped < unclipped)


@register_policy_loss("cispo", advantage_weighted=True)
def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 1.0,
    clip_eps_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """CISPO: clip the importance weight, not the update, and keep every token's gradient.

    "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning Attention", MiniMax, 2025,
    arXiv:2506.13585::

        w_t    = sg( clip(exp(logp_t - logp_old_t), 1 - eps_low, 1 + eps_high) )
        loss_t = -w_t * A_t * logp_t                 gradient: -w_t * A_t * grad logp_t

    Unlike the clipped surrogate, a token whose ratio leaves the range still gets a gradient
    (scaled by the clipped weight), so rare "fork" tokens are not silenced. The paper imposes no
    lower bound (``eps_low = 1``: weights clipped at 0) and tunes only ``eps_high``.
    ``clip_fraction`` counts tokens whose weight was clipped. ``dual_clip`` is not used.
    """
    mask = mask.bool()
    log_ratio = _masked_log_ratio(logprobs, old_logprobs, mask).detach()
    ratio = torch.exp(log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    weight = torch.clamp(ratio, max(0.0, 1.0 - clip_eps_low), 1.0 + clip_eps_high)
    adv = _token_advantages(advantages, mask, logprobs.dtype)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    lp = torch.where(mask, logprobs, zero)
    per_token = torch.where(mask, -weight * adv * lp, zero)
    return per_token, _ratio_stats(ratio, mask, weight != ratio)


@register_policy_loss("reinforce", advantage_weighted=True)
def reinforce_loss(
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.0,
    clip_eps_high: float = 0.0,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Plain REINFORCE, no importance ratio ("Simple statistical gradient-following algorithms
    for connectionist reinforcement learning", Williams, 1992)::

        loss_t = -A_t * logp_t                        gradient: -A_t * grad logp_t

    Exact only on fresh samples (one epoch, one mini-batch); ``old_logprobs`` and the clip ranges
    are ignored. Used by RLOO and ReMax.
    """
    mask = mask.bool()
    adv = _token_advantages(advantages, mask, logprobs.dtype)
    zero = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    per_token = torch.where(mask, -adv * torch.where(mask, logprobs, zero), zero)
    one = torch.ones((), dtype=logprobs.dtype, device=logprobs.device)
    return per_token, {"clip_fraction": zero.detach().clone(), "ratio_mean": one, "ratio_max": one.clone()}


@register_policy_loss("gpg", advantage_weighted=True)
def gpg_loss(
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps_low: float = 0.0,
    clip_eps_high: float = 0.0,
    dual_clip: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GPG's loss: the policy gradient itself, no surrogate, no ratio, no clip.

    "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning", Chu et al.,
    2025, arXiv:2504.02546 (verl's ``gpg``)::

        loss_t = -A_t * logp_t

    The same per-token loss as :func:`reinforce_loss`; GPG's corrections live in its advantage
    (:func:`~reinforge.algorithms.advantages.gpg_advantages`) and its token-mean aggregation.
    Exact only on fresh samples (one update per batch)."""
    return reinforce_loss(logprobs, old_logprobs, advantages, mask)


def policy_loss(name: str, logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, **kw):
    """Dispatch to one of ``POLICY_LOSSES`` by its config name; same arguments and returns."""
    return POLICY_LOSSES.lookup(name)(logprobs, old_logprobs, advantages, mask, **kw)


def value_loss(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip_eps: float | None = 0.2
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO's critic loss with value clipping, per token (Schulman et al., 2017,
    arXiv:1707.06347; clipping as in OpenAI baselines)::

        v_clip = v_old + clip(v - v_old, -eps, eps)
        loss_t = 0.5 * max((v - R)^2, (v_clip - R)^2)

    ``clip_eps=None`` gives the plain squared error. Returns ``(per_token [N, T], stats)`` with
    ``vf_clip_fraction`` (tokens where the clipped branch is the larger).
    """
    mask = mask.bool()
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    err = (values - returns.to(values.dtype)) ** 2
    if clip_eps is None:
        loss = 0.5 * err
        clipped = torch.zeros_like(mask)
    else:
        v_clip = old_values.to(values.dtype) + torch.clamp(values - old_values.to(values.dtype), -clip_eps, clip_eps)
        err_clip = (v_clip - returns.to(values.dtype)) ** 2
        loss = 0.5 * torch.maximum(err, err_clip)
        clipped = err_clip > err
    per_token = torch.where(mask, loss, zero)
    with torch.no_grad():
        denom = mask.sum().clamp_min(1).to(values.dtype)
        stats = {"vf_clip_fraction": (clipped & mask).sum().to(values.dtype) / denom}
    return per_token, stats


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Entropy of each position's next-token distribution, ``[..., V] -> [...]``:
    ``H = logsumexp(l) - sum_v softmax(l)_v * l_v``."""
    logz = torch.logsumexp(logits, dim=-1)
    return logz - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


def truncated_importance_weights(
    learner_logprobs: Tensor, sampler_logprobs: Tensor, mask: Tensor, cap: float
) -> tuple[Tensor, dict[str, float]]:
    """Truncated importance sampling between the generator and the learner.

    The engine that samples (vLLM, or HF generate in another precision) and the learner compute
    slightly different probabilities for the same tokens, so "on-policy" samples are off-policy.
    "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", Yao et al., 2025
    (fengyao.notion.site) corrects this with a detached per-token weight::

        w_t = min( exp(logp_learner_t - logp_sampler_t), cap )

    that multiplies the per-token policy loss. Returns ``(weights [N, T] (1 on padding),
    stats)``: the mismatch's mean and max absolute log-prob difference, the share of tokens whose
    difference exceeds 0.1 nats, and the share of weights truncated.
    """
    if cap <= 0:
        raise ValueError(f"the truncation cap must be > 0, got {cap}")
    mask = mask.bool()
    d = _masked_log_ratio(learner_logprobs.detach().float(), sampler_logprobs.detach().float(), mask)
    ratio = torch.exp(d.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
    weights = torch.where(mask, ratio.clamp(max=cap), torch.ones_like(ratio))
    n = max(int(mask.sum()), 1)
    a = d.abs()
    stats = {
        "logprob_diff_mean": float(a.sum()) / n,
        "logprob_diff_max": float(a.max()) if mask.any() else 0.0,
        "logprob_diff_frac_gt_0.1": float(((a > 0.1) & mask).sum()) / n,
        "tis_truncated_frac": float(((ratio > cap) & mask).sum()) / n,
    }
    return weights, stats


def kl_penalty(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, estimator: str = "k3"
) -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi.

    Estimators of "Approximating KL Divergence", J. Schulman, 2020,
    http://joschu.net/blog/kl-approx.html, with ``d = logp - logp_ref``::

        k1 = d                          unbiased, high variance, can be negative
        k2 = d^2 / 2                    biased, low variance, >= 0
        k3 = exp(-d) - (-d) - 1         unbiased, low variance, >= 0 (GRPO's choice)

    k3 is bounded: the log-ratio is clamped to [-20, 20] so ``exp`` cannot overflow, and the
    estimate to at most ``K3_MAX`` = 10 with zero gradient beyond (common practice, e.g. verl's
    ``low_var_kl``): a token whose reference log-prob is far above its own (d = -4 gives 49.6,
    gradient -53.6) would otherwise dominate the loss.

    Two more, as verl has them::

        abs = |d|                       (verl's ``abs``)
        k3+ = value of k3, gradient of k2: d * grad logp      (straight-through)

    k3+ (verl's ``k3+``): k1 and k3 are unbiased estimates of the KL's value but their expected
    gradients are not the KL's gradient; k2's is (for samples from pi, E[d grad logp] = grad
    KL(pi || pi_ref)). So k3+ reports k3 (clamped as above) and differentiates as k2, with the
    gradient ``d`` unclamped, as verl's straight-through does.

    Args:
        logprobs: [N, T] log-probs under the policy being trained.
        ref_logprobs: [N, T] log-probs under the reference policy.
        mask: [N, T] bool, True on real tokens.
        estimator: "k1", "k2", "k3", "k3+" or "abs".

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
    if estimator == "abs":
        return d.abs()
    neg = (-d).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)  # log(pi_ref / pi)
    k3 = (torch.exp(neg) - neg - 1.0).clamp(max=K3_MAX)
    if estimator == "k3+":
        k2 = 0.5 * d * d
        return k2 - k2.detach() + k3.detach()
    return k3
