"""A run directory has one writer and one true history: the writer lock against a second real
process and a killed holder, what a resume may change (free, new segment, fixed), an accepted
learning rate reaching the optimizer, and segments in summaries, `runs`, `compare` and
`reproduce`. Tiny real models, real `reinforge train` processes."""

from __future__ import annotations

import functools
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import save_tiny_model
from safetensors.torch import load_file
from tiny_run import (assert_same_metrics, copy_run, run_metrics, save_tiny_run_inputs, sevens, spawn_cli,
                      tiny_run_overrides, wait_for_a_logged_step, write_task)

from reinforge.cli import main
from reinforge.config import build_config
from reinforge.evaluation.compare import collect_runs, group_runs
from reinforge.tracking import RunDir, RunLockedError
from reinforge.tracking import lock as lock_mod
from reinforge.tracking.index import run_info
from reinforge.tracking.segments import read_segments
from reinforge.trainer import Trainer
from reinforge.lifecycle.resume import ResumeRefused, plan_resume, resume_config

ROOT = Path(__file__).resolve().parents[1]
HOST = socket.gethostname()


def sevens_reward(completion: str, example) -> float:
    """Share of '7' characters: dense, so a tiny model's updates change its next samples.

    With $TEST_GATE set, the call waits while that file exists and the run $TEST_RUN has logged a
    step: a writer paused mid-run, holding its lock, until the test lets it go on."""
    gate = os.environ.get("TEST_GATE")
    if gate:
        metrics = Path(os.environ["TEST_RUN"]) / "metrics.jsonl"
        while Path(gate).exists() and metrics.exists():
            time.sleep(0.05)
    return sevens(completion, example)


