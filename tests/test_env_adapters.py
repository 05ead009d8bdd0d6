"""Text-environment adapters (reinforge/agents/adapters): the core (episode seeds, observations,
rewards, truncation and success, the global-RNG isolation, baselines in the guardrails) and the
gymnasium and GEM adapters run on real environments from the installed packages, through short
training runs on a tiny model."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from reinforge.agents import AgentBudgets, AgentGenerator, AgentReward, env_factory
from reinforge.agents.adapters import (
    TEXT_ENVS, IsolatedRNG, TextEnvAdapter, TextEnvTask, episode_seeds, register_text_env, run_policy,
)
from reinforge.config import build_config
from reinforge.rewards import build_reward
from reinforge.rollout import HFGenerator, SamplingParams
from reinforge.tasks.base import Example

from conftest import make_model, make_tokenizer, save_tiny_model
from tiny_run import bias_stop_token


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rng_state():
    return random.getstate(), np.random.get_state()[1].tolist(), np.random.get_state()[2]


# -- the core, on a small text environment written here -------------------------------------------


class GlobalDice:
    """Draws its hidden number from the global ``random`` and ``numpy.random`` in make, reset
    and step, as GEM and TextArena games do; success is in ``info`` when it ends."""

    def __init__(self, sides: int = 6, limit: int = 3):
        self.sides, self.limit = sides, limit
        self.noise = random.random() + np.random.rand()  # make draws too

    def reset(self, seed=None):
        if seed is not None:
            random.seed(seed)  # what GEM's reset does to the global stream
            np.random.seed(seed)
        self.target = random.randint(1, self.sides) + int(np.random.randint(0, 1))
        self.n = 0
        return f"Roll: guess 1..{self.sides}.", {}

    def step(self, action):
        self.n += 1
        random.random()
        ok = action.strip() == str(self.target)
        if ok:
            return "", 1.0, True, False, {"success": True}
        if self.n >= self.limit:
            return "out of guesses", 0.0, False, True, {}
        return f"history: guess {self.n} was wrong", 0.0, False, False, {}


register_text_env("test_dice", GlobalDice, baselines={"always_one": lambda obs, rng: "1"})
register_text_env("test_dice_replace", GlobalDice, observation="replace")


def _ex(seed: int, i: int = 0) -> Example:
    return Example(f"dice/{i}", [{"role": "user", "content": "x"}], None, {"seed": seed})


class LockProbe:
    """Records, at each step, whether another thread could take the global-RNG lock meanwhile."""

    def __init__(self, uses_global_rng: bool = True):
        if not uses_global_rng:
            self.uses_global_rng = False
        self.free: list[bool] = []

    def reset(self, seed=None):
        return "go", {}

    def step(self, action):
        import threading

        from reinforge.agents.adapters import base

        got = []

        def probe():
            ok = base._GLOBAL_RNG_LOCK.acquire(timeout=0.2)
            got.append(ok)
            if ok:
                base._GLOBAL_RNG_LOCK.release()

        t = threading.Thread(target=probe)
        t.start()
        t.join()
        self.free.append(got[0])
        return "", 0.0, True, False, {}


register_text_env("test_lock_probe", LockProbe)
register_text_env("test_lock_probe_served", lambda: LockProbe(uses_global_rng=False))


def test_an_env_that_declares_no_global_rng_use_is_stepped_without_the_process_wide_lock():
    for name, free in (("test_lock_probe", False), ("test_lock_probe_served", True)):
        env = TextEnvAdapter(TEXT_ENVS[name], {})
        env.reset(_ex(1))
        env.step({"role": "assistant", "content": "a"})
        assert env.env.free == [free], name


def test_episode_seeds_are_reproducible_and_train_and_held_out_are_disjoint():
    train, held = episode_seeds(3, 500, 50)
    assert (train, held) == episode_seeds(3, 500, 50)
    assert len(set(train)) == 500 and len(set(held)) == 50 and not set(train) & set(held)
    assert episode_seeds(4, 500, 50) != (train, held)
    cfg = build_config({"task": {"source": "env", "train_size": 6, "eval_size": 3, "seed": 3},
                        "env": {"name": "test_dice", "options": {"sides": 4}}})
    from reinforge.agents import build_run_task

    task = build_run_task(cfg)
    assert isinstance(task, TextEnvTask) and task.options == {"sides": 4}
    assert [e.metadata["seed"] for e in task.eval_examples()] == episode_seeds(3, 6, 3)[1]


def test_the_environment_never_moves_the_trainers_global_rng_and_each_episode_replays():
    random.seed(123)
    np.random.seed(123)
    before = _rng_state()
    env = TextEnvAdapter(TEXT_ENVS["test_dice"], {"sides": 1000, "limit": 5})
    env.reset(_ex(7))
    for guess in ("1", "2"):
        env.step({"content": guess})
    env.close()
    assert _rng_state() == before  # make, reset (which reseeds the globals) and step drew and left no trace
    targets = set()
    for burn in (0, 5):  # whatever the global state, the same episode seed gives the same episode
        random.seed(burn)
        e = TextEnvAdapter(TEXT_ENVS["test_dice"], {"sides": 1000})
        e.reset(_ex(7))
        targets.add(e.env.target)
    assert len(targets) == 1
    other = TextEnvAdapter(TEXT_ENVS["test_dice"], {"sides": 1000})
    other.reset(_ex(8))
    assert other.env.target not in targets
    rng = IsolatedRNG(1)
    with rng.active():
        a = random.random()
    with rng.active():
        b = random.random()
    assert a != b and IsolatedRNG(1)._py == random.Random(1).getstate()  # the episode's stream advances


def test_rewards_truncation_success_and_observation_modes():
    env = TextEnvAdapter(TEXT_ENVS["test_dice"], {"sides": 6, "limit": 2})
    opening = env.reset(_ex(1))
    assert opening == [{"role": "user", "content": "Roll: guess 1..6."}]
    wrong = "7"
    r = env.step({"content": wrong})
    assert not r.done and r.observations == [{"role": "user", "content": "history: guess 1 was wrong"}]
    r = env.step({"content": wrong})
    assert r.done and r.truncated and r.info["success"] is False  # cut by the env's limit: not a success
    env.reset(_ex(1))
    r = env.step({"content": str(env.env.target)})
    assert r.done and not r.truncated and r.reward == 1.0 and r.info["success"] is True
    # replace: the environment hands back its whole state; the model is shown what is new
    rep = TextEnvAdapter(TEXT_ENVS["test_dice_replace"], {"limit": 5})
    rep.reset(_ex(1))
    rep.observation = "history:"
    assert rep.step({"content": "9"}).observations[0]["content"] == "guess 1 was wrong"
    rep.observation = "something else"
    assert rep.step({"content": "9"}).observations[0]["content"] == "history: guess 2 was wrong"
    with pytest.raises(ValueError, match="observation='both'; accepted: append, replace"):
        register_text_env("test_bad", GlobalDice, observation="both")


# -- GEM ---------------------------------------------------------------------------------------------

GEM_ID = "game:GuessTheNumber-v0-easy"  # 1..10 within 4 turns


@pytest.fixture
def gem_adapter():
    pytest.importorskip("gem", reason="GEM is not installed (pip install gem-llm --no-deps)")
    from reinforge.agents.adapters import gem as gem_adapter

    return gem_adapter


def test_gem_episodes_replay_from_their_seed_and_leave_the_global_rng_alone(gem_adapter):
    spec = TEXT_ENVS["gem"]
    random.seed(0)
    np.random.seed(0)
    before = _rng_state()
    numbers = []
    for _ in range(2):
        env = TextEnvAdapter(spec, {"env_id": GEM_ID})
        first = env.reset(_ex(11))[0]["content"]
        numbers.append((env.env.env.game_number, first))
        env.step({"content": "\\boxed{3}"})
    assert numbers[0] == numbers[1]
    assert _rng_state() == before  # GEM's reset calls random.seed(seed): isolated
    env.reset(_ex(11))
    r = env.step({"content": "no number here"})  # GEM's format error: -0.1, episode over, no success
    assert r.done and r.reward == pytest.approx(-0.1) and r.info["success"] is False
    with pytest.raises(TypeError, match="is not a GEM environment"):
        TextEnvAdapter(spec, {"env_id": "game:GuessTheNumbr-v0"})


def test_gem_hinted_random_guesses_within_the_hints_and_conversations_are_what_the_agent_sees(gem_adapter,
                                                                                              tmp_path):
    import re
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    from reinforge.agents import build_run_task
    from reinforge.sft import demos_from_file

    raw = {"task": {"source": "env", "train_size": 40, "eval_size": 2, "seed": 3,
                    "few_shot": [{"user": "Guess between 1 and 8 in \\boxed{}.", "assistant": "\\boxed{4}"}]},
           "env": {"name": "gem", "options": {"env_id": GEM_ID}, "max_turns": 4}}
    task = build_run_task(build_config(raw))
    conversations: list = []
    won = run_policy(task.spec, task.options, task.train_examples(), gem_adapter.hinted_random_policy, max_turns=4,
                     task=task, conversations=conversations)
    assert 0.55 <= sum(won) / len(won) <= 0.95  # 0.76 expected; GEM's own random guesses: 0.34
    for played, ok in zip(conversations, won):
        messages, opening = played["messages"], played["opening"]
        # the opening as the agent loop shows it: the few-shot turn, then the game's instructions
        assert [m["role"] for m in messages[:opening]] == ["user", "assistant", "user"]
        assert "between 1 and 10" in messages[2]["content"]
        lo, hi = 1, 10
        for m in messages[opening:]:
            if m["role"] == "assistant":
                g = int(re.fullmatch(r"\\boxed\{(\d+)\}", m["content"])[1])
                assert lo <= g <= hi  # never a guess the hints have ruled out
            else:
                hint = re.search(r"you guessed (\d+), and the target number is (higher|lower)", m["content"])
                lo, hi = (int(hint[1]) + 1, hi) if hint[2] == "higher" else (lo, int(hint[1]) - 1)
        turns = sum(m["role"] == "assistant" for m in messages[opening:])
        assert messages[-1]["role"] == "assistant" and turns <= 4 and (ok or turns == 4)  # a lost game used all 4
    # scripts/env_policy_demos.py: each turn of the games bisect won, as SFT reads it
    (tmp_path / "g.yaml").write_text(yaml.safe_dump(raw))
    script = Path(__file__).resolve().parents[1] / "scripts" / "env_policy_demos.py"
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "g.yaml"), "--policy", "bisect", "--n", "10",
                           "--out", str(tmp_path / "d.jsonl")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "10 of 10 episodes won by bisect" in proc.stdout
    demos = demos_from_file(tmp_path / "d.jsonl")
    assert len(demos) >= 10 and all(d.messages[:2] == conversations[0]["messages"][:2] for d in demos)
    firsts = [d for d in demos if len(d.messages) == 3]  # each game's first turn: bisect's midpoint
    assert len(firsts) == 10 and all(d.response == "\\boxed{5}" for d in firsts)
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "g.yaml"), "--policy", "oracle", "--out",
                          str(tmp_path / "x.jsonl")], capture_output=True, text=True)
    assert bad.returncode == 2 and "declares no baseline 'oracle'; it has: bisect, hinted_random, random" in bad.stderr


class BisectPlayer(TextEnvAdapter):
    """The GEM adapter playing the scripted bisect baseline instead of the tiny model's text, so
    that episodes succeed inside the real agent loop."""

    def step(self, message):
        from reinforge.agents.adapters.gem import bisect_policy

        with self._rng.active():
            action = bisect_policy(self.observation, random.Random(0), env=self.env)
        return super().step({"role": "assistant", "content": action if self.good else "\\boxed{11}"})


def test_gem_success_is_held_out_correct_not_the_verifiers_answer(gem_adapter):
    cfg = build_config({"task": {"source": "env", "train_size": 4, "eval_size": 2},
                        "env": {"name": "gem", "options": {"env_id": GEM_ID}}})
    from reinforge.agents import build_run_task

    task = build_run_task(cfg)
    tok = make_tokenizer()
    model = make_model(tok, hidden=32, layers=1, max_positions=2048)
    eos = tok.eos_token_id
    model.lm_head.register_forward_hook(lambda _m, _i, out: out.index_add(  # turns of a token or two
        -1, torch.tensor([eos]), torch.full(out.shape[:-1] + (1,), 8.0)))
    rows = []
    for good in (True, False):
        def make(good=good):
            env = BisectPlayer(TEXT_ENVS["gem"], {"env_id": GEM_ID}, task=task)
            env.good = good
            return env
        agent = AgentGenerator(HFGenerator(model, tok, batch_size=8), make,
                               AgentBudgets(max_turns=4, max_tokens_per_turn=4, max_tokens=2000))
        torch.manual_seed(0)
        batch = agent.generate_examples(task.eval_examples()[:1], SamplingParams(num_samples=1))
        scores = AgentReward(build_reward(cfg.reward, task)).score(batch, task.eval_examples()[:1])
        rows.append((batch.episodes[0], scores.outcomes[0]))
    (won, won_o), (lost, lost_o) = rows
    assert won.success is True and won.done and won_o.correct  # the task verifier alone scores 0
    # out of turns: GEM pays a partial reward for closeness (or 0), which is not a success
    assert lost.success is False and not lost_o.correct and lost.turns[-1].reward < 1.0
    assert won.turns[-1].reward == 1.0 and won.to_record()["success"] is True


@pytest.fixture
def short_turns(monkeypatch):
    """The tiny model with its stop token made likelier, so that its turns end."""
    bias_stop_token(monkeypatch, 6.0)


def _run(tmp_path, env_name: str, options: str, *extra):
    from reinforge.trainer import Trainer

    model = save_tiny_model(tmp_path / "model", hidden=32, layers=1, max_positions=2048)
    cfg = build_config({}, [
        f"model.path={model}", "task.source=env", "task.train_size=8", "task.eval_size=3",
        f"env.name={env_name}", f"env.options={options}", "env.max_turns=2", "env.max_tokens_per_turn=6",
        "env.max_tokens=400", "env.overlap_tools=false", "rollout.num_samples=2", "rollout.max_new_tokens=6",
        "trainer.prompts_per_step=2", "trainer.steps=2", "trainer.eval_every=2", "trainer.checkpoint_every=0",
        "trainer.seed=5", "trainer.num_threads=1", f"tracking.output_dir={tmp_path / 'runs'}",
        "tracking.progress=false", *extra])
    from reinforge.tracking import RunDir

    return RunDir.open(Trainer(cfg).run().run_dir)


def _check_run(rd):
    """What every adapter's training run must show: action masks on the model's tokens only, the
    environment's reward and verdict in the trajectories, success as held-out correct, baselines."""
    trajectories = [json.loads(line) for line in (rd.path / "trajectories" / "step_000002.jsonl").read_text().splitlines()]
    assert len(trajectories) == 4
    for t in trajectories:
        mask = t["trained_mask"]
        assert len(mask) == len(t["token_ids"])
        spans = [range(*turn["action_span"]) for turn in t["turns"]]
        trained = {i for i, m in enumerate(mask) if m}
        assert trained == {i for s in spans for i in s}  # exactly the model's tokens
        for turn in t["turns"]:
            assert not any(mask[slice(*turn["observation_span"])])
    evals = rd.read_evals()
    last = evals[-1]
    rows = rd.read_eval_details(int(last["step"]))
    for r in rows:
        success = r["trajectory"]["success"]
        assert r["correct"] == float(bool(success) and not r["trajectory"]["truncated"])
    return trajectories, last, rows


