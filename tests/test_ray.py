"""Rollout workers as Ray actors on a real local Ray cluster (one per test module, 2 CPUs) with a
tiny model: the same metrics as the local mode when synchronous, bounded staleness when not, and a
worker killed mid-run restarted without losing or repeating a sample."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_run import sevens as sevens_reward  # noqa: F401 (configs name it 'test_ray:sevens_reward')
from tiny_run import tiny_run_overrides, write_task

ray = pytest.importorskip("ray")

from reinforge.config import ConfigError, build_config  # noqa: E402
from reinforge.tracking import RunDir  # noqa: E402
from reinforge.trainer import Trainer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Keys whose values must match the local mode exactly (time_* and the ray-only keys differ).
EXACT_KEYS = ("reward_mean", "reward_std", "accuracy", "completion_length", "generated_tokens", "loss",
              "pg_loss", "grad_norm", "entropy", "clip_fraction", "advantage_abs_mean", "truncated_frac")


@pytest.fixture(scope="module")
def ray_cluster():
    """One real local Ray cluster shared by this module's tests (starting one costs seconds)."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield
    ray.shutdown()


def parity_reward(completion: str, example) -> float:
    """1 when the completion's length is even: groups are mixed, and sometimes uniform, so dynamic
    sampling has something to drop."""
    return float(len(completion) % 2 == 0)


def _config(tmp_path, model_dir, *extra, reward="test_ray:sevens_reward"):
    """A tiny run (tiny_run_overrides) on `model_dir` and 40 prompts: 3 steps of 4 prompts x 4 samples,
    neither evaluated nor checkpointed; no run name."""
    task = write_task(tmp_path / "task.jsonl", n=40)
    return build_config({}, tiny_run_overrides(
        tmp_path, None, *extra, reward=reward, model=model_dir, task=task, eval_size=8, schedule=(
            "rollout.num_samples=4", "rollout.max_new_tokens=8", "trainer.prompts_per_step=4", "trainer.steps=3",
            "trainer.eval_every=0", "trainer.eval_at_start=false", "trainer.checkpoint_every=0", "trainer.seed=3",
            "learner.lr=3e-3")))


@pytest.mark.parametrize("extra", [
    (),
    ("algorithm.dynamic_sampling=true", "algorithm.max_sampling_rounds=3"),
], ids=["plain", "dynamic_sampling"])
def test_synchronous_ray_equals_local_step_by_step(tmp_path, tiny_model_dir, ray_cluster, extra):
    reward = "test_ray:parity_reward" if extra else "test_ray:sevens_reward"
    local = Trainer(_config(tmp_path, tiny_model_dir, "tracking.run_name=local", *extra, reward=reward)).run()
    remote = Trainer(_config(tmp_path, tiny_model_dir, "tracking.run_name=ray", "scale.mode=ray",
                             "scale.rollout_workers=1", *extra, reward=reward)).run()
    a, b = RunDir.open(local.run_dir).read_metrics(), RunDir.open(remote.run_dir).read_metrics()
    assert [m["step"] for m in b] == [1, 2, 3]
    for x, y in zip(a, b):
        for key in EXACT_KEYS + (("sampling_rounds", "informative_groups") if extra else ()):
            assert x[key] == y[key], (key, x["step"], x[key], y[key])
        assert y["staleness_max"] == 0 and y["stale_dropped_groups"] == 0 or extra
        assert y["weight_sync_s"] > 0 and "logprob_diff_max" in y
    # every sample the learner saw came from the weights it was training (staleness 0)
    stats = json.loads((remote.run_dir / "scale.json").read_text())
    assert stats["staleness_histogram"] == {"0": 3 * 4 * 4}
    assert len(stats["workers"]) == 1 and 0 < stats["workers"][0]["busy_frac"] <= 1
    samples_a = [(s["prompt_id"], s["completion"]) for s in RunDir.open(local.run_dir).read_samples()]
    samples_b = [(s["prompt_id"], s["completion"]) for s in RunDir.open(remote.run_dir).read_samples()]
    assert samples_a == samples_b


def test_learner_resumes_from_its_checkpoint_exactly(tmp_path, tiny_model_dir, ray_cluster):
    """The learner (the driver) stopped after step 2 and resumed: the workers start again from the
    checkpoint's weights, and with per-request seeds the run equals an uninterrupted one."""
    ray_mode = ("scale.mode=ray", "trainer.checkpoint_every=2")
    straight = Trainer(_config(tmp_path, tiny_model_dir, "tracking.run_name=straight", *ray_mode,
                               "trainer.steps=4")).run()
    half = Trainer(_config(tmp_path, tiny_model_dir, "tracking.run_name=half", *ray_mode, "trainer.steps=2")).run()
    rd = RunDir.open(half.run_dir)
    Trainer(build_config(rd.load_config(), ["trainer.steps=4"]), run_dir=rd, resume=True).run()
    a, b = RunDir.open(straight.run_dir).read_metrics(), rd.read_metrics()
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        for key in EXACT_KEYS:
            assert x[key] == y[key], (key, x["step"], x[key], y[key])