# tiny_run's tiny run (2 steps, evaluated at 0 and 2, checkpointed every step), scored by sevens_reward
_overrides = functools.partial(tiny_run_overrides, reward="test_resume:sevens_reward")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A 2-step run checkpointed at step 2, and the same config run straight for 4 steps."""
    root = save_tiny_run_inputs(tmp_path_factory.mktemp("resume"))
    save_tiny_model(root / "other-model", hidden=32, layers=1, seed=1)
    write_task(root / "task2.jsonl", "write")
    Trainer(build_config({}, _overrides(root, "base"))).run()
    Trainer(build_config({}, _overrides(root, "straight", "trainer.steps=4"))).run()
    return root


def _snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != "writer.lock"}


# ----------------------------------------------------------------------------- what a resume may change


def test_free_changes_apply_without_a_flag_and_are_recorded(base, capsys):
    run = copy_run(base, "base", "free")
    assert main(["train", "--resume", str(run), "trainer.steps=4", "trainer.eval_every=1",
                 "trainer.samples_to_log=1"]) == 0
    err = capsys.readouterr().err
    assert "trainer.steps: 2 -> 4  [free]" in err and "trainer.eval_every: 2 -> 1  [free]" in err
    rd = RunDir.open(run)
    # applied: two more steps, an evaluation at every step from now, one logged sample per step
    assert [m["step"] for m in rd.read_metrics()] == [1, 2, 3, 4]
    assert [e["step"] for e in rd.read_evals()] == [0, 2, 3, 4]
    assert [s["step"] for s in rd.read_samples()].count(3) == 1
    # free means free: the training itself is the uninterrupted run's, exactly
    assert_same_metrics(run, base / "runs" / "straight", (1, 2, 3, 4))
    # recorded: config.yaml is the config in force, segments.json says what changed and when
    assert rd.load_config()["trainer"]["steps"] == 4
    first, second = read_segments(rd)
    assert first.from_step == 1 and first.config["trainer"]["steps"] == 2
    assert second.from_step == 3 and second.resumed_from == 2
    assert {(c.key, c.before, c.after, c.kind) for c in second.changes} == {
        ("trainer.steps", 2, 4, "free"), ("trainer.eval_every", 2, 1, "free"), ("trainer.samples_to_log", 4, 1, "free")}
    assert run_info(rd).segments == 2


def test_a_change_of_what_a_step_computes_needs_new_segment(base, capsys):
    run = copy_run(base, "base", "refused")
    before = _snapshot(run)
    assert main(["train", "--resume", str(run), "trainer.steps=4", "learner.lr=0.01",
                 "algorithm.loss_agg=token_mean"]) == 2
    err = capsys.readouterr().err
    assert "learner.lr: 0.05 -> 0.01: changes what a step computes" in err
    assert "algorithm.loss_agg: seq_mean_token_mean -> token_mean: changes what a step computes" in err
    assert "pass --new-segment" in err and "Traceback" not in err
    assert _snapshot(run) == before  # refused before anything loaded or was written


def test_a_hand_edit_of_config_yaml_is_a_change_like_any_other(base, capsys):
    run = copy_run(base, "base", "edited")
    raw = yaml.safe_load((run / "config.yaml").read_text())
    raw["learner"]["lr"] = 0.01
    (run / "config.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["train", "--resume", str(run)]) == 2
    assert "learner.lr: 0.05 -> 0.01: changes what a step computes" in capsys.readouterr().err


def test_fixed_keys_are_refused_even_with_new_segment(base, capsys):
    run = copy_run(base, "base", "fixed")
    before = _snapshot(run)
    assert main(["train", "--resume", str(run), "--new-segment", f"model.path={base / 'other-model'}",
                 "model.dtype=bfloat16", "tracking.run_name=elsewhere"]) == 2
    err = capsys.readouterr().err
    assert "the checkpoint holds this model's weights" in err
    assert "the checkpoint's weights and optimiser state are in the saved dtype" in err
    assert "the run directory is the one given to --resume" in err and "start a new run" in err
    assert _snapshot(run) == before
    # a PPO critic can be neither added nor removed
    cfg = resume_config(RunDir.open(run).load_config(), ["algorithm.advantage=gae"])
    with pytest.raises(ResumeRefused, match="critic"):
        plan_resume(RunDir.open(run), cfg, new_segment=True, out=io.StringIO())


def test_recipe_on_resume_applies_its_preset_and_lists_every_key(base):
    rd = RunDir.open(base / "runs" / "base")
    cfg = resume_config(rd.load_config(), ["recipe=dr_grpo"])
    # the saved config pins every algorithm key, so the name alone would change nothing
    assert cfg.recipe == "dr_grpo"
    assert cfg.algorithm.scale_rewards == "none" and cfg.algorithm.loss_agg == "token_sum_norm"
    out = io.StringIO()
    with pytest.raises(ResumeRefused) as refused:
        plan_resume(rd, cfg, out=out)
    for line in ("recipe: grpo -> dr_grpo", "algorithm.scale_rewards: group -> none",
                 "algorithm.loss_agg: seq_mean_token_mean -> token_sum_norm", "algorithm.kl_coef: 0.04 -> 0.0"):
        assert line in out.getvalue() and line in str(refused.value)
    plan = plan_resume(rd, cfg, new_segment=True, out=io.StringIO())
    assert {c.key for c in plan.changes} == {"recipe", "algorithm.scale_rewards", "algorithm.loss_agg",
                                             "algorithm.kl_coef"}
    # a later override still wins over the preset
    cfg = resume_config(rd.load_config(), ["algorithm.loss_agg=token_mean", "recipe=dr_grpo"])
    assert cfg.algorithm.loss_agg == "token_mean" and cfg.algorithm.scale_rewards == "none"
    # without the recipe the saved values stay (a plain build_config would keep them too)
    assert resume_config(rd.load_config(), []).to_dict() == rd.load_config()


@pytest.fixture(scope="module")
def lr_run(base):
    """base resumed at step 2 with a new learning rate (and 2 more steps), in a new segment."""
    run = copy_run(base, "base", "lr")
    rd = RunDir.open(run)
    trainer = Trainer(resume_config(rd.load_config(), ["trainer.steps=4", "learner.lr=0.01"]), run_dir=rd,
                      resume=True, new_segment=True)
    trainer.run()
    return run, trainer


def test_a_new_learning_rate_reaches_the_optimizer(base, lr_run):
    run, trainer = lr_run
    assert [g["lr"] for g in trainer.learner.optimizer.param_groups] == [0.01]
    assert trainer.learner.scheduler.base_lrs == [0.01]
    got, straight = run_metrics(run), run_metrics(base / "runs" / "straight")
    assert [got[s]["lr"] for s in (1, 2, 3, 4)] == [0.05, 0.05, 0.01, 0.01]
    # step 3's samples and loss come from the step-2 weights, the same in both runs; its update
    # used the new rate, so the weights after it differ (whatever step 4's samples happen to be)
    assert got[3]["loss"] == straight[3]["loss"] and got[3]["grad_norm"] == straight[3]["grad_norm"]
    mine = load_file(run / "final_model" / "model.safetensors")
    theirs = load_file(base / "runs" / "straight" / "final_model" / "model.safetensors")
    assert any(not torch.equal(mine[k], theirs[k]) for k in mine)
    changes = {c.key: c for c in read_segments(RunDir.open(run))[1].changes}
    lr = changes["learner.lr"]
    assert (lr.before, lr.after, lr.kind) == (0.05, 0.01, "segment") and changes["trainer.steps"].kind == "free"
    summary = (run / "summary.md").read_text()
    assert "Config segments" in summary and "steps 3-4: `learner.lr` 0.05 -> 0.01" in summary


def test_a_task_change_is_a_new_evaluation_regime(base, capsys):
    run = copy_run(base, "base", "task")
    assert main(["train", "--resume", str(run), "--new-segment", "trainer.steps=4",
                 f"task.path={base / 'task2.jsonl'}"]) == 0
    rd = RunDir.open(run)
    assert rd.status()["state"] == "finished"
    summary = json.loads((run / "summary.json").read_text())
    # the step-0 and step-4 evaluations scored different prompts: no before/after pair of them
    assert "heldout_accuracy" not in summary
    assert summary["segments"][1]["from_step"] == 3
    md = (run / "summary.md").read_text()
    assert "the evaluation changed at step 3 (`task.path`) and 1 evaluation(s) were made since" in md


def test_compare_never_averages_a_changed_run_with_unchanged_ones(base, lr_run):
    run, _ = lr_run
    runs, skipped = collect_runs([base / "runs" / "straight", run])
    assert not skipped
    flat = {r.name: r.flat for r in runs}
    assert json.loads(flat["lr"]["segments"]) == "learner.lr=0.01@3"
    assert "segments" not in flat["straight"]
    _, groups = group_runs(runs)
    assert len(groups) == 2 and any("segments=learner.lr=0.01@3" in g for g in groups)


def test_reproduce_replays_segments_at_their_steps(base, lr_run):
    run, _ = lr_run
    assert main(["reproduce", str(run), "--name", "lr-repro"]) == 0
    repro = base / "runs" / "reproductions" / "lr-repro"
    report = json.loads((repro / "reproduction.json").read_text())
    assert report["matched"] is True and report["steps_compared"] == 4
    assert report["segments_replayed"] == [1, 3] and report["segment_differences"] == []
    segs = read_segments(RunDir.open(repro))
    assert [s.from_step for s in segs] == [1, 3]
    assert ("learner.lr", 0.01) in {(c.key, c.after) for c in segs[1].changes}
    assert "replayed at the same steps" in (repro / "reproduction.md").read_text()


# ----------------------------------------------------------------------------- one writer, real processes


def _paused_writer(base: Path, name: str, steps: int) -> tuple[subprocess.Popen, Path, Path]:
    """`reinforge train` in its own process, paused inside step 2 (after logging step 1)."""
    run, gate = base / "runs" / name, base / f"{name}.gate"
    gate.touch()
    proc = spawn_cli(["train", *_overrides(base, name, f"trainer.steps={steps}")], TEST_GATE=str(gate),
                     TEST_RUN=str(run))
    wait_for_a_logged_step(proc, run, "the writer logged no step")
    return proc, run, gate


def test_a_second_writer_is_refused_and_the_run_stays_exact(base, capsys):
    proc, run, gate = _paused_writer(base, "concurrent", steps=4)
    try:
        held = f"being written by pid {proc.pid} on host {HOST}"
        info = run_info(RunDir.open(run))
        assert info.writer["pid"] == proc.pid and info.state == "running"
        assert main(["runs", str(base / "runs")]) == 0
        row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("concurrent"))
        assert f"{proc.pid}@{HOST}" in row
        # a second `reinforge train --resume`, in its own process: one line naming the holder
        second = spawn_cli(["train", "--resume", str(run), "trainer.steps=6"])
        out, _ = second.communicate(timeout=240)
        assert second.returncode == 1, out
        refusals = [line for line in out.splitlines() if line.startswith("reinforge:")]
        assert len(refusals) == 1 and held in refusals[0] and "Traceback" not in out
        # and one in this process, through the library
        with pytest.raises(RunLockedError, match=held):
            RunDir.open(run).acquire_writer()
        # readers neither wait for the lock nor take it: compare and eval of the latest checkpoint
        (scores,), _ = collect_runs([run], include_unfinished=True)
        assert scores.state == "running" and scores.steps == [0]
        assert main(["eval", str(run), "--checkpoint", "latest", "--samples", "2", "--resamples", "100"]) == 0
        assert RunDir.open(run).writer()["pid"] == proc.pid and proc.poll() is None
    finally:
        gate.unlink()
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, out
    rd = RunDir.open(run)
    assert rd.status()["state"] == "finished" and rd.writer() is None
    assert [m["step"] for m in rd.read_metrics()] == [1, 2, 3, 4]  # no step twice
    assert_same_metrics(run, base / "runs" / "straight", (1, 2, 3, 4))
    assert len(read_segments(rd)) == 1 and rd.load_config()["trainer"]["steps"] == 4


def test_a_killed_writer_frees_the_lock_at_once(base):
    proc, run, gate = _paused_writer(base, "killed", steps=4)
    try:
        assert RunDir.open(run).writer()["pid"] == proc.pid
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert RunDir.open(run).writer() is None
        lock_mod.acquire(run, retry_s=0)  # no waiting: the kernel released it with the process
        lock_mod.release(run)
        info = run_info(RunDir.open(run))
        assert info.state == "stale" and info.writer is None
    finally:
        gate.unlink()
    assert main(["train", "--resume", str(run)]) == 0
    assert [m["step"] for m in RunDir.open(run).read_metrics()] == [1, 2, 3, 4]
    assert RunDir.open(run).status()["state"] == "finished"


def test_config_has_no_upward_import():
    code = ("import sys, reinforge.config; "
            "bad = sorted(m for m in sys.modules if m.startswith('reinforge.tracking')); print(bad); "
            "sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stdout + out.stderr


def test_resume_config_file_and_new_segment_misuse_are_named(base, capsys):
    assert main(["train", "some.yaml", "--resume", str(base / "runs" / "base")]) == 2
    assert "give changes as key=value" in capsys.readouterr().err
    assert main(["train", "--new-segment", "trainer.steps=3"]) == 2
    assert "--new-segment applies to --resume" in capsys.readouterr().err


def test_saved_configs_stay_plain_yaml(base, lr_run):
    run, _ = lr_run
    assert yaml.safe_load((run / "config.yaml").read_text())["learner"]["lr"] == 0.01
    raw = json.loads((run / "segments.json").read_text())
    assert raw["segments"][0]["config"]["learner"]["lr"] == 0.05


def test_one_dotted_key_setter_for_every_override():
    from reinforge.config import ConfigError, apply_overrides, set_dotted

    tree: dict = {"trainer": {"steps": 3}}
    value = [1, 2]
    set_dotted(tree, "reward.verifiers", value)
    value.append(3)  # the tree keeps its own copy
    assert tree["reward"]["verifiers"] == [1, 2]
    with pytest.raises(ConfigError, match="'steps' is not a config section"):
        set_dotted(tree, "trainer.steps.x", 1)
    with pytest.raises(ConfigError, match="empty part"):
        set_dotted(tree, "trainer..steps", 1)
    # the command line, `reinforge eval --task` and sweep files all go through it
    assert apply_overrides({}, ["task.options={min_terms: 2}", "trainer.steps=4"]) == {
        "task": {"options": {"min_terms": 2}}, "trainer": {"steps": 4}}
    with pytest.raises(ConfigError, match="not of the form key=value"):
        apply_overrides({}, ["trainer.steps"])
