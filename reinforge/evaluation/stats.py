"""Honest statistics for evaluation results (in the spirit of rliable: Agarwal et al., "Deep
Reinforcement Learning at the Edge of the Statistical Precipice", NeurIPS 2021,
arXiv:2108.13264): report an interval, not just a point, and compare two models on the same
prompts with a paired test.

All intervals are percentile bootstrap intervals over items (prompts): resample the items with
replacement ``n_resamples`` times, compute the statistic on each resample, and take the
``(1-confidence)/2`` and ``(1+confidence)/2`` quantiles (numpy's default linear interpolation).

Resampling is vectorised: an index matrix of shape (rows, n) is drawn from
``numpy.random.default_rng(seed)`` in chunks of at most ``_CHUNK_ELEMENTS`` indices (row count
depending only on n and n_resamples), so memory stays bounded and results are identical for the
same inputs and seed.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import numpy as np

__all__ = ["bootstrap_ci", "bootstrap_ci_columns", "paired_bootstrap_diff", "paired_bootstrap_statistic",
           "accuracy_summary"]

_CHUNK_ELEMENTS = 1 << 21  # indices per chunk: 2M int64 = 16 MiB (plus the gathered values)


def _as_1d(values: Any, name: str) -> np.ndarray:
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a sequence of numbers ({err})") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional (one value per item), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty: a confidence interval needs at least one item")
    if not np.all(np.isfinite(arr)):
        bad = int(np.sum(~np.isfinite(arr)))
        raise ValueError(f"{name} contains {bad} non-finite value(s) (NaN or inf)")
    return arr


def _check_params(confidence: float, n_resamples: int) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if int(n_resamples) != n_resamples or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples}")


def _chunk_rows(n: int, n_resamples: int) -> int:
    return max(1, min(int(n_resamples), _CHUNK_ELEMENTS // max(1, n)))


def _index_chunks(n: int, n_resamples: int, seed: int | None) -> Iterator[np.ndarray]:
    """Bootstrap index matrices, (rows, n) each, n_resamples rows in all."""
    rng = np.random.default_rng(seed)
    rows = _chunk_rows(n, n_resamples)
    done = 0
    while done < n_resamples:
        r = min(rows, n_resamples - done)
        yield rng.integers(0, n, size=(r, n))
        done += r


def _apply_rows(statistic: Callable, samples: np.ndarray) -> np.ndarray:
    """statistic over each row; uses ``axis=1`` when the statistic supports it."""
    try:
        out = np.asarray(statistic(samples, axis=1), dtype=np.float64)
        if out.shape == (samples.shape[0],):
            return out
    except TypeError:
        pass
    return np.array([float(statistic(row)) for row in samples], dtype=np.float64)


def _bootstrap_distribution(
    arrays: Sequence[np.ndarray], fn: Callable[..., np.ndarray], n_resamples: int, seed: int | None
) -> np.ndarray:
    n = arrays[0].shape[0]
    out = np.empty(int(n_resamples), dtype=np.float64)
    pos = 0
    for idx in _index_chunks(n, int(n_resamples), seed):
        out[pos : pos + idx.shape[0]] = fn(*(a[idx] for a in arrays))
        pos += idx.shape[0]
    return out


def _percentile_interval(dist: np.ndarray, confidence: float) -> tuple[float, float]:
    alpha = 1.0 - confidence
    lo, hi = np.quantile(dist, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(lo), float(hi)


def bootstrap_ci(
    values: Sequence[float],
    *,
    statistic: Callable = np.mean,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int | None = 0,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``statistic(values)`` over items.

    ``statistic`` is called as ``statistic(matrix, axis=1)`` on a (rows, n) matrix of resampled
    values when it accepts ``axis`` (numpy reductions do), otherwise once per resample.
    Raises ValueError for empty, multi-dimensional or non-finite input.
    """
    _check_params(confidence, n_resamples)
    arr = _as_1d(values, "values")
    dist = _bootstrap_distribution([arr], lambda s: _apply_rows(statistic, s), n_resamples, seed)
    return _percentile_interval(dist, confidence)


