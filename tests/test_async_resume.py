"""Issue 28, finding 8: an asynchronous run (Ray rollout workers, algorithm.max_staleness=1) killed
with SIGKILL after a checkpoint and resumed trains exactly what the uninterrupted run trains (its
rollouts sampled ahead are in the checkpoint), the local Ray cluster its driver started dies with
it, and a learner rank killed under a run leaves no leaked semaphore behind.

Each run is a real `reinforge train` process (its own local Ray cluster, 2 CPUs); the three Ray
runs are made once for the module (a cluster costs seconds to start on two cores)."""

from __future__ import annotations

import functools
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tiny_run import cli_env, save_tiny_run_inputs, tiny_run_overrides

from reinforge.tracking import RunDir

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                               reason="needs Ray (pip install 'reinforge[ray]')")

# Keys an exact resume must reproduce step by step (time_*, busy fractions and weight_sync_s are
# timings; worker_restarts counts this process's restarts).
EXACT_KEYS = ("reward_mean", "reward_std", "accuracy", "completion_length", "generated_tokens", "loss", "pg_loss",
              "grad_norm", "entropy", "clip_fraction", "advantage_abs_mean", "staleness_mean", "staleness_max",
              "stale_dropped_groups", "logprob_diff_mean", "logprob_diff_max")
KILL_AFTER = 2   # the driver is SIGKILLed once this step's checkpoint is written
STEPS = 5
GONE_WITHIN_S = 15.0  # every process of the killed driver's Ray cluster is gone within this

# 5 steps of 2 prompts x 4 samples, one rollout worker one policy version ahead (K=1), checkpoints
# at steps 2 and 4 (and 5), one thread for the learner and one for the worker.
_overrides = functools.partial(tiny_run_overrides, reward="tiny_run:sevens", schedule=(
    "rollout.num_samples=4", "rollout.max_new_tokens=6", "trainer.prompts_per_step=2", f"trainer.steps={STEPS}",
    "trainer.eval_every=0", "trainer.eval_at_start=false", f"trainer.checkpoint_every={KILL_AFTER}",
    "trainer.seed=5", "learner.lr=0.05", "trainer.num_threads=1", "scale.mode=ray", "scale.rollout_workers=1",
    "scale.worker_threads=1", "scale.num_cpus=2", "algorithm.max_staleness=1"))


def _train(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "reinforge.cli", "train", *args], check=False, cwd=ROOT, env=cli_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(parent pid, start time, state) of a process, None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[19]), fields[0]


def _descendants(pid: int) -> dict[int, int]:
    """Every process under ``pid`` (children, their children, ...): pid -> start time."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            parents.setdefault(st[0], []).append(int(entry))
    out, todo = {}, list(parents.get(pid, []))
    while todo:
        p = todo.pop()
        if (st := _stat(p)) is not None:
            out[p] = st[1]
            todo += parents.get(p, [])
    return out


def _alive(procs: dict[int, int]) -> dict[int, str]:
    """Those of ``procs`` still running (same start time, not a zombie): pid -> command line."""
    out = {}
    for pid, start in procs.items():
        st = _stat(pid)
        if st is not None and st[1] == start and st[2] != "Z":
            try:
                out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:160]
            except OSError:
                pass
    return out


@pytest.fixture(scope="module")
def killed_async_run(tmp_path_factory):
    """The uninterrupted run; the same run SIGKILLed once its step-2 checkpoint exists (with the
    processes its driver had started, and how long they outlived it); then resumed."""
    root = save_tiny_run_inputs(tmp_path_factory.mktemp("async_resume"))
    _train(*_overrides(root, "straight"))
    run = root / "runs" / "killed"
    log = root / "killed.log"  # (a file: a pipe nobody reads could fill up and hold the run)
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "reinforge.cli", "train", *_overrides(root, "killed")],
                                cwd=ROOT, env=cli_env(), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 300
        while not (run / "checkpoints" / f"step_{KILL_AFTER:06d}").is_dir():
            if proc.poll() is not None:
                raise AssertionError(log.read_text())
            assert time.time() < deadline, "the run wrote no checkpoint in 300 s"
            time.sleep(0.02)
        cluster = _descendants(proc.pid)
        proc.send_signal(signal.SIGKILL)
        killed_at = time.time()
        proc.wait(timeout=60)
        left = _alive(cluster)
        while left and time.time() - killed_at < 120:
            time.sleep(0.25)
            left = _alive(cluster)
        outlived_s = time.time() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    for pid in _alive(cluster):  # (so that a failing test leaves nothing running)
        os.kill(pid, signal.SIGKILL)
    resumed = _train("--resume", str(run))
    return root, run, cluster, left, outlived_s, resumed


def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "final_model" / "model.safetensors"))


@needs_ray
def test_a_killed_async_run_resumes_exactly(killed_async_run):
    root, run, _, _, _, resumed = killed_async_run
    assert f"from the checkpoint of step {KILL_AFTER}" in resumed.stderr, resumed.stderr
    straight = RunDir.open(root / "runs" / "straight").read_metrics()
    got = RunDir.open(run).read_metrics()
    assert [m["step"] for m in got] == list(range(1, STEPS + 1))
    for x, y in zip(straight, got):
        for key in EXACT_KEYS:
            assert x[key] == y[key], (key, x["step"], x[key], y[key])
    # the step after the kill trained on samples one version old, as the uninterrupted run did
    # (a resume that sampled them again with the checkpoint's weights would give staleness 0)
    assert got[KILL_AFTER]["staleness_mean"] == straight[KILL_AFTER]["staleness_mean"] == 1.0
    a, b = _weights(root / "runs" / "straight"), _weights(run)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # what a checkpoint holds (step 4's, written by the resumed run): the request for step 5,
    # issued under version 3, with its result, and the one for step 6 (version 4) to sample again
    rollouts = torch.load(run / "checkpoints" / "step_000004" / "rollouts.pt", weights_only=False)
    assert [(r.key[0], r.min_version, res is not None) for r, res in rollouts["requests"]] == [
        (5, 3, True), (6, 4, False)]


@needs_ray
def test_a_killed_driver_takes_its_ray_cluster_with_it(killed_async_run):
    _, _, cluster, left, outlived_s, _ = killed_async_run
    assert len(cluster) >= 3  # the cluster's own processes and the rollout worker were there
    assert not left, f"still running {outlived_s:.0f} s after the driver was killed: {left}"
    assert outlived_s < GONE_WITHIN_S, f"the driver's Ray processes outlived it by {outlived_s:.1f} s"


@pytest.fixture
def _keep_torch_threads():
    """A trainer set up here sets trainer.num_threads=1, process-wide: later tests get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@needs_ray
