"""The math of the advantage estimators: rewards of completions in, advantages out.

Shapes follow ``reinforge.batch``: N completions (trajectories), T completion tokens
(right-padded), ``mask`` [N, T] bool: the ACTION mask, True on the tokens the model wrote and is
trained on. It need not be a contiguous prefix: tokens the model did not write (tool output,
environment messages) are holes in it, and every estimator skips them (a hole carries no reward,
no value and no discount step, and returns flow across it). ``group_index`` [N] says which prompt
each completion answers. Sequence-level estimators return [N] (one advantage per completion,
broadcast over its tokens); token-level ones (REINFORCE++, GAE) return [N, T], 0 off the mask.
Pure tensor functions, no models and no I/O.

The estimators registered by name (``algorithm.advantage``), ``AdvantageInputs`` and
``compute_advantages`` are in :mod:`reinforge.algorithms.estimators`, which wraps these functions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "SCALE_MODES",
    "scale_mode",
    "group_normalized_advantages",
    "leave_one_out_advantages",
    "greedy_baseline_advantages",
    "reinforce_pp_advantages",
    "gae_advantages",
    "passk_advantages",
    "token_level_rewards",
    "masked_whiten",
    "informative_groups",
    "optimal_baseline_advantages",
    "gpg_advantages",
]

SCALE_MODES = ("group", "batch", "none")


def scale_mode(value: str | bool) -> str:
    """The reward-scaling mode of ``algorithm.scale_rewards``: "group", "batch" or "none";
    ``True``/``False`` mean "group"/"none" (the config and the estimators both read it here)."""
    if isinstance(value, bool):
        return "group" if value else "none"
    if value not in SCALE_MODES:
        raise ValueError(f"unknown scale mode {value!r}; expected one of {SCALE_MODES} (or true/false)")
    return value


def _check_1d(rewards: Tensor, group_index: Tensor) -> None:
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_index must both be [N]; got {tuple(rewards.shape)} and "
            f"{tuple(group_index.shape)}"
        )


def _out_dtype(rewards: Tensor) -> torch.dtype:
    return rewards.dtype if rewards.is_floating_point() else torch.float32


def _group_stats(r: Tensor, group_index: Tensor):
    """``(g, count, total, informative)`` for float64 rewards ``r``: ``g`` maps group ids to
    0..G-1; a group is informative when it has more than one sample and its rewards differ."""
    _, g = torch.unique(group_index, return_inverse=True)
    num_groups = int(g.max()) + 1
    count = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(0, g, torch.ones_like(r))
    total = torch.zeros_like(count).index_add_(0, g, r)
    gmax = torch.full_like(count, -torch.inf).scatter_reduce(0, g, r, reduce="amax")
    gmin = torch.full_like(count, torch.inf).scatter_reduce(0, g, r, reduce="amin")
    return g, count, total, (count > 1) & (gmax > gmin)


def _scale_by_std(adv: Tensor, r: Tensor, g: Tensor, count: Tensor, mode: str | bool, eps: float) -> Tensor:
    """Divide by the unbiased std of the raw rewards in each group ("group"), in the whole batch
    ("batch"), or not at all ("none"). ``True``/``False`` mean "group"/"none"."""
    mode = scale_mode(mode)
    if mode == "none":
        return adv
    if mode == "group":
        mean = torch.zeros_like(count).index_add_(0, g, r) / count
        c = r - mean[g]
        var = torch.zeros_like(count).index_add_(0, g, c * c) / (count - 1).clamp_min(1)
        return adv / (var.sqrt()[g] + eps)
    # "batch"
    std = r.std() if r.numel() > 1 else torch.zeros((), dtype=r.dtype, device=r.device)
    return adv / (std + eps)


def informative_groups(rewards: Tensor, group_index: Tensor) -> Tensor:
    """[G] bool over the sorted distinct group ids: True where a group's rewards are not all
    equal. DAPO's dynamic sampling keeps only these ("DAPO: An Open-Source LLM Reinforcement
    Learning System at Scale", Yu et al., 2025, arXiv:2503.14476): a group whose rewards are all
    equal (or that has a single sample) has zero group-relative advantage and only dilutes the
    batch."""
    _check_1d(rewards, group_index)
    if rewards.numel() == 0:
        return torch.zeros(0, dtype=torch.bool, device=rewards.device)
    return _group_stats(rewards.detach().to(torch.float64), group_index)[3]


def group_normalized_advantages(
    rewards: Tensor, group_index: Tensor, *, scale: bool | str = True, eps: float = 1e-6
) -> Tensor:
    """Group-relative advantages: each reward compared with the other samples of its prompt.

    GRPO ("DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
    Shao et al., 2024, arXiv:2402.03300), ``scale="group"`` (or ``True``)::

        A_i = (r_i - mean_g) / (std_g + eps)

    Dr. GRPO ("Understanding R1-Zero-Like Training: A Critical Perspective", Liu et al., 2025,
    arXiv:2503.20783) drops the std division, which biases updates towards too-easy and
    too-hard prompts; ``scale="none"`` (or ``False``)::

        A_i = r_i - mean_g

    Lite PPO ("Tricks or Traps? A Deep Dive into RL for LLM Reasoning", Liu et al., 2025,
    arXiv:2508.08221): group mean, batch std; ``scale="batch"``::

        A_i = (r_i - mean_g) / (std_batch + eps)

    ``mean_g`` and ``std_g`` are taken over the completions sharing ``i``'s group, ``std_batch``
    over all rewards of the batch; stds are unbiased (divisor n - 1), as in TRL and verl.

    Args:
        rewards: [N] float, one scalar reward per completion.
        group_index: [N] long, group id of each completion. Ids need not be contiguous or sorted
            and groups may have different sizes.
        scale: "group", "batch" or "none" (True/False mean "group"/"none").
        eps: added to the std before dividing.

    Returns:
        [N] advantages, in ``rewards``' dtype (float32 for integer rewards). A group of one sample,
        or whose rewards are all equal, carries no signal: its advantages are exactly 0.
        Computed without a Python loop over groups.

    Singleton groups (a deliberate departure from verl, whose GRPO gives a lone sample its raw
    score, mean 0 and std 1): a sample with no sibling has no baseline to be compared with. Its raw
    reward is neither centred (a constant reward would push up whatever was sampled) nor on the
    scale of the other groups' normalised advantages, so it gets 0, like a group whose rewards are
    all equal. The same holds for every group-relative estimator here (rloo, reinforce_pp_baseline,
    opo, gpg), so they agree with each other, which verl's own variants do not.
    """
    _check_1d(rewards, group_index)
    out_dtype = _out_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros_like(rewards, dtype=out_dtype)
    # Float64 for the statistics: group sums of many rewards stay exact enough.
    r = rewards.detach().to(torch.float64)
    g, count, total, informative = _group_stats(r, group_index)
    adv = _scale_by_std(r - (total / count)[g], r, g, count, scale, eps)
    # Uninformative groups get exactly 0 (the centred value could be a rounding residue like
    # 1e-17, blown up by the std division).
    return torch.where(informative[g], adv, torch.zeros_like(adv)).to(out_dtype)


def leave_one_out_advantages(
    rewards: Tensor, group_index: Tensor, *, scale: bool | str = "none", eps: float = 1e-6
) -> Tensor:
    """RLOO: each sample's baseline is the mean reward of the OTHER samples of its prompt.

    "Back to Basics: Revisiting REINFORCE Style Optimization for Learning from Human Feedback in
    LLMs", Ahmadian et al., 2024, arXiv:2402.14740 (after Kool et al., 2019)::

        A_i = r_i - (sum_g - r_i) / (n_g - 1)  =  n_g / (n_g - 1) * (r_i - mean_g)

    The baseline does not depend on ``r_i``, so the estimate stays unbiased. ``scale`` as in
    :func:`group_normalized_advantages` (RLOO itself uses "none"). Groups of one sample (whose
    leave-one-out baseline is undefined) or with all-equal rewards get exactly 0.
    """
    _check_1d(rewards, group_index)
    out_dtype = _out_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros_like(rewards, dtype=out_dtype)
    r = rewards.detach().to(torch.float64)
    g, count, total, informative = _group_stats(r, group_index)
    baseline = (total[g] - r) / (count[g] - 1).clamp_min(1)
    adv = _scale_by_std(r - baseline, r, g, count, scale, eps)
    return torch.where(informative[g], adv, torch.zeros_like(adv)).to(out_dtype)


def greedy_baseline_advantages(rewards: Tensor, group_index: Tensor, baseline_rewards: Tensor) -> Tensor:
    """ReMax: the baseline of a prompt is the reward of its greedy completion.

    "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning Large
    Language Models", Li et al., 2023, arXiv:2310.10505::

        A_i = r_i - r(greedy completion of prompt g_i)

    Args:
        rewards: [N] rewards of the sampled completions.
        group_index: [N] prompt index of each completion, in 0..P-1.
        baseline_rewards: [P] reward of each prompt's greedy completion.
    """
    _check_1d(rewards, group_index)
    if baseline_rewards.dim() != 1 or (group_index.numel() and int(group_index.max()) >= len(baseline_rewards)):
        raise ValueError(
            f"baseline_rewards must be [P] with one greedy reward per prompt index in group_index; "
            f"got {tuple(baseline_rewards.shape)}"
        )
    out = rewards.detach().to(torch.float64) - baseline_rewards.detach().to(torch.float64)[group_index]
    return out.to(_out_dtype(rewards))



def optimal_baseline_advantages(
    rewards: Tensor, group_index: Tensor, lengths: Tensor, *, scale: bool | str = "none", eps: float = 1e-6
) -> Tensor:
    """OPO: the reward minus the length-weighted mean reward of the group.

    "On-Policy RL with Optimal Reward Baseline", Hao et al., 2025, arXiv:2505.23585. The baseline
    that minimises the policy gradient's variance, under the paper's assumption that a
    completion's gradient norm grows with its length ``l_i`` (its number of action tokens)::

        b_g = sum_{j in g} l_j r_j / sum_{j in g} l_j
        A_i = r_i - b_g

    The paper does not divide by a std (``scale="none"``); ``scale`` is applied as in
    :func:`group_normalized_advantages` if asked for. Groups of one sample or with all-equal
    rewards get exactly 0 (verl gives a lone sample its raw reward, see
    :func:`group_normalized_advantages`).

    Args:
        rewards: [N] rewards. group_index: [N] group ids.
        lengths: [N] number of action tokens of each completion (a row with none weighs 0).
    """
    _check_1d(rewards, group_index)
    if lengths.shape != rewards.shape:
        raise ValueError(f"lengths must be [N] like rewards; got {tuple(lengths.shape)}")
    out_dtype = _out_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros_like(rewards, dtype=out_dtype)
    r = rewards.detach().to(torch.float64)
    w = lengths.detach().to(torch.float64)
    g, count, _, informative = _group_stats(r, group_index)
    weighted = torch.zeros_like(count).index_add_(0, g, w * r)
    total_w = torch.zeros_like(count).index_add_(0, g, w)
    # a group whose completions have no action token at all falls back to the plain mean
    plain = torch.zeros_like(count).index_add_(0, g, r) / count
    baseline = torch.where(total_w > 0, weighted / total_w.clamp_min(1e-300), plain)
    adv = _scale_by_std(r - baseline[g], r, g, count, scale, eps)
    return torch.where(informative[g], adv, torch.zeros_like(adv)).to(out_dtype)


def gpg_advantages(
    rewards: Tensor, group_index: Tensor, *, scale: bool | str = "none", eps: float = 1e-6
) -> Tensor:
    """GPG: group-mean baseline, rescaled for the samples that carry no gradient.

    "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning", Chu et al.,
    2025, arXiv:2504.02546. With N samples in the batch, of which N_valid belong to groups whose
    rewards differ (the others have advantage 0 and add nothing but the denominator of a
    token-mean loss)::

        alpha = N / N_valid                    (the paper's B / (B - M))
        A_i   = alpha * (r_i - mean_g) / F_norm

    ``F_norm`` is 1 in the paper's main setting (``scale="none"``); ``scale="group"`` divides by
    the group std, its other variant. ``alpha`` corrects the gradient's scale when many groups
    are uninformative, as the authors' code does (there: per group, the same for equal group
    sizes). verl computes ``alpha = N / count_nonzero(rewards)`` instead, the share of samples
    with a non-zero reward, which is a different quantity (a batch of informative groups with
    binary rewards, half of them 0, gets 2 from verl and 1 from the paper); we follow the paper.
    Groups of one sample or with all-equal rewards get exactly 0, and a batch without an
    informative group gets 0 everywhere.
    """
    _check_1d(rewards, group_index)
    out_dtype = _out_dtype(rewards)
    if rewards.numel() == 0:
        return torch.zeros_like(rewards, dtype=out_dtype)
    r = rewards.detach().to(torch.float64)
    g, count, total, informative = _group_stats(r, group_index)
    valid = informative[g]
    alpha = r.numel() / max(int(valid.sum()), 1)
    adv = alpha * _scale_by_std(r - (total / count)[g], r, g, count, scale, eps)
    return torch.where(valid, adv, torch.zeros_like(adv)).to(out_dtype)


def masked_whiten(values: Tensor, mask: Tensor, *, eps: float = 1e-8, shift_mean: bool = True) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` over the real tokens of the whole batch (unbiased var);
    0 on padding. The global ("batch") normalisation of REINFORCE++ and of PPO's advantages.

    ``shift_mean=False`` whitens and adds the mean back, ``(x - mean) / sqrt(var + eps) + mean``:
    the spread is normalised and the mean kept (verl's ``masked_whiten`` means the same; for
    [1, 3, 5]: [2, 3, 4]).

    Computed in float64 whatever ``values``' dtype, and returned in that dtype. ``eps`` sits under
    the square root, so when every value is the same (all completions got the same reward) the
    rounding residue of ``x - mean`` (~1e-17) is divided by at least ``sqrt(eps)``, not by a std of
    the same ~1e-17, and the result is ~0 instead of O(1) noise."""
    mask = mask.bool()
    x = values.to(torch.float64)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    n = mask.sum()
    if n == 0:
        return torch.where(mask, x, zero).to(values.dtype)
    mean = torch.where(mask, x, zero).sum() / n
    var = (torch.where(mask, x - mean, zero) ** 2).sum() / (n - 1).clamp_min(1)
    whitened = (x - mean) / torch.sqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(mask, whitened, zero).to(values.dtype)


