"""`reinforge reproduce`: a recorded run re-run from its saved config and seeds matches exactly on
CPU, and any difference is reported at the step where it appears."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from tiny_run import save_tiny_run_inputs, tiny_run_overrides

from reinforge.cli import main
from reinforge.config import build_config
from reinforge.tracking import RunDir, read_jsonl, rewrite_jsonl
from reinforge.tracking.reproduce import compare_run_dirs, environment_differences, format_repro_report, is_timing_key
from reinforge.trainer import Trainer


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    root = save_tiny_run_inputs(tmp_path_factory.mktemp("repro"))
    cfg = build_config({}, tiny_run_overrides(root, "orig", reward="exact_match", schedule=(
        "rollout.num_samples=4", "rollout.max_new_tokens=6", "trainer.prompts_per_step=2", "trainer.steps=2",
        "trainer.eval_every=1", "trainer.checkpoint_every=0", "trainer.seed=5", "learner.lr=0.05")))
    return Path(Trainer(cfg).run().run_dir)


@pytest.fixture(scope="module")
def reproduction(original):
    assert main(["reproduce", str(original)]) == 0
    return original.parent / "reproductions" / "orig-repro"


def test_reproduce_matches_exactly(original, reproduction):
    report = json.loads((reproduction / "reproduction.json").read_text())
    assert report["matched"] is True and report["steps_compared"] == 2
    assert report["first_mismatch_step"] is None and report["mismatches"] == []
    assert {"time", "time_collect", "time_step", "tokens_per_s"} <= set(report["ignored_keys"])
    md = (reproduction / "reproduction.md").read_text()
    assert "Exact match" in md and "`tokens_per_s`" in md
    rd = RunDir.open(reproduction)
    assert rd.status()["reproduces"] == str(original) and rd.status()["state"] == "finished"
    assert rd.load_config()["tracking"]["exporters"] == []
    assert [m["step"] for m in rd.read_metrics()] == [1, 2]


def test_a_changed_metric_is_reported_at_its_step(original, reproduction, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(reproduction, copy, ignore=shutil.ignore_patterns("final_model", "checkpoints"))
    metrics = read_jsonl(copy / "metrics.jsonl")
    metrics[1]["loss"] += 1e-9            # step 2: a real difference
    metrics[0]["time_step"] += 5.0        # step 1: timing, ignored
    metrics[0]["tokens_per_s"] *= 2
    rewrite_jsonl(copy / "metrics.jsonl", metrics)
    report = compare_run_dirs(RunDir.open(original), RunDir.open(copy))
    assert not report.matched and report.first_mismatch_step == 2
    assert [(m.file, m.step, m.key) for m in report.mismatches] == [("metrics", 2, "loss")]
    md = format_repro_report(report, RunDir.open(original), RunDir.open(copy))
    assert "first at step 2" in md and "`loss`" in md

    evals = read_jsonl(copy / "evals.jsonl")
    evals[1]["accuracy"] = 0.5            # the step-1 held-out evaluation
    rewrite_jsonl(copy / "evals.jsonl", evals)
    rewrite_jsonl(copy / "samples.jsonl", [s for s in read_jsonl(copy / "samples.jsonl") if s["step"] != 2])
    report = compare_run_dirs(RunDir.open(original), RunDir.open(copy))
    assert report.first_mismatch_step == 1
    assert ("evals", 1, "accuracy") in [(m.file, m.step, m.key) for m in report.mismatches]
    assert report.missing_steps["samples"] == [2]


def test_different_package_versions_are_named(original, reproduction, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(reproduction, copy, ignore=shutil.ignore_patterns("final_model", "checkpoints"))
    env = json.loads((copy / "environment.json").read_text())
    env["packages"]["torch"] = "0.0.1"
    env["torch"]["num_threads"] = 99
    (copy / "environment.json").write_text(json.dumps(env))
    report = compare_run_dirs(RunDir.open(original), RunDir.open(copy))
    assert report.matched  # the numbers still match; the environment note is information
    text = "\n".join(report.environment)
    assert "package torch:" in text and "0.0.1 (reproduction)" in text and "torch threads" in text
    assert environment_differences({"packages": {"a": "1"}}, {"packages": {"b": "2"}}) == [
        "package a: 1 (original) vs not installed (reproduction)",
        "package b: not installed (original) vs 2 (reproduction)",
    ]


def test_reproduce_with_a_changed_setting_fails_and_says_where(original, capsys):
    assert main(["reproduce", str(original), "learner.lr=0.01", "--name", "changed"]) == 1
    out = capsys.readouterr().out
    assert "Mismatch" in out and "first at step 1" in out and "`lr`" in out


def test_timing_keys():
    for key in ("time", "time_step", "time_collect", "tokens_per_s", "train_time_s", "wall_time_s_this_session"):
        assert is_timing_key(key), key
    for key in ("loss", "reward_mean", "completion_length", "timeout_frac", "lr"):
        assert not is_timing_key(key), key
