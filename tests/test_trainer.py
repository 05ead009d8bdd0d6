"""The controller loop end to end on a tiny real model: learning, exact resume, Ctrl-C and kill,
bad input, failing rewards and NaN losses."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
import torch
from tiny_run import sevens as sevens_reward  # configs name it 'test_trainer:sevens_reward'
from tiny_run import cli_in_process, spawn_cli, tiny_run_overrides, write_task

from reinforge.config import build_config
from reinforge.trainer import Trainer
from reinforge.tracking import RunDir

ROOT = Path(__file__).resolve().parents[1]


# Rewards loaded through the `python` verifier (`module:function`); this file is on sys.path.
def slow_sevens_reward(completion: str, example) -> float:
    """sevens_reward at a known minimum pace (16 samples a step: >= 0.5 s), so that a signal sent
    after step 2 lands well before the run's last step however fast the machine is."""
    time.sleep(0.03)
    return sevens_reward(completion, example)


def raising_reward(completion: str, example) -> float:
    if "a" in completion:
        raise RuntimeError("boom")
    return 0.5


def _config(tmp_path, model_dir, *extra, reward="test_trainer:sevens_reward"):
    """A tiny run (tiny_run_overrides) on `model_dir` and 40 prompts: 4 steps of 4 prompts x 4 samples,
    evaluated and checkpointed every 2 steps; no run name."""
    task = write_task(tmp_path / "task.jsonl", n=40)
    return build_config({}, tiny_run_overrides(
        tmp_path, None, *extra, reward=reward, model=model_dir, task=task, eval_size=8, schedule=(
            "rollout.num_samples=4", "rollout.max_new_tokens=8", "trainer.prompts_per_step=4", "trainer.steps=4",
            "trainer.eval_every=2", "trainer.checkpoint_every=2", "trainer.seed=3", "learner.lr=3e-3")))


@pytest.mark.slow
def test_reward_rises_on_tiny_model(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, "trainer.steps=12", "trainer.eval_every=0",
                  "trainer.checkpoint_every=0", "learner.lr=1e-2")
    result = Trainer(cfg).run()
    rewards = [m["reward_mean"] for m in RunDir.open(result.run_dir).read_metrics()]
    assert len(rewards) == 12
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.2, rewards
    rd = RunDir.open(result.run_dir)
    assert rd.status()["state"] == "finished"
    for name in ("config.yaml", "environment.json", "metrics.jsonl", "samples.jsonl", "evals.jsonl",
                 "learning_curves.png", "summary.md", "summary.json", "final_model/config.json"):
        assert (rd.path / name).exists(), name
    assert not list(rd.path.rglob(".tmp*"))
    # A step is timed phase by phase; the phases make up the step.
    m = rd.read_metrics()[-1]
    phases = ("collect", "score", "prepare", "update", "sync")
    assert all(m[f"time_{p}"] > 0 for p in phases) and m["time_log"] >= 0
    assert m["time_step"] == pytest.approx(sum(m[f"time_{p}"] for p in phases))
    # Right and wrong completions' mean lengths average back to the step's mean length.
    for m in rd.read_metrics():
        acc = m["accuracy"]
        parts = acc * m.get("completion_length_correct", 0.0) + (1 - acc) * m.get("completion_length_incorrect", 0.0)
        assert parts == pytest.approx(m["completion_length"], rel=1e-6), m["step"]
    # Every logged sample records the weight version that sampled it: the policy after step - 1.
    samples = [json.loads(line) for line in (rd.path / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] - s["version"] for s in samples} == {1}


def test_resume_continues_exactly(tmp_path, tiny_model_dir):
    straight = Trainer(_config(tmp_path, tiny_model_dir, "tracking.run_name=straight")).run()
    half = Trainer(_config(tmp_path, tiny_model_dir, "tracking.run_name=resumed", "trainer.steps=2")).run()
    rd = RunDir.open(half.run_dir)
    # Extend the finished 2-step run to 4 steps from its checkpoint.
    cfg = build_config(rd.load_config(), ["trainer.steps=4"])
    Trainer(cfg, run_dir=rd, resume=True).run()
    a = RunDir.open(straight.run_dir).read_metrics()
    b = rd.read_metrics()
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        for key in ("reward_mean", "loss", "grad_norm", "completion_length"):
            assert x[key] == y[key], (key, x["step"], x[key], y[key])
    assert [e["step"] for e in rd.read_evals()] == [0, 2, 4]


def _overrides(cfg) -> list[str]:
    out = []
    for section, values in cfg.to_dict().items():
        if isinstance(values, dict):
            out += [f"{section}.{k}={json.dumps(v)}" for k, v in values.items()]
    return out


