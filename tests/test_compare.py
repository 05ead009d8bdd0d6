"""Sweeps, the runs index and the multi-seed comparison, on tiny real runs: two learning rates x
three seeds, two steps each."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import yaml
from tiny_run import save_tiny_run_inputs

from reinforge.cli import main
from reinforge.evaluation.compare import compare_runs, flatten_config, is_ignored_key
from reinforge.tracking import RunDir
from reinforge.tracking import run_dir as run_dir_mod
from reinforge.tracking.index import run_info
from reinforge.tracking.sweep import SweepError, load_sweep, plan_sweep, run_sweep

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LRS = [0.003, 0.05]
SEEDS = [0, 1, 2]


def hashed_reward(completion: str, example) -> float:
    """A deterministic pseudo-random verdict per (prompt, completion): held-out accuracy then
    differs between runs whose greedy answers differ (a random tiny model never earns a real
    reward in two steps)."""
    return 1.0 if zlib.crc32(f"{example.id}|{completion}".encode()) % 3 == 0 else 0.0


def _write_inputs(root: Path) -> Path:
    save_tiny_run_inputs(root, prompts=40)
    base = {
        "model": {"path": str(root / "model")},
        "task": {"source": "file", "path": str(root / "task.jsonl"), "eval_size": 6},
        "reward": {"answer_format": "raw",
                   "verifiers": [{"name": "python", "options": {"function": "test_compare:hashed_reward"}}]},
        "rollout": {"num_samples": 4, "max_new_tokens": 6},
        "trainer": {"steps": 2, "prompts_per_step": 2, "eval_every": 1, "checkpoint_every": 0},
        "tracking": {"progress": False},
    }
    (root / "base.yaml").write_text(yaml.safe_dump(base))
    sweep = {"name": "lr_sweep", "base": "base.yaml", "output_dir": str(root / "sweep"), "seeds": SEEDS,
             "grid": {"learner.lr": LRS}}
    (root / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    return root / "sweep.yaml"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    sweep_file = _write_inputs(root)
    assert main(["sweep", str(sweep_file)]) == 0
    return sweep_file, root / "sweep"


def _final_scores(run: Path) -> tuple[float, float]:
    evals = [json.loads(line) for line in (run / "evals.jsonl").read_text().splitlines()]
    final = max(evals, key=lambda e: e["step"])["accuracy"]
    best = max(e["accuracy"] for e in evals if e["step"] > 0)
    return final, best


def _set_status(run: Path, state: str, **extra) -> None:
    """What a writer that ended in ``state`` leaves (written, as every writer does, under the lock)."""
    rd = RunDir.open(run)
    rd.acquire_writer()
    rd.set_status(state, **extra)
    rd.release_writer()


@contextlib.contextmanager
def _lock_holder_process(run: Path):
    """A separate process that holds ``run``'s writer lock until the block ends; yields its pid."""
    code = ("import sys, time; from reinforge.tracking.lock import acquire; acquire(sys.argv[1]); "
            "print('held', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _killed(run: Path) -> None:
    """What a SIGKILL leaves: status "running" with the pid of a process that no longer exists."""
    status = json.loads((run / "status.json").read_text())
    pid = 2**22 + 12345
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        pid += 1
    status.update(state="running", pid=pid)
    (run / "status.json").write_text(json.dumps(status))


def _csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_sweep_makes_one_tagged_run_per_grid_point_and_seed(sweep):
    _, out = sweep
    names = sorted(p.name for p in out.iterdir() if (p / "config.yaml").is_file())
    assert names == sorted(f"lr={lr}-seed{s}" for lr in LRS for s in SEEDS)
    for lr in LRS:
        for s in SEEDS:
            rd = RunDir.open(out / f"lr={lr}-seed{s}")
            cfg = rd.load_config()
            assert cfg["tracking"]["sweep"] == "lr_sweep"
            assert cfg["learner"]["lr"] == lr and cfg["trainer"]["seed"] == s
            assert rd.status()["state"] == "finished"
    plan = json.loads((out / "sweep.json").read_text())
    assert plan["name"] == "lr_sweep" and len(plan["runs"]) == 6
    assert plan["runs"][0] == {"name": "lr=0.003-seed0", "grid": {"learner.lr": 0.003}, "seed": 0}


def test_rerunning_a_sweep_skips_finished_runs(sweep, capsys):
    sweep_file, out = sweep
    before = {p: p.stat().st_mtime_ns for p in out.glob("*/metrics.jsonl")}
    assert main(["sweep", str(sweep_file)]) == 0
    captured = capsys.readouterr()
    assert "0 trained, 6 already finished" in captured.out
    assert captured.err.count("finished, skipped") == 6
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/metrics.jsonl")} == before


def test_sweep_resumes_interrupted_and_stale_runs_and_refuses_a_changed_plan(sweep, tmp_path):
    sweep_file, out = sweep
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for d in copy.iterdir():  # the copies must claim the copy's folder as their output_dir
        if (d / "config.yaml").is_file():
            cfg = yaml.safe_load((d / "config.yaml").read_text())
            cfg["tracking"]["output_dir"] = str(copy)
            (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    _set_status(copy / "lr=0.05-seed1", "interrupted", step=1)
    _killed(copy / "lr=0.003-seed2")
    spec = load_sweep(sweep_file, output_dir=copy)
    calls = []

    def fake_train(cfg, run_dir):
        calls.append((cfg.tracking.run_name, run_dir.path if run_dir else None))
        run_dir.set_status("finished")

    outcome = run_sweep(spec, fake_train, echo=lambda m: None)
    assert sorted(calls) == sorted([("lr=0.05-seed1", copy / "lr=0.05-seed1"),
                                    ("lr=0.003-seed2", copy / "lr=0.003-seed2")])
    assert sorted(outcome.finished) == ["lr=0.003-seed2", "lr=0.05-seed1"] and len(outcome.skipped) == 4

    # another live process is training a run of this sweep (it holds the run's writer lock):
    # refuse rather than train it twice, naming that process
    with _lock_holder_process(copy / "lr=0.05-seed2") as pid:
        with pytest.raises(SweepError, match=f"being trained by pid {pid} on host"):
            run_sweep(spec, fake_train, echo=lambda m: None)

    spec.overrides["trainer.steps"] = 5  # the sweep file was edited after the runs were made
    with pytest.raises(SweepError, match="trainer.steps"):
        run_sweep(spec, fake_train, echo=lambda m: None)


def test_sweep_goes_on_after_a_failed_run_and_stops_on_interrupt(tmp_path, monkeypatch):
    monkeypatch.setattr(run_dir_mod, "collect_environment", lambda cwd=None: ({"git": {}}, None))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(
        {"seeds": [0, 1], "grid": {"rollout.temperature": [1.0, 0.7]}, "output_dir": str(tmp_path / "o"),
         "overrides": ["trainer.steps=3"]}))
    spec = load_sweep(tmp_path / "s.yaml")
    assert [r.name for r in plan_sweep(spec)] == ["temperature=1.0-seed0", "temperature=1.0-seed1",
                                                  "temperature=0.7-seed0", "temperature=0.7-seed1"]

    def train(cfg, run_dir):
        assert cfg.trainer.steps == 3 and cfg.tracking.sweep == "s"
        hot = cfg.rollout.temperature == 1.0
        if cfg.trainer.seed == 0 and hot:
            raise RuntimeError("boom")
        RunDir.create(cfg).set_status("interrupted" if not hot and cfg.trainer.seed == 0 else "finished")

    outcome = run_sweep(spec, train, echo=lambda m: None)
    assert outcome.failed == [("temperature=1.0-seed0", "RuntimeError: boom")]
    assert outcome.finished == ["temperature=1.0-seed1"]
    assert outcome.interrupted == "temperature=0.7-seed0"  # the last run was never started


def test_grid_of_explicit_points(tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"seeds": [3], "grid": [
        {"name": "grpo", "recipe": "grpo"},
        {"name": "dr_grpo", "recipe": "dr_grpo", "algorithm.loss_agg": "token_sum_norm"}]}))
    spec = load_sweep(tmp_path / "s.yaml")
    assert spec.output_dir == Path("runs") / "sweeps" / "s"
    runs = plan_sweep(spec)
    assert [(r.name, r.point, r.seed) for r in runs] == [
        ("grpo-seed3", {"recipe": "grpo"}, 3),
        ("dr_grpo-seed3", {"recipe": "dr_grpo", "algorithm.loss_agg": "token_sum_norm"}, 3)]
    from reinforge.tracking.sweep import run_config

    cfg = run_config(spec, runs[1])
    assert cfg.recipe == "dr_grpo" and cfg.algorithm.loss_agg == "token_sum_norm" and cfg.trainer.seed == 3
    assert cfg.tracking.run_name == "dr_grpo-seed3" and cfg.tracking.sweep == "s"


