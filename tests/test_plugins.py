"""Plugins (issue 29): `--import` and the `imports` key, entry points of installed packages,
`file.py:function` environments with their make_task, the held-out split of rows that carry their
own identity, the reward warnings an agent run needs, and the refusal of Ray with an environment."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from reinforge.agents import ENVS, build_run_task
from reinforge.agents.loop import Episode, TurnRecord
from reinforge.agents.reward_checks import RewardChecks
from reinforge.cli import main
from reinforge.config import ConfigError, build_config
from reinforge.config import plugins
from reinforge.rewards import RewardOutcome, build_reward
from reinforge.rewards.registry import VERIFIER_PLUGINS
from reinforge.tasks import FileTask, TaskError

from tiny_run import bias_stop_token, tiny_run_overrides

ROOT = Path(__file__).resolve().parents[1]

# A plugin as a user writes it: a task made from the environment's options, a one-turn environment
# whose own reward is `penalty`, and a shaping verifier.
PLUGIN = '''
from reinforge.agents import StepResult, register_env
from reinforge.rewards import register_verifier
from reinforge.tasks import Example, Task


class CountTask(Task):
    name = "count"

    def __init__(self, n, env_id):
        def rows(split, k):
            return [Example(f"{env_id}/{split}/{i}", [{"role": "user", "content": f"{env_id}: say {i}"}], str(i))
                    for i in range(k)]
        self._train, self._eval = rows("train", n), rows("eval", 2)

    def train_examples(self):
        return self._train

    def eval_examples(self):
        return self._eval

    def score(self, answer, example):
        return float(str(answer).strip() == example.answer)


class OneTurn:
    tools = []
    max_turns = None

    def __init__(self, penalty):
        self.penalty = penalty

    def reset(self, example):
        return [dict(m) for m in example.messages]

    def step(self, message):
        return StepResult([], self.penalty, True, {})


def make_env(task, *, env_id="count-v0", penalty=0.0):
    """A one-turn test environment."""
    return OneTurn(penalty)


def make_count_task(task_config, *, env_id="count-v0"):
    return CountTask(task_config.train_size, env_id)


def length_share(*, scale=1.0):
    return lambda completion, example: scale * min(len(completion), 100) / 100
'''

REGISTERS = PLUGIN + '''
register_env("plug_count", make_task=make_count_task)(make_env)
register_verifier("plug_len", length_share, correctness=False)
'''


@pytest.fixture
def clean_registries():
    """Plugins register into process-wide tables; each test leaves them as it found them."""
    envs, verifiers = dict(ENVS), dict(VERIFIER_PLUGINS)
    names, imported = set(plugins.REGISTERED_VERIFIERS), dict(plugins._IMPORTED)
    yield
    for table, old in ((ENVS, envs), (VERIFIER_PLUGINS, verifiers), (plugins._IMPORTED, imported)):
        table.clear()
        table.update(old)
    plugins.REGISTERED_VERIFIERS.clear()
    plugins.REGISTERED_VERIFIERS.update(names)


def _agent_run(tmp_path, model_dir, name, *extra) -> list[str]:
    return tiny_run_overrides(
        tmp_path, name, "task.source=env", "task.train_size=4", "env.max_turns=1", "env.max_tokens_per_turn=4",
        "env.max_tokens=8", "trainer.eval_at_start=false", "trainer.eval_every=0", "trainer.checkpoint_every=0",
        *extra, reward="exact_match", model=model_dir, schedule=(
            "rollout.num_samples=2", "rollout.max_new_tokens=4", "trainer.prompts_per_step=2", "trainer.steps=1",
            "trainer.num_threads=1"))


@pytest.fixture
def turns_end(monkeypatch):
    """The tiny model with its stop token made likelier, so that its turns end."""
    bias_stop_token(monkeypatch, 4.0)


def test_import_flag_registers_a_files_env_and_verifier_and_the_run_keeps_them(
        tmp_path, tiny_model_dir, clean_registries, turns_end, capsys, caplog):
    plugin = tmp_path / "my_envs.py"
    plugin.write_text(REGISTERS)
    args = _agent_run(tmp_path, tiny_model_dir, "plug", "env.name=plug_count",
                      "env.options={env_id: abc-v1, penalty: -0.1}",
                      "reward.verifiers=[{name: exact_match}, {name: plug_len, weight: 0.5}]")
    assert main(["train", *args]) == 2  # without the import, neither name exists
    assert "unknown verifier 'plug_len'" in capsys.readouterr().err
    with caplog.at_level(logging.WARNING, logger="reinforge.agents"):
        assert main(["train", "--import", str(plugin), *args]) == 0
    run = tmp_path / "runs" / "plug"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["imports"] == [str(plugin)]
    # make_task got the environment's options: the id is written once, in env.options
    ids = [json.loads(line)["prompt_id"] for line in (run / "samples.jsonl").read_text().splitlines()]
    assert ids and all(i.startswith("abc-v1/train/") for i in ids)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["reward/plug_len"] > 0 and metrics[-1]["agent/done_frac"] > 0
    # the environment's failure (-0.1) pays less than a cut turn (0): the run said so, once
    rambling = [r.getMessage() for r in caplog.records if "env.truncated_reward is unset" in r.getMessage()]
    assert len(rambling) == 1 and "-0.1" in rambling[0]
    # A fresh process validating the saved config (what a Ray worker or `reinforge eval RUN` does)
    # imports the plugin again, so the names resolve there too.
    check = ("import sys, yaml; from reinforge.config import RunConfig; from reinforge.agents import env_spec; "
             "from reinforge.rewards.registry import verifier_plugin; "
             f"RunConfig.model_validate(yaml.safe_load(open({str(run / 'config.yaml')!r}))); "
             "print(env_spec('plug_count').make_task.__name__, verifier_plugin('plug_len').correctness)")
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["make_count_task", "False"]


def test_import_of_a_broken_plugin_is_one_line(tmp_path, clean_registries, capsys):
    bad = tmp_path / "bad_envs.py"
    bad.write_text("import os\nraise RuntimeError('no game server')\n")
    assert main(["train", "--import", str(bad), "trainer.steps=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--import" in err and "bad_envs.py line 2" in err and "no game server" in err
    assert main(["train", "--import", str(tmp_path / "missing.py")]) == 2
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="imports: cannot import module 'no_such_plugin_mod'"):
        build_config({"imports": ["no_such_plugin_mod"]})


def test_file_function_env_finds_its_make_task_with_the_env_options(tmp_path, clean_registries):
    path = tmp_path / "game.py"
    path.write_text(PLUGIN + "make_env.make_task = make_count_task\n"
                    "def old_style_env(task):\n    return OneTurn(0.0)\n"
                    "old_style_env.make_task = lambda task_config: CountTask(3, 'legacy')\n"
                    "def no_task_env(task):\n    return OneTurn(0.0)\n")
    cfg = build_config({"task": {"source": "env", "train_size": 5},
                        "env": {"name": f"{path}:make_env", "options": {"env_id": "guess-v2", "penalty": 0.5}}})
    task = build_run_task(cfg)
    assert len(task.train_examples()) == 5 and task.train_examples()[0].id == "guess-v2/train/0"
    legacy = build_run_task(build_config({"task": {"source": "env"}, "env": {"name": f"{path}:old_style_env"}}))
    assert legacy.train_examples()[0].id == "legacy/train/0"  # make_task(task_config) still works
    with pytest.raises(TaskError, match="makes no examples: give it a make_task"):
        build_run_task(build_config({"task": {"source": "env"}, "env": {"name": f"{path}:no_task_env"}}))


def _install(site: Path, dist: str, module: str, source: str, entry_points: str) -> None:
    """A package as pip leaves it: the module and its dist-info with entry_points.txt."""
    (site / f"{module}.py").write_text(source)
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_entry_points_load_at_the_first_lookup_of_their_names(tmp_path, monkeypatch, clean_registries):
    site = tmp_path / "site"
    site.mkdir()
    _install(site, "rf_test_games", "rf_test_games", PLUGIN + "make_env.make_task = make_count_task\n", """
        [reinforge.envs]
        ep_count = rf_test_games:make_env
        [reinforge.verifiers]
        ep_len = rf_test_games:length_share
        """)
    _install(site, "rf_test_broken", "rf_test_broken", "import not_installed_dependency\n", """
        [reinforge.envs]
        ep_broken = rf_test_broken:make
        """)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "rf_test_games", raising=False)
    cfg = build_config({"task": {"source": "env", "train_size": 3}, "env": {"name": "ep_count",
                        "options": {"env_id": "ep-v0"}}, "reward": {"verifiers": [{"name": "ep_len"}]}})
    assert "rf_test_games" not in sys.modules  # validation only listed the names
    task = build_run_task(cfg)
    assert [e.id for e in task.train_examples()] == ["ep-v0/train/0", "ep-v0/train/1", "ep-v0/train/2"]
    reward = build_reward(cfg.reward, task)
    example = task.train_examples()[0]
    assert reward(["x" * 50], [example])[0].components == {"ep_len": 0.5}
    with pytest.raises(ConfigError, match=r"entry point ep_broken = rf_test_broken:make \(group reinforge.envs\) "
                                          r"of package rf_test_broken 0.1 failed to load: ModuleNotFoundError"):
        build_run_task(build_config({"task": {"source": "env"}, "env": {"name": "ep_broken"}}))


def test_ray_workers_do_not_run_the_agent_loop_so_the_combination_is_refused():
    with pytest.raises(ConfigError, match="scale.mode=ray with env.name=calculator: Ray rollout workers generate "
                                          "single-turn completions.*scale.mode=local"):
        build_config({"env": {"name": "calculator"}, "scale": {"mode": "ray"}})
    build_config({"scale": {"mode": "ray"}})  # single-turn on Ray stays


def _episodes_file(path: Path, seeds: int) -> Path:
    """A game's rows: the same opening prompt for every seed (GEM's GuessTheNumber)."""
    with open(path, "w") as f:
        for s in range(seeds):
            f.write(json.dumps({"prompt": "Guess my number between 1 and 10.", "answer": str(s % 10), "seed": s}) + "\n")
    return path


def test_held_out_split_keeps_distinct_episodes_that_share_a_prompt(tmp_path, caplog):
    path = _episodes_file(tmp_path / "episodes.jsonl", 20)
    with pytest.raises(TaskError, match="no training rows left.*set task.id_field.*task.id_field=seed"):
        FileTask(str(path), eval_size=4)
    task = FileTask(str(path), eval_size=4, id_field="seed")
    train_seeds = {e.metadata["seed"] for e in task.train_examples()}
    eval_seeds = {e.metadata["seed"] for e in task.eval_examples()}
    assert len(train_seeds) == 16 and not train_seeds & eval_seeds
    # most rows dropped, some left: a warning with the count and the fix
    with open(path, "a") as f:
        for i in range(3):
            f.write(json.dumps({"prompt": f"other {i}", "answer": "1", "seed": 100 + i}) + "\n")
    with caplog.at_level(logging.WARNING, logger="reinforge.tasks.file_task"):
        FileTask(str(path), eval_size=2, seed=1)
    msg = " ".join(r.getMessage() for r in caplog.records)
    assert "left out" in msg and "task.id_field=seed" in msg
    with pytest.raises(ConfigError, match="unknown key"):  # the key is validated with the config
        build_config({"task": {"source": "file", "path": str(path), "id_fields": "seed"}})


def _episode(turn_rewards: list[float], truncated: bool = False) -> Episode:
    turns = [TurnRecord(start=i, end=i + 1, text="<answer>3</answer>", reward=r) for i, r in enumerate(turn_rewards)]
    return Episode("e", [], [], turns=turns, done=not truncated, truncated=truncated)


def test_success_rewarded_by_the_env_and_a_verifier_warns_once(caplog):
    from reinforge.tasks.base import Example

    cfg = build_config({"reward": {"verifiers": [{"name": "exact_match"}]}})
    reward = build_reward(cfg.reward, None)
    example = Example("e", [{"role": "user", "content": "?"}], "3")
    episodes = [_episode([0.0, 1.0]), _episode([0.0, 0.0])]
    outcomes = reward([e.final_text for e in episodes], [example, example])
    checks = RewardChecks(truncated_reward=-1.0)
    with caplog.at_level(logging.WARNING, logger="reinforge.agents"):
        checks.observe(episodes, outcomes, reward)
        checks.observe(episodes, outcomes, reward)
    twice = [r.getMessage() for r in caplog.records if "rewarded twice" in r.getMessage()]
    assert len(twice) == 1 and "'exact_match'" in twice[0] and "weight: 0" in twice[0]
    # weight 0 keeps the verifier measuring accuracy without paying: no warning
    caplog.clear()
    quiet = build_reward(build_config({"reward": {"verifiers": [{"name": "exact_match", "weight": 0}]}}).reward, None)
    RewardChecks(-1.0).observe(episodes, quiet([e.final_text for e in episodes], [example, example]), quiet)
    assert not caplog.records


def test_a_set_truncated_reward_above_the_envs_failures_warns():
    checks = RewardChecks(truncated_reward=0.0)
    episodes = [_episode([-0.1]), _episode([0.0], truncated=True)]
    fail = RewardOutcome(0.0, False, {})
    checks.observe(episodes, [fail, fail], reward_fn=None)
    assert "rambling" in checks.warned
    below = RewardChecks(truncated_reward=-0.5)
    below.observe(episodes, [fail, fail], reward_fn=None)
    assert not below.warned
