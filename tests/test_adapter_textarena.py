"""The TextArena adapter (reinforge/agents/adapters/textarena.py) on real games from the installed
package: GuessTheNumber (one player) and TicTacToe (two, with a fixed opponent policy named as
'module:function'): rewards, success, the growing-history observation shown as what is new, seeds
that replay an episode, the trainer's global RNG left alone, and a short training run."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest
import torch

textarena = pytest.importorskip("textarena", reason="TextArena is not installed (pip install 'reinforge[textarena]')")

from reinforge.agents import env_factory  # noqa: E402
from reinforge.agents.adapters import TEXT_ENVS, TextEnvAdapter, run_policy  # noqa: E402
from reinforge.agents.adapters import textarena as ta_adapter  # noqa: E402  (registers env.name: textarena)
from reinforge.config import build_config  # noqa: E402
from reinforge.tasks.base import Example  # noqa: E402

from conftest import save_tiny_model  # noqa: E402

SPEC = TEXT_ENVS["textarena"]
GUESS = {"env_id": "GuessTheNumber-v0", "max_number": 8}  # 1..8 within 10 turns: bisect needs at most 4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _ex(seed: int) -> Example:
    return Example(f"ta/{seed}", [{"role": "user", "content": "x"}], None, {"seed": seed})


def _rng_state():
    return random.getstate(), np.random.get_state()[1].tolist(), np.random.get_state()[2]


# Opponents, named by the configs below as 'test_adapter_textarena:<name>'.
def _moves(observation: str) -> list[str]:
    return re.findall(r"\[\d\]", observation.rsplit("Available Moves:", 1)[-1])


def lowest_cell(observation: str) -> str:
    """TicTacToe: the free cell with the lowest number."""
    return _moves(observation)[0]


def random_cell(observation: str) -> str:
    """TicTacToe: a free cell drawn from the global ``random`` (the episode's stream, isolated)."""
    return random.choice(_moves(observation))


def test_guess_the_number_rewards_success_and_what_the_model_is_shown():
    env = TextEnvAdapter(SPEC, GUESS)
    opening = env.reset(_ex(3))[0]["content"]
    assert "between 1 and 8" in opening and opening.count("You are playing Guess The Number") == 1
    target = env.env.game.game_number
    low = 1 if target != 1 else 2
    r = env.step({"content": f"I guess [{low}]"})
    # replace mode: TextArena hands back the whole history; the model is shown only what was added
    hint = "lower" if low > target else "higher"
    assert not r.done and r.reward == 0.0
    assert r.observations == [{"role": "user", "content": f"[Player] I guess [{low}]\n[GAME] The target number is {hint}."}]
    r = env.step({"content": f"[{target}]"})
    assert r.done and not r.truncated and r.reward == 1.0 and r.info["success"] is True
    assert r.info["env_info"]["rewards"] == {"0": 1.0} and "Congratulations" in r.info["env_info"]["reason"]
    # Two unreadable moves (TextArena allows one retry) end the game with partial credit: not a success.
    env.reset(_ex(3))
    env.step({"content": f"[{low}]"})
    assert not env.step({"content": "no number"}).done  # the retry, with the game's warning
    r = env.step({"content": "still none"})
    assert r.done and 0.0 < r.reward < 1.0 and r.info["success"] is False and r.info["env_info"]["invalid_move"]
    # The game's own turn limit ends it as its rules say: terminated with partial credit, not truncated.
    short = TextEnvAdapter(SPEC, {**GUESS, "max_turns": 2})
    short.reset(_ex(3))
    wrong = [n for n in range(1, 9) if n != target]
    for n in wrong[:3]:
        r = short.step({"content": f"[{n}]"})
        if r.done:
            break
    assert r.done and not r.truncated and r.info["success"] is False and "turn limit" in r.info["env_info"]["reason"]


def test_episodes_replay_from_their_seed_and_leave_the_trainers_rng_alone():
    random.seed(123)
    np.random.seed(123)
    before = _rng_state()
    played = []
    for _ in range(2):
        env = TextEnvAdapter(SPEC, {"env_id": "TicTacToe-v0", "opponent": "test_adapter_textarena:random_cell",
                                    "player": "random"})
        env.reset(_ex(11))
        seat, moves = env.env.player, []
        while not env.done:  # the model's seat plays its lowest free cell; the opponent draws from `random`
            r = env.step({"content": lowest_cell(env.observation)})
            moves.append((r.reward, r.done, r.observations[0]["content"] if r.observations else ""))
        played.append((seat, moves))
    assert played[0] == played[1]  # TextArena seeds the global `random` in reset: here the episode's own
    assert _rng_state() == before  # ...and the trainer's state is where it was
    numbers = set()
    for seed in range(6):
        env = TextEnvAdapter(SPEC, GUESS)
        env.reset(_ex(seed))
        numbers.add(env.env.game.game_number)
    assert len(numbers) > 1


def test_two_player_game_against_a_fixed_opponent():
    env = TextEnvAdapter(SPEC, {"env_id": "TicTacToe-v0", "opponent": "test_adapter_textarena:lowest_cell"})
    opening = env.reset(_ex(0))[0]["content"]
    assert "Available Moves" in opening and env.env.player == 0
    # Seat 0 takes 0, 4, 8 (the diagonal); the opponent's lowest free cells are 1 and 2: seat 0 wins.
    for cell in ("[0]", "[4]"):
        r = env.step({"content": cell})
        assert not r.done and "[Player 1]" in r.observations[0]["content"]  # the opponent moved in between
    r = env.step({"content": "[8]"})
    assert r.done and r.reward == 1.0 and r.info["success"] is True
    assert r.info["env_info"]["rewards"] == {"0": 1.0, "1": -1.0}
    # As seat 1 the model loses to the same opponent (which takes 0, 1, 2): reward -1, no success.
    env = TextEnvAdapter(SPEC, {"env_id": "TicTacToe-v0", "opponent": "test_adapter_textarena:lowest_cell",
                                "player": 1})
    env.reset(_ex(0))
    while not env.done:
        r = env.step({"content": "[8]" if "'[8]'" in env.observation.rsplit("Available", 1)[-1] else "[7]"})
    assert r.reward == -1.0 and r.info["success"] is False
    # The declared random baseline draws from the moves the game lists.
    wins = run_policy(SPEC, {"env_id": "TicTacToe-v0", "opponent": "test_adapter_textarena:lowest_cell"},
                      [_ex(s) for s in range(6)], SPEC.baselines["random"], max_turns=5)
    assert wins == run_policy(SPEC, {"env_id": "TicTacToe-v0", "opponent": "test_adapter_textarena:lowest_cell"},
                              [_ex(s) for s in range(6)], SPEC.baselines["random"], max_turns=5)


@pytest.mark.parametrize("options, message", [
    ({"env_id": "GuessTheNumbr-v0"}, "not a TextArena game; did you mean GuessTheNumber-v0"),
    ({"env_id": "TicTacToe-v0"}, "cannot be played by 1 player.*set env.options.opponent"),
    ({"env_id": "TicTacToe-v0", "opponent": "model"}, "'self_play'.*'frozen'.*module:function"),
    ({"env_id": "TicTacToe-v0", "opponent": "self_play", "player": 1}, "the model plays every seat"),
    ({"env_id": "TicTacToe-v0", "opponent": "frozen", "player": "random"}, "an integer from 0 to 1"),
    ({"env_id": "TicTacToe-v0", "opponent": "test_adapter_textarena:lowest_cell", "player": 2}, "player=2"),
    ({"env_id": "GuessTheNumber-v0", "colour": "red"}, "does not take these options.*colour"),
    ({}, "env_id is required"),
])
def test_bad_options_are_one_clear_line(options, message):
    with pytest.raises(ValueError, match=f"env.options for environment 'textarena': .*{message}"):
        env_factory("textarena", options, None)


def test_missing_textarena_names_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(ImportError, match=r"pip install 'reinforge\[textarena\]'"):
        ta_adapter.make_textarena("GuessTheNumber-v0")


@pytest.fixture
def short_turns(monkeypatch):
    """The trainer's model loader with the tiny model's stop token made much likelier (a forward
    hook on the head), so its turns end and the game is stepped."""
    import reinforge.learner.build as build_mod

    real = build_mod.load_model

    def load(*a, **k):
        model = real(*a, **k)
        eos = model.generation_config.eos_token_id
        model.lm_head.register_forward_hook(lambda _m, _i, out: out + torch.nn.functional.one_hot(
            torch.tensor(eos), out.shape[-1]).to(out.dtype) * 6.0)
        return model

    monkeypatch.setattr(build_mod, "load_model", load)


def test_guess_the_number_trains_and_reports_its_baselines(tmp_path, short_turns):
    from reinforge.tracking import RunDir
    from reinforge.trainer import Trainer

    model = save_tiny_model(tmp_path / "model", hidden=32, layers=1, max_positions=2048)
    cfg = build_config({}, [
        f"model.path={model}", "task.source=env", "task.train_size=8", "task.eval_size=3",
        "env.name=textarena", "env.options={env_id: GuessTheNumber-v0, max_number: 8}", "env.max_turns=4",
        "env.max_tokens_per_turn=6", "env.max_tokens=400", "env.overlap_tools=false", "rollout.num_samples=2",
        "rollout.max_new_tokens=6", "trainer.prompts_per_step=2", "trainer.steps=2", "trainer.eval_every=2",
        "trainer.checkpoint_every=0", "trainer.seed=5", "trainer.num_threads=1",
        f"tracking.output_dir={tmp_path / 'runs'}", "tracking.progress=false"])
    rd = RunDir.open(Trainer(cfg).run().run_dir)
    metrics = rd.read_metrics()
    assert [m["step"] for m in metrics] == [1, 2] and all(np.isfinite(m["loss"]) for m in metrics)
    trajectories = [json.loads(line) for line in (rd.path / "trajectories" / "step_000002.jsonl").read_text().splitlines()]
    assert len(trajectories) == 4
    for t in trajectories:
        assert "You are playing Guess The Number" in t["messages"][0]["content"]
        mask = t["trained_mask"]
        trained = {i for i, m in enumerate(mask) if m}
        assert trained == {i for turn in t["turns"] for i in range(*turn["action_span"])}  # the model's tokens only
        for later in t["messages"][2::2]:  # each later user turn: what the game added, never the whole history again
            assert later["role"] == "user" and later["content"].startswith("[Player]")
            assert "You are playing" not in later["content"]
        if t["done"]:  # the game's own end: its reward, its verdict (the tiny model never solves it)
            assert t["turns"][-1]["info"]["env_info"]["rewards"] == {"0": t["turns"][-1]["reward"]}
            assert t["success"] is False
    assert any(t["messages"][2::2] for t in trajectories)  # the game answered within the token budget
    last = rd.read_evals()[-1]
    baselines = last["guardrails"]["baselines"]
    assert baselines["bisect"]["success"] == 1.0 and 0.0 < baselines["random"]["success"] <= 1.0
    for row in rd.read_eval_details(int(last["step"])):
        assert row["correct"] == float(bool(row["trajectory"]["success"]) and not row["trajectory"]["truncated"])