def bootstrap_ci_columns(
    values: Any,
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int | None = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap intervals of the column means of an (items, columns) matrix.

    The items (rows, e.g. prompts) are resampled jointly for all columns, with the same draws as
    :func:`bootstrap_ci` for the same n, n_resamples and seed, so column j's interval equals
    ``bootstrap_ci(values[:, j])`` (up to float rounding). Each resample is a row of counts, and
    the resampled means are one matrix product. Returns (low, high), one value per column.
    """
    _check_params(confidence, n_resamples)
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"values must be a matrix of numbers ({err})") from None
    if arr.ndim == 1:
        arr = arr[:, None]
    if arr.ndim != 2 or arr.shape[0] == 0:
        raise ValueError(f"values must be a non-empty (items, columns) matrix, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError("values contain non-finite value(s) (NaN or inf)")
    n = arr.shape[0]
    dist = np.empty((int(n_resamples), arr.shape[1]), dtype=np.float64)
    pos = 0
    for idx in _index_chunks(n, int(n_resamples), seed):
        r = idx.shape[0]
        flat = (idx + (np.arange(r) * n)[:, None]).ravel()
        counts = np.bincount(flat, minlength=r * n).reshape(r, n).astype(np.float64)
        dist[pos : pos + r] = counts @ arr / n
        pos += r
    alpha = 1.0 - confidence
    lo, hi = np.quantile(dist, [alpha / 2.0, 1.0 - alpha / 2.0], axis=0)
    return lo, hi


def paired_bootstrap_diff(
    before: Sequence[float],
    after: Sequence[float],
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int | None = 0,
) -> dict[str, Any]:
    """Paired comparison of two per-prompt score lists on the SAME prompts, in the same order.

    Prompt indices are resampled jointly, so the interval reflects the per-prompt difference
    ``after - before`` (prompt difficulty cancels), which is much tighter than comparing two
    independent intervals. Returns ``{"before", "after", "diff", "ci_low", "ci_high", "n",
    "excludes_zero"}`` where before/after are the means, diff = mean(after - before), and
    excludes_zero says whether the interval lies strictly on one side of 0.
    """
    _check_params(confidence, n_resamples)
    b = _as_1d(before, "before")
    a = _as_1d(after, "after")
    if a.shape != b.shape:
        raise ValueError(
            f"before and after must score the same prompts: got {b.size} and {a.size} values"
        )
    d = a - b
    # Resampling indices jointly for (before, after) is resampling the paired differences.
    dist = _bootstrap_distribution([d], lambda s: s.mean(axis=1), n_resamples, seed)
    lo, hi = _percentile_interval(dist, confidence)
    return {
        "before": float(b.mean()),
        "after": float(a.mean()),
        "diff": float(d.mean()),
        "ci_low": lo,
        "ci_high": hi,
        "n": int(d.size),
        "excludes_zero": bool(lo > 0.0 or hi < 0.0),
    }


def paired_bootstrap_statistic(
    columns: Sequence[Sequence[float]],
    statistic: Callable[..., np.ndarray],
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int | None = 0,
) -> dict[str, Any]:
    """Percentile bootstrap interval of a statistic of several per-item columns measured on the SAME
    items (prompts), such as a difference of two ratios (``sum(a)/sum(b) - sum(c)/sum(d)``).

    The items are resampled jointly for every column, as in :func:`paired_bootstrap_diff`.
    ``statistic(*columns)`` receives (rows, n) matrices of resampled values and returns one value
    per row; on the original data it is called with (1, n) matrices. A resample where the
    statistic is undefined (NaN, e.g. a ratio whose denominator resampled to 0) is left out of the
    quantiles; when the statistic is undefined on the data itself, value and interval are NaN.
    Returns ``{"value", "ci_low", "ci_high", "n", "excludes_zero"}``.
    """
    _check_params(confidence, n_resamples)
    arrays = [_as_1d(c, f"columns[{i}]") for i, c in enumerate(columns)]
    if not arrays:
        raise ValueError("paired_bootstrap_statistic needs at least one column")
    if len({a.size for a in arrays}) != 1:
        raise ValueError(f"the columns must score the same items: got lengths {[a.size for a in arrays]}")

    def rows(*mats: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(statistic(*mats), dtype=np.float64).reshape(mats[0].shape[0])

    value = float(rows(*(a[None, :] for a in arrays))[0])
    nan = float("nan")
    if not np.isfinite(value):
        return {"value": nan, "ci_low": nan, "ci_high": nan, "n": int(arrays[0].size), "excludes_zero": False}
    dist = _bootstrap_distribution(arrays, rows, n_resamples, seed)
    dist = dist[np.isfinite(dist)]
    lo, hi = _percentile_interval(dist, confidence) if dist.size else (nan, nan)
    return {"value": value, "ci_low": lo, "ci_high": hi, "n": int(arrays[0].size),
            "excludes_zero": bool(lo > 0.0 or hi < 0.0)}


def accuracy_summary(
    correct: Sequence[bool | float],
    rewards: Sequence[float],
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int | None = 0,
) -> dict[str, Any]:
    """Accuracy and mean reward over items with percentile bootstrap intervals.

    ``correct`` holds one 0/1 (or bool, or fraction such as a per-prompt mean over samples) value
    per item; ``rewards`` one reward per item, same length. Returns ``{"accuracy",
    "accuracy_ci_low", "accuracy_ci_high", "reward_mean", "reward_ci_low", "reward_ci_high",
    "n"}``.
    """
    c = _as_1d(correct, "correct")
    r = _as_1d(rewards, "rewards")
    if c.shape != r.shape:
        raise ValueError(
            f"correct and rewards must have one value per item: got {c.size} and {r.size} values"
        )
    acc_lo, acc_hi = bootstrap_ci(c, confidence=confidence, n_resamples=n_resamples, seed=seed)
    rew_lo, rew_hi = bootstrap_ci(r, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return {
        "accuracy": float(c.mean()),
        "accuracy_ci_low": acc_lo,
        "accuracy_ci_high": acc_hi,
        "reward_mean": float(r.mean()),
        "reward_ci_low": rew_lo,
        "reward_ci_high": rew_hi,
        "n": int(c.size),
    }
