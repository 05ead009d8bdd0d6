"""pass@k and maj@k from N sampled completions per prompt, with bootstrap intervals over prompts.

pass@k is the probability that at least one of k completions drawn (without replacement) from the
prompt's N samples is correct. Its unbiased estimator from c correct out of n samples is

    pass@k = 1 - C(n - c, k) / C(n, k)

("Evaluating Large Language Models Trained on Code", Chen et al., 2021, arXiv:2107.03374, eq. 1),
computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)`` so no binomial coefficient overflows. Drawing
k of the n samples is exactly what the estimator averages over, so it equals the brute-force mean
over all k-subsets (tested), and it is far less noisy than drawing only k samples per prompt.

maj@k (majority voting, "self-consistency": Wang et al., 2022, arXiv:2203.11171) is the
probability that the most frequent answer among k drawn completions is correct; it is computed
exactly over all k-subsets of the N samples (a dynamic programme over answer groups, below), not
by Monte Carlo. Completions without an extractable answer never win a vote but take up a draw;
ties between answers are broken uniformly at random (the expected value is used).

Both are averaged over prompts; the 95% interval is a percentile bootstrap over prompts (the
prompts are the sample; the N completions per prompt are already averaged exactly).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from reinforge.evaluation.stats import bootstrap_ci_columns

__all__ = [
    "pass_at_k",
    "pass_at_k_curve",
    "maj_at_k_curve",
    "default_ks",
    "summarize_samples",
]

_MAX_MAJ_SAMPLES = 1000  # beyond this C(n, k) overflows float64


def pass_at_k(n: Any, c: Any, k: int) -> np.ndarray | float:
    """Unbiased pass@k (Chen et al., 2021, arXiv:2107.03374) for n samples of which c are correct.

    ``n`` and ``c`` may be scalars or arrays (one value per prompt); returns the same shape.
    Raises ValueError when k > n (pass@k needs at least k samples) or c is outside [0, n].
    """
    n_arr = np.asarray(n, dtype=np.int64)
    c_arr = np.asarray(c, dtype=np.int64)
    k = int(k)
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    if np.any(n_arr < k):
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt, got n={int(n_arr.min())}")
    if np.any(c_arr < 0) or np.any(c_arr > n_arr):
        raise ValueError("the number of correct samples c must lie in [0, n]")
    n_b, c_b = np.broadcast_arrays(n_arr, c_arr)
    out = np.empty(n_b.shape, dtype=np.float64)
    for idx in np.ndindex(n_b.shape):
        nn, cc = int(n_b[idx]), int(c_b[idx])
        if nn - cc < k:
            out[idx] = 1.0
        else:
            # 1 - C(n-c, k)/C(n, k) = 1 - prod_{i=n-c+1}^{n} (1 - k/i)
            i = np.arange(nn - cc + 1, nn + 1, dtype=np.float64)
            out[idx] = 1.0 - float(np.prod(1.0 - k / i))
    return float(out) if out.ndim == 0 else out


def pass_at_k_curve(n: Sequence[int], c: Sequence[int], ks: Sequence[int]) -> np.ndarray:
    """Per-prompt pass@k for every k in ``ks``: an array of shape (prompts, len(ks))."""
    n_arr = np.asarray(n, dtype=np.int64)
    c_arr = np.asarray(c, dtype=np.int64)
    return np.stack([np.atleast_1d(pass_at_k(n_arr, c_arr, k)) for k in ks], axis=1)


def _binom_row(m: int) -> np.ndarray:
    return np.array([math.comb(m, y) for y in range(m + 1)], dtype=np.float64)


def maj_at_k_curve(
    answers: Sequence[Hashable | None], correct: Sequence[float], ks: Sequence[int]
) -> np.ndarray:
    """Exact maj@k of one prompt for every k in ``ks``, from its n sampled answers.

    ``answers[i]`` is the (normalised) answer of sample i, or None when it has none; ``correct[i]``
    its correctness in [0, 1]. Samples with the same answer form a group whose correctness is the
    mean of its samples' (0 or 1 for a deterministic verifier). For a k-subset the winner is the
    group with the most members in it, ties broken uniformly at random; maj@k is the expected
    correctness of the winner over all C(n, k) subsets (0 when every drawn sample has no answer).

    Dynamic programme: for a correct group g drawing x members, the other groups draw y_j <= x
    members each (C(m_j, y_j) ways), tracked as (members drawn, groups tied at x); samples without
    an answer are free draws. The winner probability is sum over ties t of ways / (t + 1).
    """
    n = len(answers)
    if len(correct) != n:
        raise ValueError(f"{n} answers but {len(correct)} correctness values")
    ks = [int(k) for k in ks]
    if n == 0:
        raise ValueError("maj@k needs at least one sample")
    if any(k < 1 or k > n for k in ks):
        raise ValueError(f"maj@k needs 1 <= k <= n={n}, got ks={ks}")
    if n > _MAX_MAJ_SAMPLES:
        raise ValueError(f"maj@k is computed exactly for at most {_MAX_MAJ_SAMPLES} samples per prompt, got {n}")
    counts: dict[Hashable, int] = {}
    right: dict[Hashable, float] = {}
    free = 0  # samples without an answer
    for a, c in zip(answers, correct):
        if a is None:
            free += 1
            continue
        counts[a] = counts.get(a, 0) + 1
        right[a] = right.get(a, 0.0) + float(c)
    keys = list(counts)
    sizes = [counts[a] for a in keys]
    frac = [right[a] / counts[a] for a in keys]
    n_groups = len(keys)
    free_row = _binom_row(free)
    ways = np.zeros(n + 1)  # ways[k]: expected correct winners summed over k-subsets
    for g in range(n_groups):
        if frac[g] == 0.0:
            continue
        others = [m for j, m in enumerate(sizes) if j != g]
        m_g = sizes[g]
        for x in range(1, m_g + 1):
            # dp[s, t]: ways to draw s samples from the other answer groups, each at most x,
            # with t of them drawing exactly x (tied with g).
            dp = np.zeros((n + 1, n_groups))
            dp[0, 0] = 1.0
            for m_j in others:
                row = _binom_row(m_j)
                new = np.zeros_like(dp)
                for y in range(min(m_j, x) + 1):
                    if y == x:
                        new[y:, 1:] += row[y] * dp[: n + 1 - y, :-1]
                    else:
                        new[y:, :] += row[y] * dp[: n + 1 - y, :]
                dp = new
            win = dp @ (1.0 / np.arange(1, n_groups + 1))  # (n+1,): expected wins of g by s
            if free:
                win = np.convolve(win, free_row)[: n + 1]
            base = math.comb(m_g, x) * frac[g]
            ways[x:] += base * win[: n + 1 - x]
    total = np.array([math.comb(n, k) for k in ks], dtype=np.float64)
    return ways[ks] / total


def default_ks(n: int) -> list[int]:
    """Every k from 1 to n."""
    return list(range(1, int(n) + 1))


def summarize_samples(
    per_prompt: Sequence[dict[str, Any]],
    *,
    ks: Sequence[int] | None = None,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int | None = 0,
) -> dict[str, Any]:
    """Summary of a sampled evaluation: mean reward, pass@k and maj@k for every k, with
    percentile bootstrap intervals over prompts.

    ``per_prompt`` holds one dict per prompt with lists ``correct`` (0/1 or bool per sample),
    ``rewards`` (float per sample) and ``answers`` (normalised answer or None per sample). All
    prompts must have the same number of samples N. ``ks`` defaults to 1..N.

    Returns ``{"n_prompts", "samples", "confidence", "reward_mean", "reward_ci_low", "reward_ci_high",
    "accuracy" (mean correctness of single samples = pass@1), "pass_at_k": [{"k", "value",
    "ci_low", "ci_high"}...], "maj_at_k": [...]}`` and the per-prompt matrices under
    ``"per_prompt_pass"`` / ``"per_prompt_maj"`` (prompts x ks) for paired comparisons.
    """
    if not per_prompt:
        raise ValueError("no prompts to summarise")
    sizes = {len(p["correct"]) for p in per_prompt}
    if len(sizes) != 1:
        raise ValueError(f"every prompt must have the same number of samples, got sizes {sorted(sizes)}")
    n = sizes.pop()
    if n < 1:
        raise ValueError("every prompt needs at least one sample")
    ks = default_ks(n) if ks is None else [int(k) for k in ks]
    c = np.array([int(round(sum(float(x) for x in p["correct"]))) for p in per_prompt])
    pass_mat = pass_at_k_curve(np.full(len(per_prompt), n), c, ks)
    maj_mat = np.stack([maj_at_k_curve(p["answers"], p["correct"], ks) for p in per_prompt])
    reward = np.array([float(np.mean(p["rewards"])) for p in per_prompt])
    acc = np.array([float(np.mean([float(x) for x in p["correct"]])) for p in per_prompt])
    stacked = np.column_stack([reward, acc, pass_mat, maj_mat])
    lo, hi = bootstrap_ci_columns(stacked, confidence=confidence, n_resamples=n_resamples, seed=seed)
    means = stacked.mean(axis=0)
    nk = len(ks)

    def rows(offset: int) -> list[dict[str, float]]:
        return [
            {"k": k, "value": float(means[offset + i]), "ci_low": float(lo[offset + i]),
             "ci_high": float(hi[offset + i])}
            for i, k in enumerate(ks)
        ]

    return {
        "n_prompts": len(per_prompt),
        "samples": n,
        "confidence": confidence,
        "reward_mean": float(means[0]),
        "reward_ci_low": float(lo[0]),
        "reward_ci_high": float(hi[0]),
        "accuracy": float(means[1]),
        "accuracy_ci_low": float(lo[1]),
        "accuracy_ci_high": float(hi[1]),
        "pass_at_k": rows(2),
        "maj_at_k": rows(2 + nk),
        "per_prompt_pass": pass_mat,
        "per_prompt_maj": maj_mat,
    }
