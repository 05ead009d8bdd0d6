"""Rewards that are not numbers in range (issue 28, finding 6).

A score must be a finite real number within reward.max_abs_score (True/False count as 1/0);
anything else (the string "0.75", None, NaN, 1e39) is a counted reward error with its reason,
never a silent conversion, an inf reward_mean or a NaN advantage. The guardrails do not present
constant answers whose every scoring failed as a measured baseline, and the NaN guard's stop says
which checkpoint exists, or that none was written."""

from __future__ import annotations

import math
import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_run import cli_in_process, save_tiny_run_inputs, tiny_run_overrides

from reinforge.config import ConfigError, build_config
from reinforge.evaluation.guardrails import Guardrails
from reinforge.rewards import RewardFunction
from reinforge.rewards.score_check import InvalidScore, checked_score, checked_token_rewards
from reinforge.rewards.verifiers import ExactMatchVerifier, VerifierResult
from reinforge.tasks import Example
from reinforge.tracking import RunDir
from reinforge.tracking.checkpoints import list_checkpoints

# ----------------------------------------------------------------------------- the rule


@pytest.mark.parametrize("value, expected", [
    (0.5, 0.5), (1, 1.0), (-3, -3.0), (True, 1.0), (False, 0.0), (np.float32(0.25), 0.25), (np.int64(2), 2.0),
    (np.bool_(True), 1.0), (torch.tensor(0.75), 0.75), (torch.tensor([True]), 1.0), (np.array(0.5), 0.5),
    (Fraction(1, 4), 0.25), (1e6, 1e6), (-1e6, -1e6),
])
def test_finite_real_numbers_within_the_bound_are_scores(value, expected):
    assert checked_score(value) == expected


@pytest.mark.parametrize("value, words", [
    ("0.75", ["the str '0.75'", "float("]),
    (None, ["None", "missing `return`"]),
    (float("nan"), ["non-finite score nan"]),
    (float("inf"), ["non-finite score inf"]),
    (1e39, ["1e+39", "±1e+06", "reward.max_abs_score"]),
    (-2e6, ["-2e+06", "reward.max_abs_score"]),
    (10**400, ["too large", "reward.max_abs_score"]),
    (1 + 2j, ["complex", "real number"]),
    ([0.5], ["list", "real number"]),
    (torch.tensor([0.1, 0.2]), ["Tensor", "real number"]),
])
def test_anything_else_is_an_invalid_score_saying_why(value, words):
    with pytest.raises(InvalidScore) as err:
        checked_score(value)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_the_bound_is_the_users():
    assert checked_score(1e39, max_abs=1e40) == 1e39
    with pytest.raises(InvalidScore, match="outside ±1"):
        checked_score(1.5, max_abs=1.0)
    assert checked_token_rewards([0, True, 0.5]) == [0.0, 1.0, 0.5]
    with pytest.raises(InvalidScore, match="token reward 1: .*1e\\+39"):
        checked_token_rewards([0.0, 1e39])


def test_max_abs_score_is_a_validated_config_key():
    assert build_config({}, []).reward.max_abs_score == 1e6
    assert build_config({}, ["reward.max_abs_score=1e9"]).reward.max_abs_score == 1e9
    for bad in ("0", "-1", ".inf"):
        with pytest.raises(ConfigError, match="reward.max_abs_score"):
            build_config({}, [f"reward.max_abs_score={bad}"])


# ----------------------------------------------------------------------------- in the reward function


class _Returns:
    """A verifier returning a fixed score per completion text."""

    name = "python"

    def __init__(self, by_text):
        self.by_text = by_text

    def __call__(self, completion, example):
        return VerifierResult(self.by_text[completion])


def _ex(answer="a", i=0):
    return Example(id=f"e{i}", messages=[{"role": "user", "content": "q"}], answer=answer)


def test_bad_scores_are_counted_reward_errors_with_reasons_and_the_rewards_stay_finite():
    scores = {"huge": 1e39, "text": "0.75", "nan": float("nan"), "none": None, "ok": 0.5, "yes": True}
    fn = RewardFunction([(_Returns(scores), 1.0)])
    outs = fn(list(scores), [_ex()] * len(scores))
    by = dict(zip(scores, outs))
    for key in ("huge", "text", "nan", "none"):
        assert by[key].reward == 0.0 and by[key].components == {"python": 0.0}
        assert len(by[key].errors) == 1 and by[key].errors[0].startswith("python: InvalidScore: "), by[key].errors
    assert "reward.max_abs_score" in by["huge"].errors[0]
    assert "the str '0.75'" in by["text"].errors[0]
    assert "non-finite" in by["nan"].errors[0]
    assert by["ok"].reward == 0.5 and not by["ok"].errors
    assert by["yes"].reward == 1.0 and by["yes"].correct  # True counts as 1: correct at the threshold 1
    assert fn.error_count == 4