def _last_action_index(mask: Tensor) -> Tensor:
    """[N] index of each row's last True in ``mask`` (-1 for a row without one); the mask may
    have holes, so this is not ``mask.sum(1) - 1``."""
    if mask.shape[1] == 0:
        return torch.full((mask.shape[0],), -1, dtype=torch.long, device=mask.device)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask, positions, torch.full_like(positions, -1)).amax(dim=1)


def token_level_rewards(
    rewards: Tensor,
    mask: Tensor,
    token_kl: Tensor | None = None,
    kl_coef: float = 0.0,
    token_rewards: Tensor | None = None,
) -> Tensor:
    """Per-token rewards [N, T]: the outcome reward on each completion's last action token, plus
    the reward side's per-token rewards ``token_rewards`` (process or step rewards) when given,
    minus ``kl_coef`` x the per-token KL estimate when the KL penalty goes into the reward (as in
    "Training language models to follow instructions with human feedback", Ouyang et al., 2022,
    arXiv:2203.02155, and REINFORCE++). 0 off the action mask."""
    mask = mask.bool()
    if rewards.dim() != 1 or mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"rewards [N] and mask [N, T] expected; got {tuple(rewards.shape)}, {tuple(mask.shape)}")
    dtype = _out_dtype(rewards)
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    last = _last_action_index(mask)
    has = last >= 0
    rows = torch.arange(mask.shape[0], device=mask.device)
    out[rows[has], last[has]] = rewards[has].to(dtype)
    if token_rewards is not None:
        out = out + torch.where(mask, token_rewards.to(dtype), zero)
    if token_kl is not None and kl_coef:
        out = out - kl_coef * torch.where(mask, token_kl.to(dtype), zero)
    return out


