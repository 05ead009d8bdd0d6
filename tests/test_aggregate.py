"""Multi-seed aggregates (IQM, stratified bootstrap, probability of improvement, performance
profiles) against hand-computed values and exact enumeration of the bootstrap distribution."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from reinforge.evaluation.aggregate import (
    interval_estimate,
    iqm,
    mean,
    performance_profile,
    poi_interval,
    probability_of_improvement,
    stratified_bootstrap,
)


def test_iqm_hand_values():
    assert iqm([1, 2, 3, 4, 5, 6, 7, 8]) == 4.5          # middle half: 3, 4, 5, 6
    assert iqm([8, 1, 7, 2, 6, 3, 5, 4]) == 4.5          # order does not matter
    assert iqm([0, 0, 0, 1, 1, 1, 1]) == pytest.approx(0.6)  # n=7: one cut per end
    assert iqm([0.2, 0.9, 0.4]) == pytest.approx(0.5)     # n<4: nothing cut, the mean
    assert iqm([100.0, 1, 2, 3]) == pytest.approx(2.5)    # an outlier seed is cut
    m = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [8, 8, 8, 8, 0, 0, 0, 0]], dtype=float)
    assert iqm(m, axis=1).tolist() == [4.5, 4.0]
    assert iqm(m) == pytest.approx(np.sort(m.ravel())[4:12].mean())  # pooled runs x tasks
    assert mean([1, 2, 6]) == 3.0


def _exact_stratified_distribution(strata, statistic):
    """Every stratified resample, each equally likely: the product of n_j^n_j index tuples."""
    per = [list(itertools.product(range(len(s)), repeat=len(s))) for s in strata]
    out = []
    for combo in itertools.product(*per):
        values = np.concatenate([np.asarray(s)[list(idx)] for s, idx in zip(strata, combo)])
        out.append(round(float(statistic(values[None, :], axis=1)[0]), 10))
    return Counter(out), len(out)


def test_stratified_bootstrap_matches_exact_enumeration():
    strata = [[0.0, 1.0], [0.0, 0.25, 3.0]]
    exact, total = _exact_stratified_distribution(strata, iqm)
    dist = stratified_bootstrap(strata, iqm, n_resamples=60_000, seed=1)
    mc = Counter(round(float(v), 10) for v in dist)
    assert set(mc) <= set(exact)  # only values a stratified resample can produce
    for value, count in exact.items():
        assert mc[value] / len(dist) == pytest.approx(count / total, abs=0.01), value


def test_stratified_bootstrap_keeps_each_task_in_every_resample():
    # Task A's runs all score 0, task B's all 1: a stratified resample always has 2 zeros and
    # 3 ones, so the mean is exactly 0.6 in every resample. (Resampling the 5 runs without
    # strata would give anything from 0 to 1.)
    res = interval_estimate([[0.0, 0.0], [1.0, 1.0, 1.0]], mean, n_resamples=500)
    assert res == {"value": pytest.approx(0.6), "ci_low": pytest.approx(0.6), "ci_high": pytest.approx(0.6),
                   "n_runs": 5, "n_tasks": 2}


def test_interval_estimate_brackets_the_point_and_is_seeded():
    strata = [np.random.default_rng(0).uniform(size=10)]
    a = interval_estimate(strata, iqm, n_resamples=2000, seed=3)
    assert a == interval_estimate(strata, iqm, n_resamples=2000, seed=3)
    assert a["ci_low"] <= a["value"] <= a["ci_high"]
    assert min(strata[0]) <= a["ci_low"] and a["ci_high"] <= max(strata[0])
    assert a["value"] == pytest.approx(iqm(strata[0]))
    single = interval_estimate([[0.7]], iqm)  # one run: no spread to resample
    assert single["ci_low"] == single["ci_high"] == 0.7


def test_probability_of_improvement_hand_values():
    x, y = [1.0, 2.0, 3.0], [2.0, 2.0, 0.0]
    # pairs with x > y: (1,0) (2,0) (3,2) (3,2) (3,0) = 5; ties: (2,2) (2,2) = 2 -> (5 + 1) / 9
    assert probability_of_improvement([x], [y]) == pytest.approx(6 / 9)
    assert probability_of_improvement([y], [x]) == pytest.approx(3 / 9)  # P(X>Y) + P(Y>X) = 1
    # averaged over tasks: second task X always loses
    assert probability_of_improvement([x, [0.0]], [y, [1.0]]) == pytest.approx((6 / 9 + 0.0) / 2)
    assert probability_of_improvement([[0.3, 0.5]], [[0.3, 0.5]]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="same tasks"):
        probability_of_improvement([x], [y, y])


def test_poi_interval():
    sure = poi_interval([[0.8, 0.9, 1.0]], [[0.1, 0.2]], n_resamples=400)
    assert sure == {"value": 1.0, "ci_low": 1.0, "ci_high": 1.0}
    mixed = poi_interval([[0.1, 0.5, 0.9, 0.3]], [[0.2, 0.4, 0.6]], n_resamples=2000, seed=2)
    assert mixed["ci_low"] < mixed["value"] < mixed["ci_high"]
    assert 0.0 <= mixed["ci_low"] and mixed["ci_high"] <= 1.0


def test_performance_profile_hand_values():
    prof = performance_profile([[0.1, 0.5, 0.9]], [0.0, 0.5, 1.0], n_resamples=300)
    assert prof["fraction"].tolist() == pytest.approx([1.0, 1 / 3, 0.0])  # strictly above tau
    two = performance_profile([[0.1, 0.5, 0.9], [1.0, 1.0]], [0.5], n_resamples=300)
    assert two["fraction"].tolist() == pytest.approx([(1 / 3 + 1.0) / 2])  # averaged over tasks
    assert two["ci_low"][0] <= two["fraction"][0] <= two["ci_high"][0]
    assert prof["ci_low"][0] == prof["ci_high"][0] == 1.0  # every run is above 0


@pytest.mark.parametrize("bad, match", [([], "no tasks"), ([[]], "no runs"), ([[1.0, float("nan")]], "non-finite")])
def test_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        interval_estimate(bad)
