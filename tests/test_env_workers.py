"""Environment workers (env.workers, reinforge/agents/env_workers.py): environments in worker
processes, where one that raises, hangs past env.step_timeout_s or kills its process ends that
episode only, the run goes on, the other episodes on a replaced worker are restored, the same
seeds give the same trajectories as in process, and no worker outlives the run."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from pathlib import Path

import pytest
import torch

from reinforge.agents import StepResult, register_env
from reinforge.agents.adapters import TEXT_ENVS, TextEnvAdapter, TextEnvTask, register_text_env
from reinforge.agents.env_workers import EnvWorkerError, EnvWorkerPool
from reinforge.config import ConfigError, build_config
from reinforge.tasks.base import Example, Task

from conftest import save_tiny_model


class FlakyEnv:
    """Two turns then done, unless the example's ``mode`` says how its first step (or its reset)
    fails: raise, hang, exit (kills its process), reset (raises at reset); "random": observations
    from the worker's global random stream (an episode a replay cannot restore)."""

    tools: list[dict] = []
    max_turns = None

    def reset(self, example):
        self.mode, self.n = example.metadata["mode"], 0
        if self.mode == "reset":
            raise RuntimeError("no board today")
        return [dict(m) for m in example.messages]

    def step(self, message):
        self.n += 1
        if self.mode == "raise":
            raise ValueError("the board broke")
        if self.mode == "hang":
            time.sleep(60)
        if self.mode == "exit":
            os._exit(3)
        text = f"turn {self.n} seen" + (f" {random.random()}" if self.mode == "random" else "")
        done = self.n >= 2
        return StepResult([] if done else [{"role": "user", "content": text}], float(done), done,
                          {"pid": os.getpid(), "success": True} if done else {"pid": os.getpid()})


class FlakyTask(Task):
    name = "test_flaky"

    def __init__(self, modes):
        self._ex = [Example(f"flaky/{i}", [{"role": "user", "content": f"episode {i}"}], None, {"mode": m})
                    for i, m in enumerate(modes)]

    def train_examples(self):
        return self._ex

    def eval_examples(self):
        return self._ex[:1]

    def score(self, answer, example):
        return 0.0


def _flaky_task(task_config, modes=("ok",)):
    return FlakyTask(modes)


@register_env("test_flaky", make_task=_flaky_task)
def flaky_env(task, modes=None):
    """A test environment that fails as its example says."""
    return FlakyEnv()


def _ex(i: int, mode: str) -> Example:
    return Example(f"flaky/{i}", [{"role": "user", "content": f"episode {i}"}], None, {"mode": mode})


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_replaced_worker_restores_its_other_episodes_and_close_leaves_no_process():
    pool = EnvWorkerPool("test_flaky", {}, None, workers=1, step_timeout_s=5.0)
    try:
        first = pool.pids[0]
        ok, doomed, rnd = pool(), pool(), pool()
        assert ok.reset(_ex(0, "ok")) == [{"role": "user", "content": "episode 0"}]
        doomed.reset(_ex(1, "exit"))
        rnd.reset(_ex(2, "random"))
        assert ok.step({"role": "assistant", "content": "a"}).observations[0]["content"] == "turn 1 seen"
        rnd.step({"role": "assistant", "content": "a"})
        with pytest.raises(EnvWorkerError, match=r"crash: .*exited \(code 3\) during step"):
            doomed.step({"role": "assistant", "content": "a"})
        # The same worker, a new process: the episode that lived there is replayed and goes on.
        last = ok.step({"role": "assistant", "content": "b"})
        assert last.done and last.info["pid"] not in (first, os.getpid()) and pool.pids == [last.info["pid"]]
        with pytest.raises(EnvWorkerError, match="lost with its worker process .* not restored: the replayed step"):
            rnd.step({"role": "assistant", "content": "b"})  # its replay draws other numbers
        for env in (ok, doomed, rnd):
            env.close()
        pids = pool.pids
    finally:
        pool.close()
    assert pool.pids == [] and not any(_alive(p) for p in (first, *pids))
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("reinforge-env-worker")]


