"""Aggregate scores over several runs (seeds) and tasks, the way "Deep Reinforcement Learning at
the Edge of the Statistical Precipice" (Agarwal et al., NeurIPS 2021, arXiv:2108.13264; the
rliable library) recommends:

- **IQM**, the interquartile mean: the mean of the middle 50% of all run x task scores (25% cut
  from each end). Robust to one outlier seed, less noisy than the median. With fewer than 4 scores
  nothing is cut and it is the mean (the cut is ``int(0.25 * n)`` per end, as
  ``scipy.stats.trim_mean`` and rliable compute it).
- **Stratified bootstrap intervals**: resample runs with replacement *within each task* (the
  strata), recompute the statistic, take percentiles. Each task keeps its number of runs, so a
  hard task never drops out of a resample.
- **Probability of improvement** P(X > Y): for each task the chance that a random run of X scores
  higher than a random run of Y (ties count one half; the Mann-Whitney U statistic divided by
  n_x * n_y), averaged over tasks. Its interval resamples the runs of X and of Y, each within task.
- **Performance profiles**: for each threshold tau, the fraction of runs scoring above tau
  (averaged over tasks); a whole score distribution instead of one number.

Scores are given as *strata*: a list with one 1-D array of run scores per task. A group evaluated
on one task is ``[np.array([seed0, seed1, seed2])]``.

All resampling is vectorised and seeded (``numpy.random.default_rng(seed)``): the same inputs give
the same intervals.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "iqm",
    "mean",
    "stratified_bootstrap",
    "interval_estimate",
    "probability_of_improvement",
    "poi_interval",
    "performance_profile",
]

Strata = Sequence[Sequence[float]]


def _strata(scores: Strata, name: str = "scores") -> list[np.ndarray]:
    out = []
    for i, s in enumerate(scores):
        arr = np.asarray(s, dtype=np.float64).ravel()
        if arr.size == 0:
            raise ValueError(f"{name}: task {i} has no runs")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name}: task {i} has non-finite scores (NaN or inf)")
        out.append(arr)
    if not out:
        raise ValueError(f"{name}: no tasks (need at least one array of run scores)")
    return out


def iqm(scores: Any, axis: int | None = None) -> np.ndarray | float:
    """Interquartile mean: sort, cut ``int(0.25 * n)`` values from each end, average the rest.

    ``axis=None`` pools all values (rliable's ``aggregate_iqm`` over runs x tasks); ``axis=1``
    computes one IQM per row of a matrix (used on bootstrap resamples).
    """
    arr = np.asarray(scores, dtype=np.float64)
    if axis is None:
        arr = arr.ravel()
        axis = 0
    arr = np.sort(arr, axis=axis)
    n = arr.shape[axis]
    if n == 0:
        raise ValueError("IQM of no scores")
    cut = int(0.25 * n)
    kept = np.take(arr, np.arange(cut, n - cut), axis=axis)
    out = kept.mean(axis=axis)
    return float(out) if np.ndim(out) == 0 else out


def mean(scores: Any, axis: int | None = None) -> np.ndarray | float:
    """Plain mean (pooled over runs x tasks when ``axis`` is None)."""
    out = np.mean(np.asarray(scores, dtype=np.float64), axis=axis)
    return float(out) if np.ndim(out) == 0 else out


def _resample_strata(strata: list[np.ndarray], n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(n_resamples, total runs): each stratum's runs resampled with replacement within it."""
    parts = [s[rng.integers(0, s.size, size=(n_resamples, s.size))] for s in strata]
    return np.concatenate(parts, axis=1)


def stratified_bootstrap(
    scores: Strata,
    statistic: Callable[..., Any] = iqm,
    *,
    n_resamples: int = 2000,
    seed: int | None = 0,
) -> np.ndarray:
    """Bootstrap distribution of ``statistic`` under stratified resampling (runs within tasks).

    ``statistic(matrix, axis=1)`` is applied to a (n_resamples, total runs) matrix whose columns
    are grouped by task in the given order. Returns an array of n_resamples values.
    """
    strata = _strata(scores)
    rng = np.random.default_rng(seed)
    return np.asarray(statistic(_resample_strata(strata, int(n_resamples), rng), axis=1), dtype=np.float64)


def _interval(dist: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    alpha = 1.0 - confidence
    lo, hi = np.quantile(dist, [alpha / 2.0, 1.0 - alpha / 2.0], axis=0)
    return lo, hi


def interval_estimate(
    scores: Strata,
    statistic: Callable[..., Any] = iqm,
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int | None = 0,
) -> dict[str, float]:
    """Point estimate of ``statistic`` over all runs x tasks and its stratified bootstrap
    percentile interval: ``{"value", "ci_low", "ci_high", "n_runs", "n_tasks"}``."""
    strata = _strata(scores)
    point = float(statistic(np.concatenate(strata)[None, :], axis=1)[0])
    dist = stratified_bootstrap(strata, statistic, n_resamples=n_resamples, seed=seed)
    lo, hi = _interval(dist, confidence)
    return {"value": point, "ci_low": float(lo), "ci_high": float(hi),
            "n_runs": int(sum(s.size for s in strata)), "n_tasks": len(strata)}


def _poi_pairs(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(x > y) + 0.5 P(x == y) over all pairs; x, y are (..., n_x) and (..., n_y)."""
    gt = (x[..., :, None] > y[..., None, :]).mean(axis=(-2, -1))
    eq = (x[..., :, None] == y[..., None, :]).mean(axis=(-2, -1))
    return gt + 0.5 * eq


def probability_of_improvement(x_scores: Strata, y_scores: Strata) -> float:
    """P(X > Y) (Agarwal et al., 2021): per task, the probability that a run of X scores higher
    than a run of Y, ties counting one half (Mann-Whitney U / (n_x n_y)); averaged over tasks.
    X and Y must list the same tasks in the same order."""
    xs, ys = _strata(x_scores, "x_scores"), _strata(y_scores, "y_scores")
    if len(xs) != len(ys):
        raise ValueError(f"X has {len(xs)} tasks and Y has {len(ys)}: compare on the same tasks")
    return float(np.mean([_poi_pairs(x, y) for x, y in zip(xs, ys)]))


def poi_interval(
    x_scores: Strata,
    y_scores: Strata,
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int | None = 0,
) -> dict[str, float]:
    """P(X > Y) with a stratified bootstrap interval: the runs of X and of Y are resampled
    independently within each task (as rliable does). Returns ``{"value", "ci_low", "ci_high"}``."""
    xs, ys = _strata(x_scores, "x_scores"), _strata(y_scores, "y_scores")
    if len(xs) != len(ys):
        raise ValueError(f"X has {len(xs)} tasks and Y has {len(ys)}: compare on the same tasks")
    rng = np.random.default_rng(seed)
    n = int(n_resamples)
    per_task = []
    for x, y in zip(xs, ys):
        xr = x[rng.integers(0, x.size, size=(n, x.size))]
        yr = y[rng.integers(0, y.size, size=(n, y.size))]
        per_task.append(_poi_pairs(xr, yr))
    dist = np.mean(per_task, axis=0)
    lo, hi = _interval(dist, confidence)
    return {"value": probability_of_improvement(xs, ys), "ci_low": float(lo), "ci_high": float(hi)}


def performance_profile(
    scores: Strata,
    taus: Sequence[float],
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int | None = 0,
) -> dict[str, np.ndarray]:
    """Score distribution (Agarwal et al., 2021, sec. 4): for each tau, the fraction of runs with
    score > tau, averaged over tasks, with a stratified bootstrap interval per tau. Returns
    ``{"tau", "fraction", "ci_low", "ci_high"}`` arrays."""
    strata = _strata(scores)
    t = np.asarray(list(taus), dtype=np.float64)
    frac = np.mean([(s[:, None] > t[None, :]).mean(axis=0) for s in strata], axis=0)
    rng = np.random.default_rng(seed)
    n = int(n_resamples)
    per_task = []
    for s in strata:
        res = s[rng.integers(0, s.size, size=(n, s.size))]  # (n, runs)
        per_task.append((res[:, :, None] > t[None, None, :]).mean(axis=1))  # (n, taus)
    lo, hi = _interval(np.mean(per_task, axis=0), confidence)
    return {"tau": t, "fraction": frac, "ci_low": lo, "ci_high": hi}
