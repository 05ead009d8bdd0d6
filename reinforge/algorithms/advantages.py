"""Advantage estimators: rewards of completions in, one advantage per completion out.

Shapes follow ``reinforge.batch``: N completions; ``group_index`` [N] says which prompt each
completion answers. Pure tensor functions, no models and no I/O.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["group_normalized_advantages"]


def group_normalized_advantages(
    rewards: Tensor, group_index: Tensor, *, scale: bool = True, eps: float = 1e-6
) -> Tensor:
    """Group-relative advantages: each reward compared with the other samples of its prompt.

    GRPO ("DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models",
    Shao et al., 2024, arXiv:2402.03300), ``scale=True``::

        A_i = (r_i - mean_g) / (std_g + eps)

    Dr. GRPO ("Understanding R1-Zero-Like Training: A Critical Perspective", Liu et al., 2025,
    arXiv:2503.20783) drops the std division, which biases updates towards too-easy and
    too-hard prompts; ``scale=False``::

        A_i = r_i - mean_g

    ``mean_g`` and ``std_g`` are taken over the completions sharing ``i``'s group; ``std_g`` is the
    unbiased sample std (divisor n_g - 1), as in TRL and verl.

    Args:
        rewards: [N] float, one scalar reward per completion.
        group_index: [N] long, group id of each completion. Ids need not be contiguous or sorted
            and groups may have different sizes.
        scale: divide by the group std (GRPO) or not (Dr. GRPO).
        eps: added to the std before dividing.

    Returns:
        [N] advantages, in ``rewards``' dtype (float32 for integer rewards). A group of one sample,
        or whose rewards are all equal, carries no signal: its advantages are exactly 0.
        Computed without a Python loop over groups.
    """
    if rewards.dim() != 1 or group_index.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_index must both be [N]; got {tuple(rewards.shape)} and "
            f"{tuple(group_index.shape)}"
        )
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    if rewards.numel() == 0:
        return torch.zeros_like(rewards, dtype=out_dtype)

    # Float64 for the statistics: group sums of many rewards stay exact enough.
    r = rewards.detach().to(torch.float64)
    _, g = torch.unique(group_index, return_inverse=True)  # ids -> 0..G-1
    num_groups = int(g.max()) + 1

    count = torch.zeros(num_groups, dtype=torch.float64, device=r.device).index_add_(
        0, g, torch.ones_like(r)
    )
    total = torch.zeros_like(count).index_add_(0, g, r)
    mean = total / count
    centred = r - mean[g]

    # A group with a single sample, or whose rewards are all equal, gets exactly 0 (the centred
    # value could otherwise be a rounding residue like 1e-17, blown up by the std division).
    gmax = torch.full_like(count, -torch.inf).scatter_reduce(0, g, r, reduce="amax")
    gmin = torch.full_like(count, torch.inf).scatter_reduce(0, g, r, reduce="amin")
    informative = (count > 1) & (gmax > gmin)

    if scale:
        sq = torch.zeros_like(count).index_add_(0, g, centred * centred)
        var = sq / (count - 1).clamp_min(1)  # unbiased; groups of one are masked out below
        centred = centred / (var.sqrt()[g] + eps)

    adv = torch.where(informative[g], centred, torch.zeros_like(centred))
    return adv.to(out_dtype)