class SeededDice:
    """A text environment drawing its hidden number from the global ``random`` at reset (as GEM's
    games do), which the adapter seeds per episode."""

    def reset(self, seed=None):
        random.seed(seed)
        self.target = random.randint(1, 1000)
        return "guess 1..1000", {}

    def step(self, action):
        hit = action.strip() == str(self.target)
        return f"not {action}", float(hit), hit, False, {"target": self.target}


# A lambda ``make``: the task sent to the workers holds the spec, which travels by name.
register_text_env("test_worker_dice", lambda: SeededDice())


def test_a_text_environment_in_a_worker_replays_its_seeded_episode_as_in_process():
    from reinforge.config import TaskConfig

    task = TextEnvTask(TEXT_ENVS["test_worker_dice"], TaskConfig(source="env", train_size=3, eval_size=1), {})
    pool = EnvWorkerPool("test_worker_dice", {}, task, workers=2, step_timeout_s=5.0)
    try:
        for example in task.train_examples():
            local, remote = TextEnvAdapter(TEXT_ENVS["test_worker_dice"], {}, task=task), pool()
            assert remote.reset(example) == local.reset(example)
            a, b = (env.step({"role": "assistant", "content": "7"}) for env in (local, remote))
            assert (a.observations, a.reward, a.info) == (b.observations, b.reward, b.info)
            remote.close()
    finally:
        pool.close()


def test_bad_options_an_unpicklable_task_and_verifiers_are_refused_before_training():
    with pytest.raises(ValueError, match="env.options for environment 'test_flaky': TypeError: .*unexpected "
                                         "keyword argument 'sides'"):
        EnvWorkerPool("test_flaky", {"sides": 3}, None, workers=1)
    with pytest.raises(ValueError, match=r"the task \(dict\) is sent to each worker process and could not be pickled"):
        EnvWorkerPool("test_flaky", {}, {"made by": lambda: 0}, workers=1)
    with pytest.raises(ConfigError, match="env.workers=2: env.name=verifiers runs its episodes through the verifiers"):
        build_config({"task": {"source": "env"}, "env": {"name": "verifiers", "workers": 2,
                                                         "options": {"taskset": "x"}}})


@pytest.fixture
def eos_bias(monkeypatch):
    """The trainer's tiny model with its stop token made likelier by ``bias`` (set by the test):
    30 ends every turn at once, so that the environment is always stepped; 3 gives turns of a few
    random tokens."""
    import reinforge.learner.build as build_mod

    real = build_mod.load_model
    bias = {"value": 30.0}

    def load(*a, **k):
        model = real(*a, **k)
        eos = model.generation_config.eos_token_id

        def hook(_m, _i, out):
            out = out.clone()
            out[..., eos] += bias["value"]
            return out

        model.lm_head.register_forward_hook(hook)
        return model

    monkeypatch.setattr(build_mod, "load_model", load)
    before = torch.get_num_threads()
    yield bias
    torch.set_num_threads(before)


def _train(tmp_path, name: str, *overrides):
    from reinforge.trainer import Trainer
    from reinforge.tracking import RunDir

    model = save_tiny_model(tmp_path / "model", hidden=32, layers=1, max_positions=1024)
    cfg = build_config({}, [
        f"model.path={model}", "task.source=env", f"env.name={name}", "env.max_turns=3", "env.max_tokens_per_turn=4",
        "env.max_tokens=200", "env.overlap_tools=false", "rollout.num_samples=2", "rollout.max_new_tokens=4",
        "trainer.checkpoint_every=0", "trainer.seed=3", "trainer.num_threads=1", "tracking.progress=false",
        f"tracking.output_dir={tmp_path / 'runs'}", *overrides])
    trainer = Trainer(cfg)
    result = trainer.run()
    return trainer, RunDir.open(result.run_dir)