def test_the_reward_tensor_never_holds_inf_even_for_bounded_scores_with_huge_weights():
    # 1e30 is within a bound of 1e31, but times a weight of 1e10 it overflows float32
    fn = RewardFunction([(_Returns({"x": 1e30}), 1e10)], max_abs_score=1e31)
    out = fn(["x"], [_ex()])[0]
    assert out.reward == 0.0 and "overflows float32" in out.errors[0]


def test_guardrails_do_not_report_a_baseline_that_no_valid_score_measured():
    class AlwaysHuge:
        name = "exact_match"

        def __call__(self, completion, example):
            return VerifierResult(1e39, None)

    examples = [_ex(str(i % 2), i) for i in range(6)]
    guard = Guardrails(reward_fn=RewardFunction([(AlwaysHuge(), 1.0)]), answer_format="raw",
                       train_answers=["0", "1", "1"], n_resamples=200)
    record, _ = guard.measure(examples, [["1"] for _ in examples], [[0.0] for _ in examples])
    for key in ("best_constant", "train_prior"):
        assert record[key]["applicable"] is False, record[key]
        assert "no valid score" in record[key]["reason"] and record[key]["reward_errors"] > 0


def test_guardrails_count_the_reward_errors_of_a_baseline_they_could_measure():
    class FailsOnZero:
        name = "exact_match"

        def __call__(self, completion, example):
            return VerifierResult("bad" if completion == "0" else float(completion == example.answer))

    examples = [_ex(str(i % 2), i) for i in range(6)]
    guard = Guardrails(reward_fn=RewardFunction([(FailsOnZero(), 1.0)]), answer_format="raw",
                       train_answers=["0", "1"], n_resamples=200)
    record, _ = guard.measure(examples, [["1"] for _ in examples], [[0.0] for _ in examples])
    const = record["best_constant"]
    assert const["applicable"] and const["answer"] == "1" and const["accuracy"] == 0.5
    assert const["reward_errors"] == 6  # "0" on each of the 6 prompts
    assert record["train_prior"]["reward_errors"] == 6


def test_a_real_verifier_is_unchanged():
    fn = RewardFunction([(ExactMatchVerifier(answer_format="raw"), 1.0)])
    assert [o.reward for o in fn(["a", "b"], [_ex(), _ex()])] == [1.0, 0.0]


# ----------------------------------------------------------------------------- real runs

REWARDS = '''
import itertools
import math

_calls = itertools.count()
BAD = (1e39, "0.75", math.nan)


def mixed(completion, example):
    """Every third call a bad score in turn (1e39, then "0.75", then NaN); the others a dense 7-share.
    (A run without evaluations calls it once per sample, in order.)"""
    i = next(_calls)
    return BAD[(i // 3) % 3] if i % 3 == 0 else completion.count("7") / max(len(completion), 1)


def huge(completion, example):
    return 1e39


def big(completion, example):
    return 1e7
'''


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = save_tiny_run_inputs(tmp_path_factory.mktemp("bad_rewards"))
    (root / "rewards.py").write_text(REWARDS)
    return root


def _train(root: Path, *args: str) -> subprocess.CompletedProcess:
    return cli_in_process("train", *args)  # the CLI's entry point, in this process (a start costs seconds)


def _reinforge_lines(proc: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    return [line for line in proc.stderr.splitlines() if line.startswith("reinforge:")]


def test_a_run_whose_reward_returns_1e39_text_and_nan_counts_them_and_trains_on(root):
    proc = _train(root, *tiny_run_overrides(root, "mixed", "trainer.samples_to_log=8", "trainer.steps=3",
                                            "trainer.eval_every=0", "trainer.eval_at_start=false",
                                            reward=f"{root / 'rewards.py'}:mixed"))
    assert proc.returncode == 0, proc.stderr
    assert not _reinforge_lines(proc)
    rd = RunDir.open(root / "runs" / "mixed")
    assert rd.status()["state"] == "finished"
    metrics = rd.read_metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, float)), m
        assert m["skipped"] == 0.0 and m["reward_errors"] >= 2  # 8 samples a step, every third bad
    errors = [e for s in rd.read_samples() for e in s["errors"]]
    assert sum(m["reward_errors"] for m in metrics) == len(errors) == 8  # all 24 samples logged
    for words in ("1e+39 is outside ±1e+06 (reward.max_abs_score)", "the str '0.75'", "non-finite score nan"):
        assert any(words in e for e in errors), (words, errors)
    assert all(e.startswith("python: InvalidScore: ") for e in errors)
    # the warning names the first kind, once
    assert proc.stderr.count("verifier python raised InvalidScore") == 1