def _returns_to_go(token_rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    # Off the action mask (holes and padding) the running sum is carried unchanged: a hole is not
    # an action, so it is neither rewarded nor discounted.
    zero = torch.zeros((), dtype=token_rewards.dtype, device=token_rewards.device)
    r = torch.where(mask, token_rewards, zero)
    out = torch.zeros_like(r)
    running = torch.zeros(r.shape[0], dtype=r.dtype, device=r.device)
    for t in range(r.shape[1] - 1, -1, -1):
        running = torch.where(mask[:, t], r[:, t] + gamma * running, running)
        out[:, t] = running
    return torch.where(mask, out, zero)


def reinforce_pp_advantages(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    gamma: float = 1.0,
    group_index: Tensor | None = None,
    eps: float = 1e-8,
) -> Tensor:
    """REINFORCE++: returns with global batch normalisation instead of a critic or group std.

    "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models", Hu et al.,
    2025, arXiv:2501.03262. Without ``group_index``: the return-to-go of each action token
    ``G_t = sum_{s>=t} gamma^(s-t) r_s`` over the action tokens (``token_rewards`` hold the
    outcome on the last one, any per-token rewards and any per-token KL penalty), whitened over
    all action tokens of the batch::

        A_t = (G_t - mean_batch(G)) / sqrt(var_batch(G) + eps)

    With ``group_index`` (the "REINFORCE++-baseline" variant for several samples per prompt): the
    sequence return ``sum_t r_t`` minus its group mean, broadcast to every action token, then
    whitened over all action tokens of the batch.

    Returns [N, T], 0 off the action mask.
    """
    mask = mask.bool()
    if token_rewards.shape != mask.shape:
        raise ValueError(f"token_rewards {tuple(token_rewards.shape)} and mask {tuple(mask.shape)} differ")
    x = token_rewards.detach().to(torch.float64)
    if group_index is None:
        returns = _returns_to_go(x, mask, gamma)
    else:
        score = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device)).sum(dim=1)
        _check_1d(score, group_index)
        g, count, total, _ = _group_stats(score, group_index)
        returns = (score - (total / count)[g])[:, None].expand_as(x)
    return masked_whiten(returns, mask, eps=eps).to(_out_dtype(token_rewards))