def _wait_for_metrics(run_path: Path, n: int, proc, timeout=240.0):
    deadline = time.time() + timeout
    metrics = run_path / "metrics.jsonl"
    while time.time() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= n:
            return
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read())
        time.sleep(0.2)
    raise AssertionError("timed out waiting for metrics")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_interrupted_run_resumes(tmp_path, tiny_model_dir, how):
    cfg = _config(tmp_path, tiny_model_dir, "trainer.steps=6", "trainer.checkpoint_every=1",
                  "trainer.eval_every=0", "tracking.run_name=victim", reward="test_trainer:slow_sevens_reward")
    run_path = tmp_path / "runs" / "victim"
    proc = spawn_cli(["train", *_overrides(cfg)])
    _wait_for_metrics(run_path, 2, proc)
    proc.send_signal(signal.SIGINT if how == "sigint" else signal.SIGKILL)
    out, _ = proc.communicate(timeout=120)
    rd = RunDir.open(run_path)
    if how == "sigint":
        assert proc.returncode == -signal.SIGINT, out
        assert rd.status()["state"] == "interrupted"
        assert "--resume" in out
    else:
        assert proc.returncode == -signal.SIGKILL
    resumed = cli_in_process("train", "--resume", str(run_path))  # the kill needed a process; the resume does not
    assert resumed.returncode == 0, resumed.stderr
    assert [m["step"] for m in rd.read_metrics()] == [1, 2, 3, 4, 5, 6]
    assert rd.status()["state"] == "finished"


def test_failing_reward_scores_zero_and_run_goes_on(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, "trainer.steps=2", "trainer.eval_every=0",
                  reward="test_trainer:raising_reward")
    result = Trainer(cfg).run()
    metrics = RunDir.open(result.run_dir).read_metrics()
    assert len(metrics) == 2
    samples = RunDir.open(result.run_dir).read_samples()
    for s in samples:
        assert s["reward"] == (0.0 if "a" in s["completion"] else 0.5)
        assert bool(s["errors"]) == ("a" in s["completion"])
    # samples.jsonl holds only the first few completions of a step; the metric counts them all
    assert sum(m["reward_errors"] for m in metrics) >= sum(1 for s in samples if s["errors"])


def test_repeated_nan_stops_with_checkpoint_intact(tmp_path, tiny_model_dir, monkeypatch):
    import reinforge.trainer.trainer as trainer_module
    from reinforge.lifecycle.checkpoint import latest_checkpoint, load_checkpoint

    cfg = _config(tmp_path, tiny_model_dir, "trainer.steps=10", "trainer.eval_every=0",
                  "trainer.checkpoint_every=2", "trainer.max_consecutive_nan=2")
    trainer = Trainer(cfg)
    real = trainer_module.compute_advantages
    calls = {"n": 0}

    def blows_up_after_two_steps(*args, **kwargs):  # a numerical blow-up from step 3 on
        calls["n"] += 1
        adv, returns = real(*args, **kwargs)
        return (adv if calls["n"] <= 2 else adv * float("nan")), returns

    monkeypatch.setattr(trainer_module, "compute_advantages", blows_up_after_two_steps)
    with pytest.raises(FloatingPointError, match="non-finite"):
        trainer.run()
    rd = trainer.run_dir
    assert rd.status()["state"] == "failed"
    assert [m["skipped"] for m in rd.read_metrics()] == [0.0, 0.0, 1.0, 1.0]
    ckpt = latest_checkpoint(rd.path)
    assert ckpt.name == "step_000002"
    # skipped updates left the weights as they were at the checkpoint
    saved = load_checkpoint(ckpt)["weights"]
    for name, p in trainer.model.named_parameters():
        assert torch.equal(saved[name], p.detach().cpu()), name


def test_bad_model_path_fails_before_loading(tmp_path):
    proc = cli_in_process(*["train", "model.path=/nonexistent/model", f"tracking.output_dir={tmp_path}"])  # refused: no process of its own needed
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "model.path='/nonexistent/model' does not exist" in out
    assert "Traceback" not in out


def test_bad_config_key_names_accepted_keys(tmp_path):
    proc = cli_in_process(*["train", "trainer.stepz=3"])  # refused: no process of its own needed
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2
    assert "trainer.stepz" in out and "accepted keys here: steps" in out


def test_unknown_task_is_named(tmp_path):
    proc = cli_in_process(*["train", "task.name=leg_countin", f"tracking.output_dir={tmp_path}"])  # refused: no process of its own needed
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "leg_countin" in out and "leg_counting" in out and "Traceback" not in out


def test_lora_with_kl_uses_the_base_model_as_reference(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, "trainer.steps=2", "trainer.eval_every=0",
                  "model.lora={r: 4, alpha: 8}", "algorithm.kl_coef=0.1", "learner.lr=5e-2",
                  "model.dtype=bfloat16")
    trainer = Trainer(cfg)
    result = trainer.run()
    metrics = RunDir.open(result.run_dir).read_metrics()
    assert trainer.learner.reference_model is None  # no second copy: adapters off is the reference
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # step 1 starts at the reference (KL 0); after one update the policy has moved away from it
    assert metrics[0]["kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics[1]["kl"] > 0
    assert (result.run_dir / "final_model" / "adapter_config.json").is_file()
