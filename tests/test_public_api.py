"""Training from Python: ``import reinforge`` gives the trainer, the config loaders, the registries
and the environment types; a reward and an environment defined in the training script itself are
used as objects and recorded in config.yaml as names a later process can load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import save_tiny_model

import reinforge
from reinforge.config import callable_name

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent('''
    import sys

    import reinforge
    from reinforge import StepResult, register_env


    def sevens(completion: str, example) -> float:
        return completion.count("7") / max(len(completion), 1)


    class Echo:
        """Two turns: the second user turn repeats the model's first answer."""

        def __init__(self, turns):
            self.turns, self.seen = turns, 0

        def reset(self, example):
            return [dict(m) for m in example.messages]

        def step(self, message):
            self.seen += 1
            done = self.seen >= self.turns
            return StepResult([] if done else [{"role": "user", "content": message["content"][:8]}], 0.0, done, {})


    @register_env("script_echo")
    def echo_env(task, *, turns: int = 2):
        return Echo(turns)


    if __name__ == "__main__":
        model, task, runs, reward = sys.argv[1:5]
        cfg = reinforge.build_config({}, [
            f"model.path={model}", "task.source=file", f"task.path={task}", "task.eval_size=2",
            "reward.answer_format=raw", "rollout.num_samples=2", "rollout.max_new_tokens=4",
            "trainer.prompts_per_step=2", "trainer.steps=2", "trainer.eval_every=0",
            "trainer.eval_at_start=false", "trainer.checkpoint_every=0", "env.max_turns=2",
            "env.max_tokens_per_turn=4", "env.max_tokens=32", f"tracking.output_dir={runs}",
            "tracking.progress=false",
        ],
            # the reward as the function object, or by the name a later process would use (which
            # imports this file again and so registers script_echo a second time)
            reward={"verifiers": [{"name": "python",
                                   "options": {"function": sevens if reward == "object" else f"{__file__}:sevens"}}]},
            env={"name": "script_echo"},
        )
        result = reinforge.Trainer(cfg).run()
        print("RUN", result.run_dir, result.steps_done)
''')


@pytest.fixture(scope="module")
def script_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("script")
    save_tiny_model(root / "model", hidden=32, layers=1)
    (root / "task.jsonl").write_text("".join(json.dumps({"prompt": f"say {i}", "answer": "7"}) + "\n"
                                             for i in range(8)))
    (root / "train.py").write_text(SCRIPT)
    return root


@pytest.mark.parametrize("reward", ["object", "name"])
def test_a_script_trains_with_its_own_reward_and_environment(script_dir, reward):
    runs = script_dir / f"runs-{reward}"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "train.py", str(script_dir / "model"), str(script_dir / "task.jsonl"),
                           str(runs), reward], cwd=script_dir, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir, steps = proc.stdout.split("RUN ")[1].split()
    assert steps == "2"
    saved = yaml.safe_load((Path(run_dir) / "config.yaml").read_text())
    # recorded as a name another process can load: the script's own file and the function's name
    assert saved["reward"]["verifiers"][0]["options"]["function"] == f"{script_dir / 'train.py'}:sevens"
    assert saved["env"]["name"] == "script_echo"
    metrics = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["agent/env_errors"] == 0 and 1 <= m["agent/turns"] <= 2 for m in metrics)  # the script's env ran

    if reward == "object":
        return  # both record the same name: the later process's load below is checked once
    # a later process (reinforge reproduce, a Ray worker) loads the recorded name: this imports the
    # script as a module, which registers its environment again without error
    check = ("import sys; from reinforge.rewards.verifiers import load_callable; "
             "from reinforge.agents import env_spec; "
             f"f = load_callable({saved['reward']['verifiers'][0]['options']['function']!r}); "
             "print(f('777x', None)); print(env_spec('script_echo').name)")
    out = subprocess.run([sys.executable, "-c", check], cwd=script_dir, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["0.75", "script_echo"]


def _reward(completion: str, example) -> float:
    return 1.0


def test_a_callable_in_a_config_is_recorded_by_name_and_given_back_as_itself(tmp_path):
    from reinforge.rewards.verifiers import load_callable

    cfg = reinforge.build_config({}, ["task.source=file", f"task.path={tmp_path / 'x.jsonl'}"],
                                 reward={"verifiers": [{"name": "python", "options": {"function": _reward}}]})
    name = cfg.reward.verifiers[0].options["function"]
    assert name == "test_public_api:_reward" == callable_name(_reward)
    assert load_callable(name) is _reward
    assert yaml.safe_load(cfg.to_yaml())["reward"]["verifiers"][0]["options"]["function"] == name


def test_the_same_environment_registered_twice_is_accepted_and_another_is_refused():
    from reinforge.agents import ENVS

    def twin(task):
        """first"""

    def make():
        def twin(task):  # the same qualified name in the same file: a module imported again
            """second"""
        return twin

    reinforge.register_env("test_public_twin")(twin)
    reinforge.register_env("test_public_twin")(twin)
    assert ENVS["test_public_twin"].factory is twin
    with pytest.raises(ValueError, match="already registered"):
        reinforge.register_env("test_public_twin")(make())  # another function under the same name


def test_every_public_name_resolves_and_is_listed():
    for name in reinforge.__all__:
        assert getattr(reinforge, name) is not None
    assert set(dir(reinforge)) >= set(reinforge.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        reinforge.nope  # noqa: B018


MOVED = [
    ("reinforge.trainer.checkpoint", "reinforge.lifecycle.checkpoint"),
    ("reinforge.trainer.resume", "reinforge.lifecycle.resume"),
    ("reinforge.trainer.stopping", "reinforge.lifecycle.stopping"),
    ("reinforge.trainer.progress", "reinforge.lifecycle.progress"),
    ("reinforge.trainer.summary", "reinforge.lifecycle.summary"),
    ("reinforge.reward_models.scorer", "reinforge.rewards.models.scorer"),
    ("reinforge.reward_models.steps", "reinforge.rewards.models.steps"),
    ("reinforge.reward_models.guard", "reinforge.rewards.models.guard"),
    ("reinforge.reward_models.verifiers", "reinforge.rewards.models.verifiers"),
    ("reinforge.curriculum.config", "reinforge.config.curriculum"),
]


@pytest.fixture(scope="module")
def old_imports():
    """Each old path imported afresh in one new process (not one process per path: each start
    costs seconds on two cores): what the import warned, and whether it is the moved module."""
    code = ("import importlib, sys, warnings\n"
            f"for old, new in {MOVED!r}:\n"
            "    new_mod = importlib.import_module(new)\n"
            "    sys.modules.pop(old, None)\n"
            "    warnings.simplefilter('error')\n"
            "    try:\n        importlib.import_module(old)\n        warned = 'no warning'\n"
            "    except DeprecationWarning as w:\n        warned = str(w)\n"
            "    warnings.simplefilter('ignore'); sys.modules.pop(old, None)\n"
            "    print(old, '|', warned, '|', importlib.import_module(old) is new_mod)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return {line.split(" | ")[0]: line.split(" | ")[1:] for line in out.stdout.splitlines() if " | " in line}


@pytest.mark.parametrize("old,new", MOVED)
def test_an_old_import_path_is_the_moved_module_for_one_release(old_imports, old, new):
    warned, same = old_imports[old]
    assert f"{old} moved to {new}" in warned
    assert same == "True"
