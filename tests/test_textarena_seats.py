"""Games whose every seat is a trajectory of the agent loop (reinforge/agents/seats.py) on real
TextArena TicTacToe games: self-play (both seats trajectories, both trained, a group per episode
seed and seat) and a frozen opponent (the starting model's copy decodes the other seat in the same
batched loop and never changes).

The tiny model is scripted by a forward hook (after '\\n' it writes '[', then a digit 0-8 drawn
by its sampler, then ']' and its stop token), so it plays moves the game reads and games end in
wins, losses and invalid moves within a few turns."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("textarena", reason="TextArena is not installed (pip install 'reinforge[textarena]')")

from reinforge.agents import AgentBudgets, AgentGenerator, env_factory  # noqa: E402
from reinforge.agents.adapters import textarena as _registers  # noqa: E402, F401  (env.name: textarena)
from reinforge.config import build_config  # noqa: E402
from reinforge.rollout.base import SamplingParams  # noqa: E402
from reinforge.rollout.hf import HFGenerator  # noqa: E402
from reinforge.tasks.base import Example  # noqa: E402

from conftest import make_model, make_tokenizer, save_tiny_model  # noqa: E402

TTT = {"env_id": "TicTacToe-v0"}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def scripted(model):
    """Bias the next token by the last one: '\\n' -> '[', '[' -> a digit 0-8, digit -> ']', ']' -> stop."""
    tok = make_tokenizer()
    table = torch.zeros(model.config.vocab_size, model.config.vocab_size)
    idx = tok.convert_tokens_to_ids
    table[idx("\n"), idx("[")] = 30.0
    for d in "012345678":
        table[idx("["), idx(d)] = 30.0
        table[idx(d), idx("]")] = 30.0
    table[idx("]"), tok.eos_token_id] = 30.0

    def hook(_m, args, kwargs, out):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and getattr(out, "logits", None) is not None:
            out.logits = out.logits + table[ids[:, -out.logits.shape[1]:]].to(out.logits.dtype)
        return out

    model.register_forward_hook(hook, with_kwargs=True)
    return model


def _agent(opponent: str, *, frozen=None, kv_reuse=True, overlap_tools=True):
    tok = make_tokenizer()
    gen = HFGenerator(scripted(make_model(tok, hidden=32, layers=1, max_positions=2048)), tok, batch_size=16)
    return AgentGenerator(gen, env_factory("textarena", {**TTT, "opponent": opponent}, None),
                          AgentBudgets(max_turns=5, max_tokens_per_turn=6, max_tokens=1500),
                          kv_reuse=kv_reuse, overlap_tools=overlap_tools, frozen_model=frozen)


def _play(agent, seeds=(1, 2, 3), g=2):
    torch.manual_seed(0)
    examples = [Example(f"ttt/{s}", [{"role": "user", "content": "x"}], None, {"seed": s}) for s in seeds]
    return agent.generate_examples(examples, SamplingParams(num_samples=g, max_new_tokens=6))


def test_self_play_each_seat_is_its_own_trajectory_group_and_reward():
    batch = _play(_agent("self_play"))
    # 3 seeds x 2 seats x 2 samples; a group per (seed, seat), rows of a group contiguous
    assert batch.group_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert [e.id for e in batch.group_examples] == [f"ttt/{s}/seat{k}" for s in (1, 2, 3) for k in (0, 1)]
    eps = batch.episodes
    assert [e.seat for e in eps] == [0, 0, 1, 1] * 3 and [e.example_id for e in eps[:4]] == ["ttt/1/seat0"] * 2 + ["ttt/1/seat1"] * 2
    won = 0
    for i in range(3):
        for j in range(2):  # sample j of seed i: one game, seat 0's row and seat 1's row
            s0, s1 = eps[4 * i + j], eps[4 * i + 2 + j]
            assert "You are Player 0" in s0.messages[0]["content"] and "You are Player 1" in s1.messages[0]["content"]
            assert "[Player 0]" in s1.messages[0]["content"]  # seat 1 opens after seat 0's first move
            for ep, other in ((s0, "[Player 1]"), (s1, "[Player 0]")):
                trained = {k for k, m in enumerate(ep.action_mask) if m}
                assert trained == {k for t in ep.turns for k in range(t.start, t.end)}  # its own tokens only
                shown = [m["content"] for m in ep.messages[2::2]]
                # after each valid move of its own, the seat is shown the other seat's reply
                assert all(other in c for c in shown if "invalid move" not in c)
            if s0.done and s1.done and s0.truncation is None and s1.truncation is None:
                r0, r1 = s0.turns[-1].reward, s1.turns[-1].reward
                assert r0 == -r1 and s0.turns[-1].info["env_info"]["rewards"] == {"0": r0, "1": r1}
                if r0 != 0:
                    won += 1
                    assert s0.success == (r0 > 0) and s1.success == (r1 > 0)
            else:  # one seat ran out of budget: the game ended unfinished for the other (reward 0)
                assert {s0.truncation, s1.truncation} & {"env"} and s0.turns[-1].reward == s1.turns[-1].reward == 0
    assert won >= 1
    # The same seeds replay the same games, whether rows wait for each other's moves or not.
    again = _play(_agent("self_play", kv_reuse=False, overlap_tools=False))
    assert [e.token_ids for e in again.episodes] == [e.token_ids for e in eps]


@pytest.fixture
def scripted_runs(monkeypatch, tmp_path):
    """The trainer's model loaders (the policy's and the frozen copy's) with the scripted hook."""
    import reinforge.learner.build as build_mod
    import reinforge.models as models_mod

    real = models_mod.load_model
    monkeypatch.setattr(build_mod, "load_model", lambda *a, **k: scripted(real(*a, **k)))
    monkeypatch.setattr(models_mod, "load_model", lambda *a, **k: scripted(real(*a, **k)))
    model = save_tiny_model(tmp_path / "model", hidden=32, layers=1, max_positions=2048)

    def config(opponent: str, *extra: str):
        return build_config({}, [
            f"model.path={model}", "task.source=env", "task.train_size=8", "task.eval_size=2",
            "env.name=textarena", f"env.options={{env_id: TicTacToe-v0, opponent: {opponent}}}", "env.max_turns=5",
            "env.max_tokens_per_turn=6", "env.max_tokens=1500", "env.overlap_tools=false", "rollout.num_samples=2",
            "rollout.max_new_tokens=6", "trainer.prompts_per_step=2", "trainer.steps=2", "trainer.eval_every=2",
            "trainer.eval_at_start=false", "trainer.checkpoint_every=0", "trainer.seed=5", "trainer.num_threads=1",
            f"tracking.output_dir={tmp_path / 'runs'}", "tracking.progress=false", *extra])

    # the starting weights
    config.start = lambda: dict(__import__("transformers").AutoModelForCausalLM.from_pretrained(model).state_dict())
    return config