def test_the_checkpoint_of_an_abandoned_step_holds_the_rollouts_as_that_step_began(tmp_path, _keep_torch_threads):
    """A stop past the grace period abandons step 2 after its gather took step 2's results; the
    checkpoint of step 1 written then must hold what a checkpoint written right after step 1 holds:
    the request issued before step 1's update with its result (sampled with version 0), the one
    issued after it to sample again, the curriculum after both, and the keys' rounds."""
    from reinforge.config import build_config
    from reinforge.experience import PhaseTimer
    from reinforge.trainer import Trainer

    root = save_tiny_run_inputs(tmp_path)
    trainer = Trainer(build_config({}, _overrides(root, "abandoned")))
    trainer._setup()
    source = trainer.source
    try:
        source.gather(1, PhaseTimer())
        source.publish(trainer.learner.policy_state_dict(), 1)
        sampler, after_step_1 = source.checkpoint_state(1)
        source.gather(2, PhaseTimer())  # the step that is abandoned: it takes step 2's results
        sampler_then, abandoned = source.checkpoint_state(1)
        assert source.completed[-1] == after_step_1["requests"][0][0].id  # (it did take them)

        def requests(state):
            return [(r.id, r.key, r.indices, r.min_version,
                     None if res is None else res.rollout.completion_ids.tolist()) for r, res in state["requests"]]

        assert requests(abandoned) == requests(after_step_1)
        assert [(key[0], version, res is not None) for _, key, _, version, res in requests(abandoned)] == [
            (2, 0, True), (3, 1, False)]
        for key in ("curriculum", "rounds", "next_id", "queue", "state_before", "stats"):
            assert abandoned[key] == after_step_1[key], key
        assert sampler_then == sampler  # (a resume that samples again starts before request 2)
    finally:
        source.close()
        trainer.run_dir.release_writer()


KILL_RANK_CLI = '''
import os, signal, sys
from reinforge.cli import main
from reinforge.trainer import Trainer

update = Trainer.update

def killing_rank_one(self, prepared, step):
    if step == 2:  # the second learner rank dies (SIGKILL) before step 2's update
        proc = self.learner._procs[0]
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
    return update(self, prepared, step)

Trainer.update = killing_rank_one
sys.exit(main(["train", *sys.argv[1:]]))
'''


def test_a_killed_learner_rank_leaks_no_semaphore(tmp_path):
    root = save_tiny_run_inputs(tmp_path)
    args = tiny_run_overrides(root, "dies", "scale.learners=2", "trainer.num_threads=1", "trainer.steps=3",
                              "trainer.eval_every=0", "trainer.eval_at_start=false")
    # (communicate reads to the end: the multiprocessing resource tracker, which prints the
    # warning, shares the run's stderr and exits after it)
    proc = subprocess.run([sys.executable, "-c", KILL_RANK_CLI, *args], check=False, cwd=ROOT, env=cli_env(),
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "learner rank process reinforge-learner-1 exited" in out, out
    assert RunDir.open(root / "runs" / "dies").status()["state"] == "failed"
    assert "leaked semaphore" not in out and "resource_tracker" not in out, out