@pytest.mark.parametrize("content, match", [
    ({"grid": {"a.b": 1}}, "non-empty list"),
    ({"seeds": []}, "seeds"),
    ({"gird": {}}, "unknown key"),
    ({"base": "missing.yaml"}, "not found"),
    ({"grid": {"trainer.seed": [1, 2]}}, "set by the sweep"),
    ({"grid": [{"name": "a", "learner.lr": 0.1}, {"learner.lr": 0.2}]}, "distinct 'name'"),
    ({"grid": 3}, "list of points"),
])
def test_bad_sweep_files_name_the_problem(tmp_path, content, match):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(content))
    with pytest.raises(SweepError, match=match):
        load_sweep(tmp_path / "s.yaml")


def test_runs_lists_every_run_with_status_and_scores(sweep, capsys):
    _, out = sweep
    assert main(["runs", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split()[:5] == ["run", "status", "recipe", "task", "steps"]
    assert len(lines) == 7
    for line in lines[1:]:
        assert "finished" in line and "grpo" in line and "task" in line and "2/2" in line and "lr_sweep" in line
    final, best = _final_scores(out / "lr=0.05-seed2")
    row = next(line for line in lines if line.startswith("lr=0.05-seed2"))
    assert f"{final:.3f}" in row and f"{best:.3f}" in row


def test_compare_groups_runs_and_reports_the_statistics(sweep, tmp_path, capsys):
    _, out = sweep
    report_dir = tmp_path / "report"
    assert main(["compare", str(out), "--out", str(report_dir), "--resamples", "500"]) == 0
    for name in ("report.md", "groups.csv", "runs.csv", "improvement.csv", "curves.csv", "profiles.csv"):
        assert (report_dir / name).is_file(), name
    for name in ("aggregates.png", "improvement.png", "learning_curves.png", "performance_profile.png"):
        assert (report_dir / name).read_bytes()[:8] == PNG_MAGIC, name

    scores = {lr: [_final_scores(out / f"lr={lr}-seed{s}") for s in SEEDS] for lr in LRS}
    groups = {g["group"]: g for g in _csv(report_dir / "groups.csv")}
    assert set(groups) == {"lr=0.003", "lr=0.05"}
    for lr in LRS:
        g = groups[f"lr={lr}"]
        finals = [f for f, _ in scores[lr]]
        bests = [b for _, b in scores[lr]]
        assert int(g["n_runs"]) == 3 and g["seeds"] == "0 1 2"
        # IQM of three runs cuts nothing: it is their mean
        assert float(g["final_iqm"]) == pytest.approx(np.mean(finals), abs=1e-5)
        assert float(g["best_iqm"]) == pytest.approx(np.mean(bests), abs=1e-5)
        lo, hi = float(g["final_ci_low"]), float(g["final_ci_high"])
        assert min(finals) - 1e-6 <= lo <= float(g["final_iqm"]) <= hi <= max(finals) + 1e-6

    # probability of improvement: count pairs by hand
    x = [f for f, _ in scores[0.003]]
    y = [f for f, _ in scores[0.05]]
    hand = np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a in x for b in y])
    imp = [r for r in _csv(report_dir / "improvement.csv") if r["score"] == "final"]
    assert len(imp) == 1 and (imp[0]["x"], imp[0]["y"]) == ("G1", "G2")
    assert float(imp[0]["p_x_beats_y"]) == pytest.approx(hand, abs=1e-5)

    curves = _csv(report_dir / "curves.csv")
    assert sorted({int(r["step"]) for r in curves}) == [0, 1, 2]
    step0 = {r["id"]: float(r["iqm"]) for r in curves if r["step"] == "0"}
    assert step0["G1"] == step0["G2"]  # before training every run is the same model
    assert len(_csv(report_dir / "profiles.csv")) == 2 * 101
    runs = _csv(report_dir / "runs.csv")
    assert len(runs) == 6 and {r["task"] for r in runs} == {"task"}
    # what each run computed in, on what: model.dtype=auto resolved, the CPU from environment.json
    import torch

    from reinforge.precision import cpu_model

    assert {r["dtype"] for r in runs} <= {"float32", "bfloat16"} and len({r["dtype"] for r in runs}) == 1
    assert {r["machine"] for r in runs} == {f"{cpu_model()} ({torch.backends.cpu.get_cpu_capability()})"}

    report = (report_dir / "report.md").read_text()
    assert "`learner.lr`" in report and "Probability of improvement" in report
    assert "IQM" in report and "arXiv:2108.13264" in report and "learning_curves.png" in report
    assert "| G1 | lr=0.003 | 3 |" in report
    assert f"| {runs[0]['dtype']} | {runs[0]['machine']} |" in report