@pytest.mark.parametrize("staleness", [0, 1])
def test_two_workers_stay_within_the_bound(tmp_path, tiny_model_dir, ray_cluster, staleness):
    res = Trainer(_config(tmp_path, tiny_model_dir, "scale.mode=ray", "scale.rollout_workers=2",
                          "scale.worker_threads=1", f"algorithm.max_staleness={staleness}", "trainer.steps=4")).run()
    metrics = RunDir.open(res.run_dir).read_metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert all(m["staleness_max"] <= staleness for m in metrics)
    stats = json.loads((res.run_dir / "scale.json").read_text())
    hist = {int(k): v for k, v in stats["staleness_histogram"].items()}
    assert sum(hist.values()) == 4 * 4 * 4 and set(hist) <= set(range(staleness + 1))
    assert len(stats["workers"]) == 2
    if staleness == 0:
        # each step is split over the two workers, and nothing is generated that is not trained on
        assert all(w["busy_s"] > 0 for w in stats["workers"])
        assert stats["stale_dropped_groups"] == 0 and all(m["stale_dropped_groups"] == 0 for m in metrics)
    else:
        # step 2's rollouts were sampled before step 1's update: trained one version old, or
        # (a slow worker's) dropped as too old at step 3, and counted
        assert hist.get(1, 0) > 0 or stats["stale_dropped_groups"] > 0


def test_killed_worker_is_restarted_and_no_sample_is_lost_or_repeated(tmp_path, tiny_model_dir, ray_cluster):
    from reinforge.experience import PhaseTimer

    cfg = _config(tmp_path, tiny_model_dir, "scale.mode=ray", "scale.rollout_workers=2",
                  "scale.worker_threads=1", "algorithm.max_staleness=1", "rollout.max_new_tokens=64")
    trainer = Trainer(cfg)
    trainer._setup()
    source = trainer.source
    try:
        scored = source.gather(1, PhaseTimer())
        # Step 2's requests are in flight now (staleness 1): kill a worker under them.
        victim = next(w for w in source.workers if w.inflight)
        pid = source.ray.get(victim.handle.pid.remote())
        os.kill(pid, signal.SIGKILL)
        steps = [scored]
        for step in (2, 3):
            source.publish(trainer.learner.policy_state_dict(), step - 1)
            steps.append(source.gather(step, PhaseTimer()))
        assert victim.restarts == 1
        assert source.ray.get(victim.handle.pid.remote()) != pid
        assert sum(s.info["worker_restarts"] for s in steps) == 1
        # every request issued was taken exactly once or is still in flight; none twice
        assert len(source.completed) == len(set(source.completed))
        in_flight = {r.id for _, r in source._refs.values()}
        assert set(source.completed) | in_flight == set(source.issued)
        assert not set(source.completed) & in_flight
        # each step trained on prompts_per_step groups of num_samples rows
        assert [len(s.rollout) for s in steps] == [16, 16, 16]
        # every group of every result is accounted for once: trained, dropped as too stale
        # (counted), or still queued for the next step
        arrived = sum(source.request_groups[i] for i in source.completed)
        trained = sum(s.rollout.num_groups for s in steps)
        dropped = sum(s.info["stale_dropped_groups"] for s in steps)
        assert trained + dropped + sum(c.groups for c in source.queue) == arrived
    finally:
        source.close()
        trainer.run_dir.release_writer()


def test_max_staleness_needs_ray_mode(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="scale.mode=ray"):
        _config(tmp_path, tiny_model_dir, "algorithm.max_staleness=2")
    with pytest.raises(ConfigError, match="sync_every"):
        _config(tmp_path, tiny_model_dir, "scale.mode=ray", "rollout.sync_every=3", "algorithm.max_staleness=1")


def test_missing_ray_names_the_extra(tmp_path):
    """In a fresh interpreter where `import ray` fails, ray mode says what to install."""
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "from reinforge.scale.ray_source import import_ray\n"
        "try:\n    import_ray()\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "pip install 'reinforge[ray]'" in out.stdout, out.stderr


def _request(cfg, worker, rid: int = 0, min_version: int = 0):
    from reinforge.rollout import SamplingParams
    from reinforge.scale.worker import RolloutRequest
    from reinforge.tasks import build_task, encode_prompt

    examples = build_task(cfg.task).train_examples()[:2]
    tok = worker.generator.tokenizer
    return RolloutRequest(rid, (1, 1), [encode_prompt(tok, e) for e in examples], examples, [0, 1],
                          SamplingParams(num_samples=4, max_new_tokens=cfg.rollout.max_new_tokens),
                          min_version=min_version)


