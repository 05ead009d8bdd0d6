"""pass@k, maj@k and the capability-boundary analysis, checked against brute-force enumeration of
every k-subset of the samples."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from reinforge.evaluation import bootstrap_ci, bootstrap_ci_columns
from reinforge.evaluation.boundary import boundary_analysis, boundary_csv, boundary_markdown, crossings, plot_boundary
from reinforge.evaluation.passk import maj_at_k_curve, pass_at_k, pass_at_k_curve, summarize_samples
from reinforge.evaluation.report import passk_csv, passk_markdown, plot_passk

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def brute_pass(correct: list[int], k: int) -> float:
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def brute_maj(answers: list, correct: list[float], k: int) -> float:
    """Majority vote over every k-subset; ties split evenly; no answer never wins."""
    total, count = 0.0, 0
    for s in itertools.combinations(range(len(answers)), k):
        count += 1
        votes: dict = {}
        for i in s:
            if answers[i] is not None:
                votes.setdefault(answers[i], []).append(correct[i])
        if not votes:
            continue
        top = max(len(v) for v in votes.values())
        winners = [v for v in votes.values() if len(v) == top]
        total += sum(float(np.mean(v)) for v in winners) / len(winners)
    return total / count


def test_pass_at_k_matches_enumeration_on_every_small_case():
    for n in range(1, 9):
        for c in range(n + 1):
            correct = [1] * c + [0] * (n - c)
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass(correct, k), abs=1e-12), (n, c, k)


def test_pass_at_k_hand_values_and_edges():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert pass_at_k(5, 2, 4) == 1.0  # n - c < k: every 4-subset holds a correct sample
    # large n stays finite (no binomial overflow) and equals the closed form
    assert pass_at_k(2000, 3, 100) == pytest.approx(1 - math.comb(1997, 100) / math.comb(2000, 100), rel=1e-9)
    got = pass_at_k([4, 4, 4], [0, 1, 4], 2)
    assert got.shape == (3,) and got.tolist() == pytest.approx([0.0, 0.5, 1.0])
    curve = pass_at_k_curve([3, 3], [1, 2], [1, 2, 3])
    assert curve.shape == (2, 3)
    assert curve[0].tolist() == pytest.approx([1 / 3, 2 / 3, 1.0])
    with pytest.raises(ValueError, match="at least 5 samples"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match=r"\[0, n\]"):
        pass_at_k(4, 5, 1)


def test_maj_at_k_matches_enumeration_with_ties_and_missing_answers():
    rng = random.Random(0)
    for _ in range(150):
        n = rng.randint(1, 8)
        answers = [rng.choice([None, "a", "b", "c", "d"]) for _ in range(n)]
        truth = rng.choice(["a", "b"])
        correct = [float(a == truth) for a in answers]
        got = maj_at_k_curve(answers, correct, range(1, n + 1))
        ref = [brute_maj(answers, correct, k) for k in range(1, n + 1)]
        assert got.tolist() == pytest.approx(ref, abs=1e-12), (answers, truth)


def test_maj_at_k_hand_values():
    # a a b: k=1 -> 2/3; k=2 -> subsets {aa}=a, {ab}x2 tie -> 1/2 each: (1 + 0.5 + 0.5)/3
    assert maj_at_k_curve(["a", "a", "b"], [1, 1, 0], [1, 2, 3]).tolist() == pytest.approx([2 / 3, 2 / 3, 1.0])
    # several correct answer strings (e.g. math-verify equivalence) all count
    assert maj_at_k_curve(["4", "4.0", "5"], [1, 1, 0], [3]).tolist() == pytest.approx([2 / 3])
    # no sample has an answer: nothing wins
    assert maj_at_k_curve([None, None], [0, 0], [1, 2]).tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="1 <= k <= n"):
        maj_at_k_curve(["a"], [1], [2])


def test_summarize_samples_intervals_are_the_bootstrap_over_prompts():
    rng = np.random.default_rng(1)
    rows = []
    for _ in range(12):
        correct = rng.integers(0, 2, size=5).tolist()
        rows.append({"correct": correct, "rewards": [float(c) * 0.5 for c in correct],
                     "answers": ["x" if c else "y" for c in correct]})
    s = summarize_samples(rows, n_resamples=500, seed=4)
    assert s["n_prompts"] == 12 and s["samples"] == 5
    assert [r["k"] for r in s["pass_at_k"]] == [1, 2, 3, 4, 5]
    per_prompt = np.array([[brute_pass(r["correct"], k) for k in range(1, 6)] for r in rows])
    assert [r["value"] for r in s["pass_at_k"]] == pytest.approx(per_prompt.mean(axis=0).tolist())
    assert s["pass_at_k"][0]["value"] == pytest.approx(s["accuracy"])
    lo, hi = bootstrap_ci(per_prompt[:, 2], n_resamples=500, seed=4)
    assert (s["pass_at_k"][2]["ci_low"], s["pass_at_k"][2]["ci_high"]) == pytest.approx((lo, hi), abs=1e-12)
    maj = [np.mean([brute_maj(r["answers"], r["correct"], k) for r in rows]) for k in range(1, 6)]
    assert [r["value"] for r in s["maj_at_k"]] == pytest.approx(maj)
    assert s["reward_mean"] == pytest.approx(0.5 * s["accuracy"])
    with pytest.raises(ValueError, match="same number of samples"):
        summarize_samples([{"correct": [1], "rewards": [1], "answers": ["a"]},
                           {"correct": [1, 0], "rewards": [1, 0], "answers": ["a", "b"]}])


def test_bootstrap_ci_columns_equals_bootstrap_ci_per_column():
    values = np.random.default_rng(0).normal(size=(23, 4))
    lo, hi = bootstrap_ci_columns(values, n_resamples=3000, seed=7, confidence=0.9)
    for j in range(4):
        ref = bootstrap_ci(values[:, j], n_resamples=3000, seed=7, confidence=0.9)
        assert (lo[j], hi[j]) == pytest.approx(ref, abs=1e-12)


def test_report_outputs_for_a_sampled_eval():
    rows = [{"correct": [1, 0, 0, 1], "rewards": [1, 0, 0, 1], "answers": ["1", "2", None, "1"]},
            {"correct": [0, 0, 0, 0], "rewards": [0, 0, 0, 0], "answers": ["2", "2", "3", None]}]
    s = summarize_samples(rows, n_resamples=200)
    s.update(temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0)
    md = passk_markdown(s, title="t", figure="passk.png")
    assert "| 4 |" in md and "maj@k" in md and "passk.png" in md
    csv = passk_csv(s).splitlines()
    assert csv[0].startswith("k,pass_at_k") and len(csv) == 5
    assert plot_passk(s, title="t")[:8] == PNG_MAGIC


# ----------------------------------------------------------------------------- boundary


def _rows(correct_counts: list[int], n: int, prefix: str = "p") -> list[dict]:
    return [{"id": f"{prefix}{i}", "correct": [1] * c + [0] * (n - c)} for i, c in enumerate(correct_counts)]


def test_crossings():
    assert crossings([1, 2, 3, 4], [0.2, 0.1, -0.05, -0.1]) == [3]
    assert crossings([1, 2, 3], [0.1, 0.0, 0.1]) == []  # a tie is not a crossing
    assert crossings([1, 2, 3, 4], [-0.1, 0.1, 0.0, -0.2]) == [2, 4]


def test_boundary_finds_the_crossover_of_a_sharpened_model():
    # Trained: always right on 3 prompts, never on the other 5. Base: right on 1 of 8 samples on
    # every prompt. pass@1 favours trained (3/8 vs 1/8); pass@8 favours base (1.0 vs 3/8).
    n = 8
    base, trained = _rows([1] * 8, n), _rows([8, 8, 8, 0, 0, 0, 0, 0], n)
    res = boundary_analysis(base, trained, n_resamples=500)
    assert res["ks"] == list(range(1, 9))
    assert res["trained"]["value"][0] == pytest.approx(3 / 8)
    assert res["base"]["value"][0] == pytest.approx(1 / 8)
    assert res["base"]["value"][7] == pytest.approx(1.0)
    # base pass@k = k/8; trained = 3/8 at every k: they cross where k/8 first exceeds 3/8
    assert res["crossover_k"] == 4 and res["crossings"] == [4]
    assert res["solved_by_both"] == 3 and res["solved_by_base_only"] == 5 and res["solved_by_trained_only"] == 0
    for part in ("base", "trained", "diff"):
        c = res[part]
        assert all(lo - 1e-12 <= v <= hi + 1e-12 for v, lo, hi in zip(c["value"], c["ci_low"], c["ci_high"]))
    md = boundary_markdown(res, base_name="B", trained_name="T", figure="boundary.png")
    assert "cross at k = 4" in md and "| 8 |" in md
    assert boundary_csv(res).splitlines()[0].startswith("k,base,")
    assert plot_boundary(res, base_name="B", trained_name="T")[:8] == PNG_MAGIC


def test_boundary_paired_difference_and_misaligned_prompts():
    base = _rows([2, 2, 2, 2], 4)
    trained = list(reversed(_rows([3, 3, 3, 3], 4)))  # order does not matter, ids do
    res = boundary_analysis(base, trained, n_resamples=300)
    # every prompt gains exactly pass@1 += 0.25: the paired interval has zero width
    assert res["diff"]["value"][0] == pytest.approx(0.25)
    assert res["diff"]["ci_low"][0] == pytest.approx(0.25) and res["diff"]["ci_high"][0] == pytest.approx(0.25)
    assert res["crossover_k"] is None
    with pytest.raises(ValueError, match="same prompts"):
        boundary_analysis(base, _rows([1, 1, 1, 1], 4, prefix="q"))
    with pytest.raises(ValueError, match="same number of samples"):
        boundary_analysis(base, _rows([1, 1, 1, 1], 5))