def test_a_raising_hanging_or_crashing_environment_is_that_episodes_error_and_the_run_finishes(
        tmp_path, eos_bias):
    modes = ["ok", "raise", "hang", "exit", "reset"]
    trainer, rd = _train(tmp_path, "test_flaky", f"env.options={{modes: {json.dumps(modes)}}}", "env.workers=2",
                         "env.step_timeout_s=1.5", "task.train_size=5", "task.eval_size=1", "trainer.prompts_per_step=5",
                         "trainer.steps=1", "trainer.eval_every=0", "trainer.eval_at_start=false")
    rows = [json.loads(line) for line in (rd.path / "trajectories" / "step_000001.jsonl").read_text().splitlines()]
    by_mode = {}
    for r in rows:
        by_mode.setdefault(modes[int(r["example_id"].rsplit("/", 1)[1])], []).append(r)
    for r in by_mode["ok"]:  # untouched by the failures beside it (on the same workers)
        assert r["done"] and r["success"] is True and r["env_error"] is None and r["num_turns"] == 2
    expected = {"raise": "ValueError: the board broke", "hang": "timeout: the environment's step took longer than "
                "env.step_timeout_s=1.5 s", "exit": "crash: the environment's worker process exited (code 3) during step",
                "reset": "RuntimeError: no board today"}
    for mode, reason in expected.items():
        for r in by_mode[mode]:
            assert r["truncation"] == "env_error" and r["env_error"].startswith(reason), (mode, r["env_error"])
    assert all(r["num_turns"] == 0 and r["token_ids"] == [] for r in by_mode["reset"])  # nothing sampled
    metrics = rd.read_metrics()[-1]
    assert metrics["agent/env_errors"] == 8 and metrics["agent/truncated_env_error"] == pytest.approx(0.8)
    # The environments ran elsewhere, and nothing of them outlives the run.
    pids = {t["info"]["pid"] for r in by_mode["ok"] for t in r["turns"]}
    assert pids and os.getpid() not in pids
    assert trainer.generator.make_env.pids == [] and not any(_alive(p) for p in pids)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("reinforge-env-worker")]


_TIMING = ("time", "_s", "per_s", "tokens_per", "memory", "rss")


def test_the_same_seeds_give_the_same_trajectories_with_workers_as_in_process(tmp_path, eos_bias):
    eos_bias["value"] = 3.0  # turns of a few sampled tokens: what the seeds decide shows in the trajectories
    runs = []
    for workers in (0, 2):
        _, rd = _train(tmp_path / str(workers), "guess_number", f"env.workers={workers}", "task.options={high: 8}",
                       "task.train_size=4", "task.eval_size=2", "trainer.prompts_per_step=2", "trainer.steps=2",
                       "trainer.eval_every=2", "trainer.eval_at_start=false", "rollout.temperature=1.0")
        files = sorted((rd.path / "trajectories").glob("step_*.jsonl"))
        metrics = [{k: v for k, v in m.items() if not any(t in k for t in _TIMING)} for m in rd.read_metrics()]
        evals = [{k: v for k, v in m.items() if not any(t in k for t in _TIMING)} for m in rd.read_evals()]
        runs.append(([f.read_text() for f in files], metrics, evals))
    (traj0, metrics0, evals0), (traj2, metrics2, evals2) = runs
    assert len(traj0) == 2 and traj0 == traj2
    assert metrics0 == metrics2 and evals0 == evals2
    # Stopped after step 1 and resumed, the workers replay step 2 as the straight run did.
    from reinforge.trainer import Trainer

    _, rd = _train(tmp_path / "resumed", "guess_number", "env.workers=2", "task.options={high: 8}",
                   "task.train_size=4", "task.eval_size=2", "trainer.prompts_per_step=2", "trainer.steps=1",
                   "trainer.checkpoint_every=1", "trainer.eval_every=2", "trainer.eval_at_start=false",
                   "rollout.temperature=1.0")
    Trainer(build_config(rd.load_config(), ["trainer.steps=2"]), run_dir=rd, resume=True).run()
    assert [f.read_text() for f in sorted((rd.path / "trajectories").glob("step_*.jsonl"))] == traj2
    assert [{k: v for k, v in m.items() if not any(t in k for t in _TIMING)} for m in rd.read_metrics()] == metrics2
    turns = [t for line in traj0[0].splitlines() for t in json.loads(line)["turns"]]
    assert any(t["observations"] for t in turns)  # the environment answered, not just ended
