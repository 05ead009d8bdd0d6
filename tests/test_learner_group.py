"""``scale.learners=2``: a real run whose learner is two gloo processes on the CPU trains what one
process trains (to float tolerance), through a stop and a resume; a rank that dies fails the run
with a message and leaves it resumable."""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest
import torch
from tiny_run import sevens as sevens_reward  # noqa: F401 (configs name it 'test_learner_group:sevens_reward')
from tiny_run import tiny_run_overrides, write_task

from reinforge.config import ConfigError, build_config
from reinforge.tracking import RunDir
from reinforge.trainer import Trainer

# Values the two runs must share to float tolerance (the gradient sum's addition order differs).
CLOSE_KEYS = ("loss", "pg_loss", "grad_norm", "entropy", "clip_fraction", "advantage_abs_mean", "kl")
EXACT_KEYS = ("reward_mean", "accuracy", "generated_tokens", "completion_length")


@pytest.fixture(autouse=True)
def _keep_torch_threads():
    """The runs here set trainer.num_threads=1, which is process-wide: later tests get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _config(tmp_path, model_dir, *extra):
    task = write_task(tmp_path / "task.jsonl", n=40)
    return build_config({}, tiny_run_overrides(
        tmp_path, None, *extra, reward="test_learner_group:sevens_reward", model=model_dir, task=task, eval_size=8,
        schedule=(
            "rollout.num_samples=4", "rollout.max_new_tokens=8",
            # small micro-batches: every batch has several for the two ranks to share
            "learner.micro_batch_tokens=64", "learner.share_prompt_prefix=false",
            # old log-probs and a reference forward: the sharded no-grad forwards are exercised too
            "algorithm.epochs=2", "algorithm.kl_coef=0.05",
            "trainer.prompts_per_step=4", "trainer.steps=3", "trainer.eval_every=0", "trainer.eval_at_start=false",
            "trainer.checkpoint_every=0", "trainer.seed=3", "trainer.num_threads=1", "learner.lr=3e-3",
        )))


def _weights(path, final: bool = True) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path / "final_model" if final else path).state_dict()


def test_two_learner_ranks_train_what_one_does_through_a_resume(tmp_path, tiny_model_dir):
    one = Trainer(_config(tmp_path, tiny_model_dir, "tracking.run_name=one")).run()

    cfg = _config(tmp_path, tiny_model_dir, "tracking.run_name=two", "scale.learners=2")
    first = Trainer(cfg)
    first.stop_after_step = 2  # stops as Ctrl-C does, once step 2 is checkpointed
    stopped = first.run()
    assert stopped.steps_done == 2 and RunDir.open(stopped.run_dir).status()["state"] == "interrupted"
    assert not multiprocessing.active_children()  # the other rank was stopped with the run
    two = Trainer(cfg, run_dir=RunDir.open(stopped.run_dir), resume=True).run()

    a, b = RunDir.open(one.run_dir).read_metrics(), RunDir.open(two.run_dir).read_metrics()
    assert [m["step"] for m in b] == [1, 2, 3]
    for x, y in zip(a, b):
        for key in EXACT_KEYS:
            assert x[key] == y[key], (key, x["step"])
        for key in CLOSE_KEYS:
            assert y[key] == pytest.approx(x[key], rel=1e-4, abs=1e-6), (key, x["step"])
    assert a[-1]["kl"] > 0  # the reference forward (sharded like the others) was in the loss
    wa, wb = _weights(one.run_dir), _weights(two.run_dir)
    for name, value in wa.items():
        torch.testing.assert_close(wb[name], value, rtol=1e-4, atol=1e-5)
    start = _weights(tiny_model_dir, final=False)
    assert any(not torch.equal(wa[n], start[n]) for n in wa)  # the runs trained: not two untouched models
    assert not multiprocessing.active_children()


class _KillsRankOne(Trainer):
    """A trainer whose second learner rank is SIGKILLed before step 2's update."""

    def update(self, prepared, step):
        if step == 2:
            proc = self.learner._procs[0]
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
        return super().update(prepared, step)


def test_a_dead_rank_fails_the_run_with_the_resume_and_it_resumes(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, "tracking.run_name=dies", "scale.learners=2",
                  "trainer.checkpoint_every=1", "algorithm.epochs=1", "algorithm.kl_coef=0")
    with pytest.raises(RuntimeError, match="learner rank process reinforge-learner-1 exited.*resume"):
        _KillsRankOne(cfg).run()
    run = RunDir.open(next((tmp_path / "runs").iterdir()))
    assert run.status()["state"] == "failed" and "reinforge-learner-1" in run.status()["reason"]
    assert not multiprocessing.active_children()
    resumed = Trainer(cfg, run_dir=run, resume=True).run()
    assert resumed.steps_done == 3 and [m["step"] for m in run.read_metrics()] == [1, 2, 3]


def test_learner_ranks_are_refused_where_they_cannot_run(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="scale.learners=2.*critic"):
        _config(tmp_path, tiny_model_dir, "scale.learners=2", "recipe=ppo")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        from reinforge.scale.learner_group import _check_devices

        with pytest.raises(ConfigError, match="scale.learners=2 puts one learner rank on each GPU"):
            _check_devices(torch.device("cuda", 0), 2)