def _newer(state: dict) -> dict:
    g = torch.Generator().manual_seed(5)
    return {k: v + 0.5 * torch.randn(v.shape, generator=g) if v.is_floating_point() else v for k, v in state.items()}


def test_partial_rollout_loads_new_weights_between_two_tokens(tmp_path, tiny_model_dir):
    """rollout.partial in a worker (in-process here; the Ray plumbing is the next test): weights
    that arrive after the third token are loaded before the fourth, the KV cache kept; the first
    three tokens are those the old weights draw, and each row records both versions."""
    from reinforge.scale.worker import RolloutWorker

    cfg = _config(tmp_path, tiny_model_dir, "scale.mode=ray", "algorithm.max_staleness=1", "rollout.partial=true",
                  "rollout.max_new_tokens=24")
    worker = RolloutWorker(cfg.to_dict(), 0, None, [])  # (threads None: this process keeps its own)
    req = _request(cfg, worker)
    start = {k: v.clone() for k, v in worker.model.state_dict().items()}
    plain = worker.rollout(req)
    assert plain.info["inflight_weight_loads"] == 0

    calls = 0
    poll = worker._poll_in_flight

    def arriving_after_the_third_token():
        nonlocal calls
        calls += 1
        if calls == 3:  # what the weights thread does when the learner publishes version 1
            worker.set_weights(_newer(start), 1)
        poll()

    worker._poll_in_flight = arriving_after_the_third_token
    mixed = worker.rollout(req)
    a, b = plain.rollout, mixed.rollout
    assert mixed.info["inflight_weight_loads"] == 1 and worker.generator.version == 1
    assert b.versions.tolist() == [0] * 8  # the staleness bound counts a row's oldest token
    long_rows = b.completion_mask.sum(dim=1) > 3
    assert long_rows.any()
    assert b.last_versions[long_rows].eq(1).all() and b.last_versions[~long_rows].eq(0).all()
    assert torch.equal(a.completion_ids[:, :3], b.completion_ids[:, :3])
    assert torch.equal(a.sampler_logprobs[:, :3], b.sampler_logprobs[:, :3])
    assert not torch.equal(a.sampler_logprobs[long_rows, 3:], b.sampler_logprobs[long_rows, 3:])
    worker.close()


def test_partial_request_waits_for_the_weights_published_before_it(tmp_path, tiny_model_dir, ray_cluster):
    """Weights travel on the worker's own thread: a request may reach the worker before the
    weights published ahead of it, and must wait for them rather than sample older ones."""
    import time

    cfg = _config(tmp_path, tiny_model_dir, "scale.mode=ray", "algorithm.max_staleness=1", "rollout.partial=true")
    trainer = Trainer(cfg)
    trainer._setup()
    source = trainer.source
    try:
        w = source.workers[0]
        ref = w.handle.rollout.remote(_request(cfg, trainer, rid=99, min_version=1))
        time.sleep(0.5)
        assert not source.ray.wait([ref], timeout=0)[0]  # waiting for version 1
        source.publish(_newer(trainer.learner.policy_state_dict()), 1, issue=False)
        result = source.ray.get(ref, timeout=60)  # version 1 reached it while the request waited
        assert result.rollout.versions.eq(1).all()
    finally:
        source.close()
        trainer.run_dir.release_writer()


def test_partial_rollouts_train_within_the_bound(tmp_path, tiny_model_dir, ray_cluster):
    res = Trainer(_config(tmp_path, tiny_model_dir, "scale.mode=ray", "algorithm.max_staleness=1",
                          "rollout.partial=true", "rollout.max_new_tokens=32")).run()
    metrics = RunDir.open(res.run_dir).read_metrics()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["staleness_max"] <= 1 and 0 <= m["last_token_staleness_mean"] <= m["staleness_mean"]
        assert 0 <= m["partial_rows_frac"] <= 1 and m["inflight_weight_loads"] >= 0
    stats = json.loads((res.run_dir / "scale.json").read_text())
    assert sum(stats["last_token_staleness_histogram"].values()) == 3 * 4 * 4


def test_partial_needs_asynchronous_ray_workers(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="rollout.partial=true .* scale.mode=ray, algorithm.max_staleness >= 1"):
        _config(tmp_path, tiny_model_dir, "rollout.partial=true")
    with pytest.raises(ConfigError, match="max_staleness=0"):
        _config(tmp_path, tiny_model_dir, "rollout.partial=true", "scale.mode=ray")