def _trajectories(rd, step):
    return [json.loads(x) for x in (rd.path / "trajectories" / f"step_{step:06d}.jsonl").read_text().splitlines()]


def test_self_play_trains_both_seats(scripted_runs):
    from reinforge.tracking import RunDir
    from reinforge.trainer import Trainer

    trainer = Trainer(scripted_runs("self_play"))
    before = scripted_runs.start()
    rd = RunDir.open(trainer.run().run_dir)
    metrics = rd.read_metrics()
    assert [m["step"] for m in metrics] == [1, 2] and all(np.isfinite(m["loss"]) for m in metrics)
    rows = _trajectories(rd, 2)
    assert len(rows) == 8  # 2 prompts x 2 samples x 2 seats, every one trained
    assert sorted(r["seat"] for r in rows) == [0] * 4 + [1] * 4
    for r in rows:
        assert r["example_id"].endswith(f"/seat{r['seat']}") and any(r["trained_mask"])
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
    # Held-out: a row per episode and seat, each seat's own verdict (all seats averaged).
    details = rd.read_eval_details(2)
    assert sorted(d["id"].rsplit("/", 1)[1] for d in details) == ["seat0", "seat0", "seat1", "seat1"]
    for d in details:
        assert d["correct"] == float(bool(d["trajectory"]["success"]) and not d["trajectory"]["truncated"])
    # The same config replays the same games.
    again = RunDir.open(Trainer(scripted_runs("self_play", "tracking.run_name=again")).run().run_dir)
    assert [r["token_ids"] for r in _trajectories(again, 1)] == [r["token_ids"] for r in _trajectories(rd, 1)]


def test_frozen_opponent_stays_the_starting_model(scripted_runs):
    from reinforge.tracking import RunDir
    from reinforge.trainer import Trainer

    trainer = Trainer(scripted_runs("frozen"))
    start = scripted_runs.start()
    rd = RunDir.open(trainer.run().run_dir)
    frozen = trainer.generator.frozen_model
    assert frozen is not None and frozen is not trainer.model and not frozen.training
    rows = _trajectories(rd, 2)
    assert len(rows) == 4 and {r["seat"] for r in rows} == {0}  # only the model's seat trains
    assert all(torch.equal(start[k], v) for k, v in frozen.state_dict().items())  # never updated
    assert any(not torch.equal(start[k], v) for k, v in trainer.model.state_dict().items())  # the policy was
    # Its moves reached the model's trajectory as the other player's.
    assert any("[Player 1]" in m["content"] for r in rows for m in r["messages"][2::2])


def test_frozen_opponent_reuses_the_kl_reference(scripted_runs):
    from reinforge.trainer import Trainer

    trainer = Trainer(scripted_runs("frozen", "algorithm.kl_coef=0.01", "trainer.steps=1", "trainer.eval_every=0"))
    trainer.run()
    assert trainer.learner.reference_model is not None and trainer.generator.frozen_model is trainer.learner.reference_model


@pytest.mark.parametrize("extra, message", [
    (["env.workers=1"], "env.workers=1 with env.options.opponent=self_play"),
    (["recipe=remax"], "group per seat.*remax"),
])
def test_refused_at_config_validation(scripted_runs, extra, message):
    with pytest.raises(ValueError, match=message):
        scripted_runs("self_play", *extra)


def test_the_memory_guard_counts_the_second_seat_and_the_frozen_copy():
    from reinforge.learner.memory import ModelShape, estimate_memory

    shape = ModelShape(params=10**6, layers=2, hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=90)

    def est(opponent, *extra):
        cfg = build_config({}, ["task.source=env", "env.name=textarena", "env.max_tokens=400",
                                f"env.options={{env_id: TicTacToe-v0, opponent: {opponent}}}", "model.dtype=float32",
                                "trainer.prompts_per_step=4", "rollout.num_samples=4", "algorithm.kl_coef=0", *extra])
        return estimate_memory(cfg, shape, prompt_tokens=300)

    fixed, selfplay, frozen = est("'m:f'"), est("self_play"), est("frozen")
    assert selfplay.generation["kv_cache"] == 2 * fixed.generation["kv_cache"] == frozen.generation["kv_cache"]
    assert selfplay.learner["activations"] >= fixed.learner["activations"] == frozen.learner["activations"]
    assert frozen.resident["frozen_opponent"] == 4 * 10**6 and "frozen_opponent" not in fixed.resident
    # with a KL term under full fine-tuning the opponent is the reference: no second copy
    assert est("frozen", "algorithm.kl_coef=0.1").resident["frozen_opponent"] == 0