def _gae64(token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """``gae_advantages`` in float64, before the cast back (whitening happens in float64 too)."""
    mask = mask.bool()
    if token_rewards.shape != mask.shape or values.shape != mask.shape:
        raise ValueError(
            f"token_rewards {tuple(token_rewards.shape)}, values {tuple(values.shape)} and mask "
            f"{tuple(mask.shape)} must match"
        )
    dtype = torch.float64
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    r = torch.where(mask, token_rewards.detach().to(dtype), zero)
    v = torch.where(mask, values.detach().to(dtype), zero)
    n, t_len = mask.shape
    adv = torch.zeros((n, t_len), dtype=dtype, device=mask.device)
    running = torch.zeros(n, dtype=dtype, device=mask.device)
    next_v = torch.zeros(n, dtype=dtype, device=mask.device)  # V = 0 after the last action token
    for t in range(t_len - 1, -1, -1):
        m = mask[:, t]
        delta = r[:, t] + gamma * next_v - v[:, t]
        # Off the action mask nothing changes: padding keeps the zero start, and across a hole the
        # next action token's value and advantage flow back to the action before it.
        running = torch.where(m, delta + gamma * lam * running, running)
        adv[:, t] = torch.where(m, running, zero)
        next_v = torch.where(m, v[:, t], next_v)
    return adv, torch.where(mask, adv + v, zero)


def gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation with a learned value model.

    "High-Dimensional Continuous Control Using Generalized Advantage Estimation", Schulman et al.,
    2015, arXiv:1506.02438; used with PPO ("Proximal Policy Optimization Algorithms", Schulman et
    al., 2017, arXiv:1707.06347). Over the action tokens t, t' = the next action token after t,
    with ``V = 0`` after the last one::

        delta_t = r_t + gamma * V_{t'} - V_t
        A_t     = delta_t + gamma * lam * A_{t'}
        R_t     = A_t + V_t            (the critic's regression target)

    Args:
        token_rewards: [N, T], see :func:`token_level_rewards`.
        values: [N, T] critic values V(s_t) of the state before each completion token.
        mask: [N, T] bool action mask (holes allowed: they are skipped).

    Returns:
        ``(advantages [N, T], returns [N, T])``, both 0 off the mask, not yet whitened.
    """
    adv, returns = _gae64(token_rewards, values, mask, gamma, lam)
    out = _out_dtype(token_rewards)
    return adv.to(out), returns.to(out)


def passk_advantages(correct: Tensor, group_index: Tensor, k: int, *, eps: float = 1e-6) -> Tensor:
    """Advantages of the pass@k objective, in closed form.

    "Pass@k Training for Adaptively Balancing Exploration and Exploitation of Large Reasoning
    Models", Chen et al., 2025, arXiv:2508.10751. The reward of a k-subset of a group is 1 when
    any of its samples is correct. With n samples of which n_neg are wrong::

        R_mean = 1 - C(n_neg, k) / C(n, k)                (pass@k of the group)
        std    = sqrt(R_mean * (1 - R_mean))
        A_pos  = (1 - R_mean) / std
        A_neg  = (1 - R_mean - C(n_neg - 1, k - 1) / C(n - 1, k - 1)) / std

    A correct sample's k-subsets all pass; a wrong one's pass unless the k-1 others are wrong
    too. This equals averaging ``(subset reward - R_mean) / std`` over every k-subset that holds
    the sample, without enumerating them. With k=1 it is GRPO with the population std.

    Args:
        correct: [N] bool or 0/1 float, whether each sample is correct.
        group_index: [N] group id of each sample.
        k: subset size; every group must have at least k samples.

    Returns:
        [N] float32. Groups with no signal (R_mean of 0 or 1) get exactly 0.
    """
    _check_1d(correct, group_index)
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got {k}")
    c = correct.detach().to(torch.float64)
    if not torch.all((c == 0) | (c == 1)):
        raise ValueError("passk_advantages needs binary correctness (0/1) per sample")
    out = torch.zeros(c.shape, dtype=torch.float32, device=c.device)
    if c.numel() == 0:
        return out
    _, g = torch.unique(group_index, return_inverse=True)
    for gi in range(int(g.max()) + 1):
        rows = (g == gi).nonzero().squeeze(1)
        n = len(rows)
        if n < k:
            raise ValueError(
                f"pass@{k} advantages need at least k={k} samples per prompt, a group has {n}: "
                f"raise rollout.num_samples or lower algorithm.passk_k"
            )
        n_neg = int((c[rows] == 0).sum())
        mean = 1.0 - math.comb(n_neg, k) / math.comb(n, k)
        std = math.sqrt(mean * (1.0 - mean))
        if std == 0.0:
            continue
        a_pos = (1.0 - mean) / (std + eps)
        a_neg = (1.0 - mean - math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1)) / (std + eps) if n_neg else 0.0
        out[rows] = torch.where(c[rows] == 1, a_pos, a_neg).float()
    return out