def test_a_reward_that_is_always_1e39_is_all_errors_not_inf_and_no_baseline_claims_1(root):
    proc = _train(root, *tiny_run_overrides(root, "huge", reward=f"{root / 'rewards.py'}:huge"))
    assert proc.returncode == 0, proc.stderr
    rd = RunDir.open(root / "runs" / "huge")
    for m in rd.read_metrics():
        assert m["reward_mean"] == 0.0 and m["reward_errors"] == 8.0
    for e in rd.read_evals():
        assert e["reward_errors"] == 4  # every held-out answer
        assert e["guardrails"]["best_constant"]["applicable"] is False
        assert "best_constant_accuracy" not in e
    summary = (rd.path / "summary.md").read_text()
    assert ("best constant answer: not applicable (the reward function gave no valid score: all 4 scorings of "
            "constant answers were reward errors") in summary
    assert "training answers' distribution: not applicable (the reward function gave no valid score" in summary


@pytest.mark.parametrize("bound, errors", [(None, 8.0), ("1e8", 0.0)])
def test_the_bound_can_be_raised_for_a_reward_that_means_it(root, bound, errors):
    name = f"big-{bound}"
    proc = _train(root, *tiny_run_overrides(root, name, "trainer.steps=1", "trainer.eval_every=0",
                                            "trainer.eval_at_start=false",
                                            *([f"reward.max_abs_score={bound}"] if bound else []),
                                            reward=f"{root / 'rewards.py'}:big"))
    assert proc.returncode == 0, proc.stderr
    (m,) = RunDir.open(root / "runs" / name).read_metrics()
    assert m["reward_errors"] == errors and m["reward_mean"] == (0.0 if errors else 1e7)


# The NaN guard, driven through the CLI's entry point: an advantage estimator registered here gives
# NaN advantages from its NAN_FROM-th call on (a numerical blow-up).
NAN_FROM = 2
_nan_calls: list[int] = []


def _register_nan_from():
    import reinforge
    from reinforge.algorithms import ADVANTAGE_ESTIMATORS

    if "nan_from" in ADVANTAGE_ESTIMATORS:
        return

    @reinforge.register_advantage("nan_from")
    def nan_from(x):
        _nan_calls.append(1)
        r = x.sequence_rewards()
        return reinforge.Advantages(r - r.mean() + (float("nan") if len(_nan_calls) >= NAN_FROM else 0.0))


@pytest.mark.parametrize("checkpoint_every", [0, 1])
def test_the_nan_guard_says_what_is_true_about_checkpoints(root, checkpoint_every):
    _register_nan_from()
    _nan_calls.clear()
    name = f"nan-{checkpoint_every}"
    args = tiny_run_overrides(root, name, "algorithm.advantage=nan_from", "trainer.steps=4", "trainer.eval_every=0",
                              "trainer.eval_at_start=false", f"trainer.checkpoint_every={checkpoint_every}",
                              "trainer.max_consecutive_nan=2")
    proc = cli_in_process("train", *args)
    run = root / "runs" / name
    (line,) = _reinforge_lines(proc)
    assert proc.returncode != 0
    assert "2 consecutive non-finite losses (steps 2-3; those updates were skipped, so the weights are step 1's)" in line
    ckpts = list_checkpoints(run)
    if checkpoint_every:
        assert ckpts and f"the latest checkpoint is {ckpts[-1][1].name} (step {ckpts[-1][0]})" in line
        assert f"reinforge train --resume {run} --new-segment learner.lr=" in line
    else:
        assert not ckpts
        assert "no checkpoint was written" in line and "nothing to resume from" in line
        assert "intact" not in line
    status = RunDir.open(run).status()
    assert status["state"] == "failed" and status["reason"] == line.split(": ", 2)[2]
    assert [m["skipped"] for m in RunDir.open(run).read_metrics()] == [0.0, 1.0, 1.0]