def test_compare_leaves_out_unfinished_runs_unless_asked(sweep, tmp_path):
    _, out = sweep
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, ignore=shutil.ignore_patterns("final_model", "checkpoints"))
    _set_status(copy / "lr=0.05-seed0", "interrupted", step=1)
    res = compare_runs([copy], tmp_path / "r1", n_resamples=200)
    assert [len(v) for v in res.groups.values()] == [3, 2]
    assert any("lr=0.05-seed0" in p and "interrupted" in why for p, why in res.skipped)
    assert "Left out" in (tmp_path / "r1" / "report.md").read_text()
    res = compare_runs([copy], tmp_path / "r2", n_resamples=200, include_unfinished=True)
    assert [len(v) for v in res.groups.values()] == [3, 3]
    # a run whose process died without writing its end state is "stale", and is left out too
    _killed(copy / "lr=0.003-seed1")
    assert run_info(RunDir.open(copy / "lr=0.003-seed1")).state == "stale"
    res = compare_runs([copy], tmp_path / "r3", n_resamples=200)
    assert any("lr=0.003-seed1" in p and "stale" in why for p, why in res.skipped)


def test_group_keys_ignore_seeds_names_and_tracking():
    flat = flatten_config({"trainer": {"seed": 1, "steps": 3}, "tracking": {"run_name": "x"}, "task": {"seed": 2},
                           "model": {"lora": None, "path": "m"}})
    assert flat == {"trainer.seed": "1", "trainer.steps": "3", "tracking.run_name": '"x"', "task.seed": "2",
                    "model.lora": "null", "model.path": '"m"'}
    assert is_ignored_key("trainer.seed") and is_ignored_key("task.seed") and is_ignored_key("tracking.output_dir")
    assert is_ignored_key("trainer.num_threads") and not is_ignored_key("learner.lr")
    assert is_ignored_key("rollout.generation_batch_size", ["rollout.generation_batch_size"])


def test_compare_without_runs_fails_clearly(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["compare", str(tmp_path / "empty")]) == 1
    assert "no run directories" in capsys.readouterr().err
    os.makedirs(tmp_path / "x")
    assert main(["runs", str(tmp_path / "x")]) == 0
    assert "no runs" in capsys.readouterr().out