def test_an_sft_stage_on_played_games_is_evaluated_through_the_environment(tmp_path, gem_adapter, short_turns,
                                                                           monkeypatch):
    """A warm start for a multi-turn run: SFT on conversations a scripted player won (the file
    scripts/env_policy_demos.py writes), evaluated by playing the held-out games, then RL."""
    import reinforge.sft.runner as sft_runner
    from conftest import add_stop_bias

    from reinforge.agents import build_run_task
    from reinforge.config import ConfigError

    real = sft_runner.load_model

    def load(*a, **k):  # the SFT stage's model too: its held-out turns must end for games to be played
        model = real(*a, **k)
        return add_stop_bias(model, model.generation_config.eos_token_id, 6.0)

    monkeypatch.setattr(sft_runner, "load_model", load)
    env = [f"env.options={{env_id: '{GEM_ID}'}}", "env.name=gem", "task.source=env", "task.train_size=8",
           "task.eval_size=3"]
    task = build_run_task(build_config({}, env))
    played: list = []
    run_policy(task.spec, task.options, task.train_examples()[:4], gem_adapter.bisect_policy, max_turns=4,
               task=task, conversations=played)
    rows = [{"messages": p["messages"][: i + 1]} for p in played for i in range(p["opening"], len(p["messages"]))
            if p["messages"][i]["role"] == "assistant"]
    (tmp_path / "demos.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    sft = (f"sft={{source: file, path: '{tmp_path / 'demos.jsonl'}', apply_prompt_format: false, "
           "num_examples: null, steps: 2, batch_size: 2, lr: 0.01}")
    rd = _run(tmp_path, "gem", f"{{env_id: '{GEM_ID}'}}", "env.max_turns=4", sft)
    stage = type(rd).open(rd.path / "sft")
    assert stage.status()["state"] == "finished" and rd.status()["state"] == "finished"
    for step in (0, 2):  # the SFT stage's held-out evaluations played the games
        details = stage.read_eval_details(step)
        assert len(details) == 3 and all(r["trajectory"]["turns"] for r in details)
    assert "baselines" in stage.read_evals()[-1]["guardrails"]
    with pytest.raises(ConfigError, match="sft.source=task with env.name=gem: an environment's examples have no "
                                          "reference answers.*scripts/env_policy_demos.py"):
        build_config({}, env + ["sft={source: task}"])


def test_gem_guess_the_number_trains_and_reports_its_baselines(tmp_path, gem_adapter, short_turns):
    rd = _run(tmp_path, "gem", f"{{env_id: '{GEM_ID}'}}", "env.max_turns=4")  # bisect needs 4 on 1..10
    trajectories, last, rows = _check_run(rd)
    # The tiny model writes no \boxed{N}: GEM's format error (-0.1) ends the episode, unsuccessful.
    ended = [t for t in trajectories if t["done"]]
    assert ended and all(t["turns"][-1]["reward"] == pytest.approx(-0.1) and t["success"] is False for t in ended)
    baselines = last["guardrails"]["baselines"]
    assert baselines["bisect"]["success"] == 1.0 and 0.0 <= baselines["random"]["success"] < 1.0
    assert last["baseline_bisect_success"] == 1.0
    assert baselines["bisect"]["model_minus"]["diff"] == pytest.approx(last["accuracy"] - 1.0)
    assert last["guardrails"]["best_constant"]["applicable"] is False


def test_gymnasium_frozen_lake_trains_and_reports_its_random_baseline(tmp_path, short_turns):
    pytest.importorskip("gymnasium")
    rd = _run(tmp_path, "gymnasium", "{env_id: FrozenLake-v1, render_mode: ansi, is_slippery: false}")
    trajectories, last, rows = _check_run(rd)
    first = trajectories[0]["messages"][0]["content"]
    assert "[S]FFF" in first and "an integer from 0 to 3" in first
    assert "random" in last["guardrails"]["baselines"]


def test_gymnasium_random_baseline_and_factory_ids():
    gym = pytest.importorskip("gymnasium")
    from reinforge.agents.adapters import gym as gym_adapter

    spec = TEXT_ENVS["gymnasium"]
    opts = {"env_id": "FrozenLake-v1", "render_mode": "ansi", "is_slippery": False, "map_name": "4x4"}
    examples = [_ex(s, s) for s in range(40)]
    wins = run_policy(spec, opts, examples, gym_adapter.random_policy, max_turns=30)
    assert wins == run_policy(spec, opts, examples, gym_adapter.random_policy, max_turns=30)  # seeded per episode
    env = TextEnvAdapter(spec, opts)
    env.reset(_ex(0))
    for a in ("2", "2", "1", "1", "1", "I choose 2"):  # the shortest path to the goal on the 4x4 map
        r = env.step({"content": a})
    assert r.done and r.reward == 1.0 and r.info["success"] is True
    env.reset(_ex(0))
    assert env.step({"content": "go left"}).info["env_info"] == {"invalid_action": True}
    with pytest.raises(ValueError, match="env.options for environment 'gymnasium'.*Box"):
        env_factory("gymnasium", {"env_id": "Pendulum-v1"}, None)  # continuous actions: not text
    assert gym_adapter._factory("gymnasium.envs.toy_text.frozen_lake:generate_random_map") is not None
    assert gym_adapter._factory("FrozenLake-v1") is None and gym is not None


def test_the_verdict_names_a_baseline_policy_the_model_does_not_beat():
    from reinforge.evaluation.guardrails import PromptCounts
    from reinforge.evaluation.verdict import guardrail_lines, guardrail_verdict

    na = {"applicable": False, "reason": "the task is an environment's episodes"}
    diff = {"diff": -0.5, "ci_low": -0.8, "ci_high": -0.2, "excludes_zero": True}
    record = {"well_formed": 1.0, "accuracy_well_formed": 0.5, "distinct_answers": 1, "top_answer": None,
              "top_answer_share": 0.0, "best_constant": na, "train_prior": na,
              "baselines": {"bisect": {"applicable": True, "success": 1.0, "n_episodes": 4, "max_turns": 4,
                                       "model_minus": diff}}}
    model = PromptCounts.from_lists([[1], [0], [1], [0]], [[True]] * 4)
    verdict = guardrail_verdict(model, record, n_resamples=200)
    assert "baseline" in verdict["flags"] and verdict["over_baselines"]["bisect"] == diff
    assert "does not beat the bisect policy's success (1.000)" in verdict["text"]
    assert any(line.startswith("- bisect policy (the environment's baseline, no model): success 1.000")
               for line in guardrail_lines(record))
