"""Bootstrap statistics, checked against hand-computable cases and slow references."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from reinforge.evaluation import accuracy_summary, bootstrap_ci, paired_bootstrap_diff
from reinforge.evaluation import stats


def _linear_quantile(sorted_vals, q):
    """Textbook linear-interpolation quantile (numpy's default 'linear' method)."""
    h = (len(sorted_vals) - 1) * q
    lo = math.floor(h)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (h - lo) * (sorted_vals[hi] - sorted_vals[lo])


def test_all_equal_values_collapse_the_interval():
    lo, hi = bootstrap_ci([0.7] * 25)
    assert lo == pytest.approx(0.7, abs=1e-12) and hi == pytest.approx(0.7, abs=1e-12)
    assert bootstrap_ci([3.0]) == (3.0, 3.0)  # a single item: nothing to resample


def test_known_mean_is_covered_and_interval_narrows_with_n():
    widths = []
    for n in (20, 200, 2000):
        values = np.linspace(0.0, 10.0, n)  # mean exactly 5, sd ~ 2.89
        lo, hi = bootstrap_ci(values, n_resamples=4000)
        assert lo < 5.0 < hi
        # Close to the normal-theory width 2 * 1.96 * sd / sqrt(n).
        expected = 2 * 1.96 * values.std() / math.sqrt(n)
        assert (hi - lo) == pytest.approx(expected, rel=0.15)
        widths.append(hi - lo)
    assert widths[0] > widths[1] > widths[2]
    assert widths[0] / widths[2] == pytest.approx(10.0, rel=0.2)  # 1/sqrt(n) scaling


def test_deterministic_given_seed():
    values = np.random.default_rng(1).normal(size=50)
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    assert bootstrap_ci(values, seed=3) != bootstrap_ci(values, seed=4)


def test_percentile_interval_matches_slow_loop_reference():
    values = [0.0, 1.0, 1.0, 4.0, 2.5, 9.0, 0.5]
    n, n_res, seed, conf = len(values), 500, 123, 0.9
    # Same seed logic as the implementation (one chunk of n_res rows), but the statistic and the
    # percentile are computed by hand, one resample at a time.
    idx = np.random.default_rng(seed).integers(0, n, size=(n_res, n))
    means = sorted(sum(values[i] for i in row) / n for row in idx.tolist())
    ref = (_linear_quantile(means, 0.05), _linear_quantile(means, 0.95))
    got = bootstrap_ci(values, confidence=conf, n_resamples=n_res, seed=seed)
    assert got == pytest.approx(ref, abs=1e-12)
    # A statistic without an axis argument takes the per-resample path; same numbers.
    got_loop = bootstrap_ci(values, statistic=lambda x: float(np.mean(x)), confidence=conf,
                            n_resamples=n_res, seed=seed)
    assert got_loop == pytest.approx(ref, abs=1e-12)


def test_matches_exact_bootstrap_distribution():
    # With n=5 items all 5**5 resamples are equally likely: the exact bootstrap distribution.
    values = np.array([0.0, 1.0, 3.0, 7.0, 15.0])
    exact = np.sort([values[list(r)].mean() for r in itertools.product(range(5), repeat=5)])
    ref = (_linear_quantile(exact, 0.025), _linear_quantile(exact, 0.975))
    got = bootstrap_ci(values, n_resamples=100_000, seed=0)
    assert got == pytest.approx(ref, abs=0.15)


def test_chunked_resampling_bounds_memory_and_stays_consistent(monkeypatch):
    values = np.random.default_rng(0).normal(size=40)
    whole = bootstrap_ci(values, n_resamples=3000)
    monkeypatch.setattr(stats, "_CHUNK_ELEMENTS", 40 * 7)  # 7 rows per chunk, ragged last chunk
    chunked = bootstrap_ci(values, n_resamples=3000)
    assert chunked == bootstrap_ci(values, n_resamples=3000)  # deterministic
    assert chunked == pytest.approx(whole, abs=0.05)  # same distribution, other draws


def test_other_statistics_vectorise():
    values = np.arange(11.0)
    lo, hi = bootstrap_ci(values, statistic=np.median, n_resamples=2000)
    assert lo <= 5.0 <= hi and 0.0 <= lo and hi <= 10.0


def test_paired_diff_exact_shift():
    before = np.array([0.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.25])
    res = paired_bootstrap_diff(before, before + 1.0)
    assert res["diff"] == 1.0 and res["ci_low"] == 1.0 and res["ci_high"] == 1.0
    assert res["before"] == pytest.approx(before.mean())
    assert res["after"] == pytest.approx(before.mean() + 1.0)
    assert res["n"] == 7 and res["excludes_zero"] is True

    same = paired_bootstrap_diff(before, before)
    assert same["diff"] == 0.0 and same["ci_low"] == same["ci_high"] == 0.0
    assert same["excludes_zero"] is False


def test_paired_diff_cancels_prompt_difficulty():
    rng = np.random.default_rng(0)
    difficulty = rng.uniform(0, 1, size=60)  # varies far more across prompts than the gain
    before = difficulty
    after = difficulty + 0.05 + rng.normal(0, 0.01, size=60)
    res = paired_bootstrap_diff(before, after)
    assert res["excludes_zero"] and res["ci_low"] > 0.04 and res["ci_high"] < 0.06
    # Unpaired intervals of the two means overlap heavily: only the paired test sees the gain.
    b_lo, b_hi = bootstrap_ci(before)
    a_lo, a_hi = bootstrap_ci(after)
    assert a_lo < b_hi


def test_paired_diff_matches_slow_loop_reference():
    before = [0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    after = [1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    n, n_res, seed = 6, 400, 7
    idx = np.random.default_rng(seed).integers(0, n, size=(n_res, n))
    diffs = sorted(sum(after[i] - before[i] for i in row) / n for row in idx.tolist())
    res = paired_bootstrap_diff(before, after, n_resamples=n_res, seed=seed)
    assert res["ci_low"] == pytest.approx(_linear_quantile(diffs, 0.025), abs=1e-12)
    assert res["ci_high"] == pytest.approx(_linear_quantile(diffs, 0.975), abs=1e-12)
    assert res["diff"] == pytest.approx(2 / 6)


def test_accuracy_summary():
    correct = [True, False, True, True, False, True, True, True]
    rewards = [1.0, 0.1, 1.0, 1.0, 0.0, 1.0, 0.9, 1.0]
    s = accuracy_summary(correct, rewards)
    assert set(s) == {"accuracy", "accuracy_ci_low", "accuracy_ci_high", "reward_mean",
                      "reward_ci_low", "reward_ci_high", "n"}
    assert s["accuracy"] == 0.75 and s["n"] == 8
    assert s["reward_mean"] == pytest.approx(sum(rewards) / 8)
    assert 0.0 <= s["accuracy_ci_low"] < 0.75 < s["accuracy_ci_high"] <= 1.0
    assert s["reward_ci_low"] < s["reward_mean"] < s["reward_ci_high"]
    assert (s["accuracy_ci_low"], s["accuracy_ci_high"]) == bootstrap_ci(np.array(correct, float))
    perfect = accuracy_summary([1, 1, 1], [1.0, 1.0, 1.0])
    assert perfect["accuracy_ci_low"] == perfect["accuracy_ci_high"] == 1.0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: bootstrap_ci([]), "empty"),
        (lambda: bootstrap_ci([[1.0, 2.0]]), "one-dimensional"),
        (lambda: bootstrap_ci([1.0, float("nan")]), "non-finite"),
        (lambda: bootstrap_ci([1.0, 2.0], confidence=1.5), "confidence"),
        (lambda: bootstrap_ci([1.0, 2.0], n_resamples=0), "n_resamples"),
        (lambda: paired_bootstrap_diff([1.0, 2.0], [1.0]), "same prompts"),
        (lambda: paired_bootstrap_diff([], []), "empty"),
        (lambda: accuracy_summary([True], [1.0, 0.0]), "one value per item"),
        (lambda: accuracy_summary([], []), "empty"),
    ],
)
def test_bad_input_raises_clear_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
