"""Curriculum strategies on scripted histories of outcomes (choices checked by hand), their state
round trips, and the config's errors. The trainer runs are in test_curriculum_trainer.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from reinforge.config import ConfigError, build_config
from reinforge.curriculum import (
    DifficultyFilter, DifficultySchedule, Greso, ReinforceAda, TaskMixture, build_curriculum,
)


def _round(*groups):
    """Rewards and group index of a round: one list of rewards per group."""
    rewards = torch.tensor([r for g in groups for r in g], dtype=torch.float32)
    index = torch.tensor([i for i, g in enumerate(groups) for _ in g])
    return rewards, index


def _json_round_trip(state):
    return json.loads(json.dumps(state))  # checkpoints hold the state as JSON


# ----------------------------------------------------------------------------- difficulty filter
def test_difficulty_filter_keeps_the_band_and_skips_known_prompts():
    cur = DifficultyFilter(6, seed=0, band=(0.25, 0.75), max_rounds=3, skip_known=True)
    first = cur.sample(4)
    assert len(set(first)) == 4
    # pass rates 0, 1/4, 3/4, 1: the band [0.25, 0.75] keeps the middle two (inclusive).
    rewards, index = _round([0, 0, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1])
    cur.observe(first, rewards, index)
    assert cur.keep(rewards, index).tolist() == [False, True, True, False]
    assert cur.last_pass == {first[0]: 0.0, first[1]: 0.25, first[2]: 0.75, first[3]: 1.0}
    # The epoch order continues with the 2 unseen prompts, then a new epoch: its prompts seen
    # outside the band are skipped before rollout.
    order = np.random.default_rng([0, 0]).permutation(6).tolist() + np.random.default_rng([0, 1]).permutation(6).tolist()
    nxt = cur.sample(4)
    expected, skipped = [], 0
    for i in order[4:]:
        if len(expected) == 4:
            break
        if i in (first[0], first[3]):
            skipped += 1
            continue
        expected.append(i)
    assert nxt == expected and skipped >= 1
    m = cur.finish_step()
    assert m["curriculum/prompts_skipped"] == skipped and m["curriculum/prompts_rolled_out"] == 8
    assert m["curriculum/zero_variance_frac"] == 0.5 and m["curriculum/samples_spent"] == 16
    assert m["curriculum/success_rate"] == 8 / 16
    # state round trip: the copy makes the same choices
    copy = DifficultyFilter(6, seed=0, band=(0.25, 0.75), max_rounds=3, skip_known=True)
    copy.load_state_dict(_json_round_trip(cur.state_dict()))
    assert copy.last_pass == cur.last_pass and copy.sample(5) == cur.sample(5)


# ----------------------------------------------------------------------------- GRESO
def _greso(n=4, **kw):
    args = dict(max_rounds=2, target_zero_variance=0.3, p_init=0.5, p_step=0.01, p_range=(0.05, 0.95))
    return Greso(n, seed=1, **{**args, **kw})


def test_greso_history_gives_the_skip_probability():
    cur = _greso()
    p = cur.sample(4)
    # group 0 all correct, 1 all wrong, 2 mixed, 3 all correct
    cur.observe(p, *_round([1, 1], [0, 0], [1, 0], [1, 1]))
    assert cur.streak == {p[0]: ("easy", 1), p[1]: ("hard", 1), p[3]: ("easy", 1)}
    assert [cur.keep_probability(i) for i in p] == [0.5, 0.5, 1.0, 0.5]
    assert cur.keep(*_round([1, 1], [0, 0], [1, 0], [1, 1])).tolist() == [False, False, True, False]
    # p[0] all correct again: z = 2 -> 0.25; p[3] turns all wrong: the streak restarts as hard
    cur.observe([p[0], p[3]], *_round([1, 1], [0, 0]))
    assert cur.streak[p[0]] == ("easy", 2) and cur.streak[p[3]] == ("hard", 1)
    assert cur.keep_probability(p[0]) == 0.25
    # a mixed group ends the streak
    cur.observe([p[0]], *_round([0, 1]))
    assert p[0] not in cur.streak and cur.keep_probability(p[0]) == 1.0
    # never below the floor: 0.5 ** 10 < 0.01
    cur.streak[p[1]] = ("hard", 10)
    assert cur.keep_probability(p[1]) == 0.01


def test_greso_skips_with_its_seeded_stream_and_adapts_p_towards_the_target():
    cur = _greso(n=4)
    first = cur.sample(4)                       # epoch 0: nothing known, nothing skipped
    cur.observe(first, *_round([1, 1], [0, 0], [0, 0], [1, 0]))
    m = cur.finish_step()
    # epoch 0: no adaptation (skipping could not have acted yet)
    assert m["curriculum/p_easy"] == 0.5 and m["curriculum/p_hard"] == 0.5
    assert m["curriculum/easy_frac"] == 0.25 and m["curriculum/hard_frac"] == 0.5
    assert m["curriculum/zero_variance_frac"] == 0.75 and m["curriculum/prompts_skipped"] == 0
    # Epoch 1: the order is permutation (1, 1); each known prompt is kept when the stream's next
    # uniform draw is below 0.5, skipped otherwise; unknown prompts take no draw.
    order = np.random.default_rng([1, 1]).permutation(4).tolist() + np.random.default_rng([1, 2]).permutation(4).tolist()
    rng = np.random.default_rng([1, 0x6E350])
    known = set(first[:3])
    expected, skipped = [], 0
    for i in order:
        if len(expected) == 3:
            break
        if i in known and rng.random() >= 0.5:
            skipped += 1
            continue
        expected.append(i)
    got = cur.sample(3)
    assert got == expected
    # the step's groups: 1 of 3 all correct (1/3 >= 0.3/3: explore easy less), 0 all wrong
    # (0 < 0.2: explore hard more)
    cur.observe(got, *_round([1, 1], [1, 0], [0, 1]))
    m = cur.finish_step()
    assert m["curriculum/prompts_skipped"] == skipped
    assert m["curriculum/p_easy"] == pytest.approx(0.49) and m["curriculum/p_hard"] == pytest.approx(0.51)
    # the bounds hold
    cur.p = {"easy": 0.05, "hard": 0.95}
    cur.sample(1)
    cur.observe([got[0]], *_round([1, 1]))  # all correct: easy share 1 -> p_easy down, stays 0.05
    m = cur.finish_step()
    assert m["curriculum/p_easy"] == 0.05 and m["curriculum/p_hard"] == 0.95


def test_greso_skip_rate_matches_the_probability_and_state_round_trips():
    cur = _greso(n=50, p_init=0.6)
    idx = cur.sample(50)
    cur.observe(idx, *_round(*([[1, 1]] * 50)))            # every prompt all correct once
    cur.finish_step()
    for i in idx[:25]:
        cur.streak[i] = ("easy", 2)                         # keep probability 0.36
    state = _json_round_trip(cur.state_dict())
    picked = [i for _ in range(40) for i in cur.sample(10)]  # (a call skips at most 50)
    m = cur.finish_step()
    # kept share of known prompts ~ 0.6 (z=1) and 0.36 (z=2): skips/(skips+picks) is about
    # 1 - (0.6 + 0.36)/2 = 0.52 while every prompt is known
    share = m["curriculum/prompts_skipped"] / (m["curriculum/prompts_skipped"] + 400)
    assert 0.45 < share < 0.59, share
    again = _greso(n=50, p_init=0.6)
    again.load_state_dict(state)
    assert [i for _ in range(40) for i in again.sample(10)] == picked and again.streak == cur.streak


# ----------------------------------------------------------------------------- Reinforce-Ada
def _ada(target="balanced"):
    return ReinforceAda(6, seed=0, group_size=4, samples_per_round=2, max_rounds=4, target=target)


def _ada_rounds(cur, script):
    """Feed ``script[slot]`` (a list of rounds, each 2 rewards) round by round, as the trainer
    would; returns the slots asked for before each round."""
    asked = [list(range(len(script)))]
    r = 0
    while asked[-1]:
        slots = asked[-1]
        rewards, index = _round(*[script[s][r] for s in slots])
        cur.observe([0] * len(slots), rewards, index)
        r += 1
        if r == cur.max_rounds:
            break
        asked.append(cur.resample())
    return asked


def test_reinforce_ada_samples_until_both_outcomes_then_balances_the_group():
    cur = _ada("balanced")
    cur.sample(3)
    script = [
        [[1, 0], [1, 0], [1, 1], [1, 1]],   # 2 successes + 2 failures after round 2: done
        [[0, 0], [0, 0], [0, 1], [0, 0]],   # 1 success in 8: budget spent
        [[1, 1], [1, 1], [1, 1], [1, 1]],   # never a failure: budget spent
    ]
    assert _ada_rounds(cur, script) == [[0, 1, 2], [0, 1, 2], [1, 2], [1, 2]]
    # slot 0: pool 1,0,1,0 -> s = min(2, max(2, 4-2)) = 2: positions 0,2 and 1,3
    # slot 1: pool 0,0,0,0,0,1,0,0 -> s = min(1, max(2, 4-7)) = 1: success 5, failures 0,1,2
    # slot 2: pool all 1 -> s = min(8, max(2, 4-0)) = 4: the first four
    assert cur.form_groups() == [[0, 1, 2, 3], [0, 1, 2, 5], [0, 1, 2, 3]]
    m = cur.finish_step()
    assert m["curriculum/samples_spent"] == 4 + 8 + 8
    assert m["curriculum/samples_per_prompt"] == 20 / 3 and m["curriculum/samples_per_prompt_max"] == 8
    assert m["curriculum/budget_exhausted"] == 2 and m["curriculum/zero_variance_frac"] == 1 / 3
    assert m["curriculum/success_rate"] == (2 + 1 + 8) / 20


def test_reinforce_ada_targets_both_and_positive():
    script = [[[0, 0], [0, 0], [0, 1], [0, 0]], [[0, 0], [1, 1], [0, 0], [0, 0]]]
    both = _ada("both")
    both.sample(2)
    # slot 0 gets its success in round 3 (6 samples); slot 1 has both after round 2 (4 samples)
    assert _ada_rounds(both, script) == [[0, 1], [0, 1], [0], []]
    assert both.form_groups() == [[0, 1, 2, 5], [0, 1, 2, 3]]
    pos = _ada("positive")
    pos.sample(2)
    assert _ada_rounds(pos, [[[1, 1], [1, 0], [0, 0], [0, 0]], [[0, 0], [0, 0], [0, 0], [0, 0]]]) == [[0, 1], [0, 1], [1], [1]]
    # all-failure pool after the budget: the group is the first four failures
    assert pos.form_groups()[1] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="budget"):
        ReinforceAda(6, seed=0, group_size=8, samples_per_round=2, max_rounds=3, target="both")


# ----------------------------------------------------------------------------- schedule and mixture
def _rg_config(*extra):
    return build_config({}, [
        "task.name=count_bits", "task.options={min_n: 1, max_n: 1023}", "task.train_size=40",
        "task.eval_size=30", "reward.verifiers=[{name: exact_match}]", *extra,
    ])


def test_difficulty_schedule_grows_a_level_on_training_accuracy():
    from reinforge.tasks import build_task

    cfg = _rg_config("curriculum.strategy=difficulty_schedule", "curriculum.levels=[{max_n: 15}, {max_n: 255}]",
                     "curriculum.level_threshold=0.5", "curriculum.level_window=2")
    base = build_task(cfg.task)
    cur = build_curriculum(cfg, base)
    assert isinstance(cur, DifficultySchedule) and cur.task.labels == ["level0", "level1"]
    train = cur.task.train_examples()
    assert len(train) == 80
    # level 0's questions (numbers up to 15) never include one the configured task holds out
    heldout = {e.prompt_text for e in base.eval_examples()}
    level0 = [train[i] for i in range(40)]
    assert not heldout & {e.prompt_text for e in level0}
    assert all(e.metadata["metadata"]["number"] <= 15 and e.id.startswith("level0/count_bits/train/") for e in level0)
    assert cur.task.eval_examples() == list(base.eval_examples())
    # scoring goes to the level's task: the reference answer scores 1
    ex = train[3]
    assert cur.task.score(ex.answer, ex) == 1.0 and cur.task.score("nonsense", ex) == 0.0

    def step(successes):
        idx = cur.sample(2)
        cur.observe(idx, *_round([1.0] * successes + [0.0] * (4 - successes), [0.0] * 4))
        return idx, cur.finish_step()

    idx, m = step(4)            # 4/8: window not full yet
    assert all(i < 40 for i in idx) and m["curriculum/level"] == 0 and m["curriculum/level_up"] == 0
    idx, m = step(3)            # window (4+3)/16 < 0.5: stay
    assert m["curriculum/level_accuracy"] == 7 / 16 and m["curriculum/level_up"] == 0
    state = _json_round_trip(cur.state_dict())
    idx, m = step(4)            # (3+4)/16 < 0.5
    idx, m = step(4)            # (4+4)/16 = 0.5: up
    assert m["curriculum/level"] == 0 and m["curriculum/level_up"] == 1 and cur.level == 1
    nxt = cur.sample(2)
    assert all(40 <= i < 80 for i in nxt)
    assert all(train[i].metadata["metadata"]["number"] <= 255 for i in nxt)
    # resume from the saved state replays the same choices
    again = build_curriculum(cfg, base)
    again.load_state_dict(state)
    for s in (4, 4):
        i = again.sample(2)
        again.observe(i, *_round([1.0] * s + [0.0] * (4 - s), [0.0] * 4))
        again.finish_step()
    assert again.level == 1 and again.sample(2) == nxt


def test_mixture_weights_and_learning_progress():
    from reinforge.tasks import build_task

    mix = ("curriculum.mixture=[{task: {name: count_bits}, weight: 3}, "
           "{task: {name: leg_counting, options: {}}, weight: 1, label: legs}]")
    cfg = _rg_config("curriculum.strategy=mixture", mix)
    cur = build_curriculum(cfg, build_task(cfg.task))
    assert isinstance(cur, TaskMixture) and cur.task.labels == ["count_bits", "legs"]
    train = cur.task.train_examples()
    picked = cur.sample(400)
    from_first = sum(i < 40 for i in picked) / 400
    assert 0.68 < from_first < 0.82, from_first          # weight 3 of 4
    m = cur.finish_step()
    assert m["curriculum/mix/count_bits"] == from_first and m["curriculum/weight/legs"] == 0.25
    # ids carry the label; each task scores its own examples; held-out = both tasks' sets
    legs = next(train[i] for i in picked if i >= 40)
    assert legs.id.startswith("legs/leg_counting/train/") and cur.task.score(legs.answer, legs) == 1.0
    assert len(cur.task.eval_examples()) == 60
    assert {e.id.split("/")[0] for e in cur.task.eval_examples()} == {"count_bits", "legs"}

    # learning progress, by hand: weights 1:1, explore 0.2, EMA rates (0.5, 0.1)
    cfg = _rg_config("curriculum.strategy=mixture", mix.replace("weight: 3", "weight: 1"),
                     "curriculum.mixture_adapt=true")
    cur = build_curriculum(cfg, build_task(cfg.task))

    def step(acc_a, acc_b):
        idx = [0, 40]  # one prompt of each task
        cur.observe(idx, *_round([1.0] * int(4 * acc_a) + [0.0] * (4 - int(4 * acc_a)),
                                 [1.0] * int(4 * acc_b) + [0.0] * (4 - int(4 * acc_b))))
        return cur.finish_step()

    m = step(0.0, 0.5)   # first sight: fast = slow = accuracy, no progress: configured weights
    assert m["curriculum/weight/count_bits"] == 0.5
    state = _json_round_trip(cur.state_dict())
    m = step(1.0, 0.5)   # count_bits: fast 0.5, slow 0.1, LP 0.4; legs LP 0
    assert cur.fast == [0.5, 0.5] and cur.slow[0] == pytest.approx(0.1)
    assert m["curriculum/weight/count_bits"] == pytest.approx(0.8 * 1 + 0.2 * 0.5)
    assert m["curriculum/weight/legs"] == pytest.approx(0.1)
    assert m["curriculum/accuracy/count_bits"] == 1.0
    draws = cur.sample(200)
    assert sum(i < 40 for i in draws) > 150
    again = build_curriculum(cfg, build_task(cfg.task))
    again.load_state_dict(state)
    again.observe([0, 40], *_round([1.0] * 4, [1.0, 1.0, 0.0, 0.0]))
    again.finish_step()
    assert again.sample(200) == draws


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("overrides, message", [
    (["curriculum.strategy=greso", "algorithm.dynamic_sampling=true"], "dynamic_sampling applies to"),
    (["curriculum.strategy=difficulty_schedule"], "needs curriculum.levels"),
    (["curriculum.strategy=mixture", "curriculum.mixture=[{task: {name: a}}, {task: {name: a}}]"], "distinct label"),
    (["curriculum.pass_rate_band=[0.8, 0.2]"], "lo <= hi"),
    (["curriculum.strategy=reinforce_ada", "rollout.num_samples=8", "curriculum.max_rounds=1",
      "curriculum.ada_samples_per_round=4"], "budget"),
    (["curriculum.strategy=greso", "rollout.num_samples=1"], "num_samples >= 2"),
    (["curriculum.strategie=greso"], "accepted keys here: strategy"),
])
def test_bad_curriculum_config_is_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_config({}, overrides)


def test_schedule_needs_a_reasoning_gym_task(tmp_path):
    from reinforge.tasks import build_task

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": "a"}) + "\n" for i in range(12)))
    cfg = build_config({}, ["task.source=file", f"task.path={data}", "task.eval_size=2",
                            "curriculum.strategy=difficulty_schedule", "curriculum.levels=[{a: 1}, {a: 2}]"])
    with pytest.raises(ConfigError, match="only reasoning-gym tasks"):
        build_curriculum(cfg, build_task(cfg.task))
    bad = _rg_config("curriculum.strategy=difficulty_schedule", "curriculum.levels=[{max_n: 15}, {max_count: 3}]")
    with pytest.raises(ConfigError, match="max_count"):
        build_curriculum(bad, build_task(bad.task))


@pytest.mark.parametrize("name", ["curriculum_greso.yaml", "curriculum_schedule.yaml", "curriculum_mixture.yaml"])
def test_example_configs_build_their_curriculum(name):
    from pathlib import Path

    from reinforge.config import load_config
    from reinforge.tasks import build_task

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / name, ["task.eval_size=20", "task.train_size=50"])
    cur = build_curriculum(cfg, build_task(cfg.task))
    assert type(cur).__name__ == {"curriculum_greso.yaml": "Greso", "curriculum_schedule.yaml": "DifficultySchedule",
                                  "curriculum_mixture.yaml": "TaskMixture"}[name]
    examples = cur.task.train_examples()
    picked = [examples[i] for i in cur.sample(8)]
    assert len({e.id for e in picked}) == 8
    assert all(cur.task.score(e.answer, e) == 1.0 for e in picked)
