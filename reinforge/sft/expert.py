"""Expert iteration (rejection-sampling fine-tuning): which training prompts a round samples, and
which of the sampled completions are kept.

STaR (Zelikman et al., 2022, arXiv:2203.14465), ReST (Gulcehre et al., 2023, arXiv:2308.08998)
and RAFT (Dong et al., 2023, arXiv:2304.06767) share one loop: sample k completions per prompt
from the current model, keep what the verifier accepts, fine-tune on it, repeat. What is kept is
decided here, from the scores alone, so it can be checked without a model.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["round_prompts", "select_accepted", "round_seed"]


def round_seed(seed: int, round_index: int) -> int:
    """The sampling seed of round ``round_index`` (1-based): fixed by the run's seed alone, so a
    round re-sampled after a crash draws the same completions from the same weights."""
    return int(np.random.default_rng([seed, 0x5EED, round_index]).integers(2**31))


def round_prompts(num_train: int, per_round: int, seed: int, round_index: int) -> list[int]:
    """Training-example indices sampled in round ``round_index``: a seeded draw without
    replacement (all of them when there are fewer than ``per_round``)."""
    rng = np.random.default_rng([seed, 0xE1, round_index])
    k = min(per_round, num_train)
    return sorted(int(i) for i in rng.choice(num_train, size=k, replace=False))


def select_accepted(
    group_index: Sequence[int],
    completions: Sequence[Sequence[int]],
    rewards: Sequence[float],
    truncated: Sequence[bool],
    *,
    threshold: float,
    dedupe: bool = True,
    max_per_prompt: int | None = None,
) -> list[int]:
    """Rows to fine-tune on: reward >= ``threshold`` and not cut off at the token budget (a
    truncated completion never shows the model where to stop). With ``dedupe``, identical token
    sequences of one prompt are kept once (the first). ``max_per_prompt`` keeps that many per
    prompt, highest reward first (RAFT's best-of-k: 1). Returns row indices, ascending."""
    chosen: dict[int, list[int]] = {}
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for i, (g, toks, r, cut) in enumerate(zip(group_index, completions, rewards, truncated)):
        if cut or not r >= threshold:  # (NaN rewards are never accepted)
            continue
        key = (int(g), tuple(int(t) for t in toks))
        if dedupe and key in seen:
            continue
        seen.add(key)
        chosen.setdefault(int(g), []).append(i)
    rows: list[int] = []
    for g, idx in chosen.items():
        if max_per_prompt is not None:
            idx = sorted(idx, key=lambda i: (-float(rewards[i]), i))[:max_per_prompt]
        rows.extend(idx)
    return sorted(rows)
