"""Components registered with what they need: an estimator added by registration alone, the needs
of every recipe, the rules that read them (trainer, memory guard, config), and action masks with
holes (tokens the model did not write) through every estimator."""

from __future__ import annotations

import pytest
import torch

from reinforge.algorithms import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInputs,
    Advantages,
    Needs,
    compute_advantages,
    needs_of,
    register_advantage,
    scale_mode,
)
from reinforge.algorithms.advantages import _scale_by_std
from reinforge.config import ConfigError, build_config
from reinforge.learner.memory import ModelShape, estimate_memory

F64 = torch.float64


def t(x, dtype=F64):
    return torch.tensor(x, dtype=dtype)


# --------------------------------------------------------------------------- an estimator added by registration alone


def value_baseline(x: AdvantageInputs) -> Advantages:
    """docs/algorithms.md's example: a Monte Carlo advantage with a learned baseline,
    A_t = r_i - V_t on every action token; the critic regresses on the outcome r_i."""
    r = x.sequence_rewards()[:, None].expand_as(x.mask)        # outcome minus any KL in the reward
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    adv = torch.where(x.mask, r - x.values.to(r.dtype), zero)  # 0 off the action mask
    returns = torch.where(x.mask, r, zero)                      # the critic's targets
    return Advantages(adv, returns)


@pytest.fixture
def registered():
    """``value_baseline`` registered as "test_value_baseline" for one test, declaring it needs a critic."""
    register_advantage("test_value_baseline", needs=Needs(critic=True))(value_baseline)
    yield "test_value_baseline"
    ADVANTAGE_ESTIMATORS.unregister("test_value_baseline")


def test_an_estimator_added_by_registration_alone(registered):
    mask = torch.tensor([[True, True, False], [True, False, True]])  # row 1 has a hole
    x = AdvantageInputs(rewards=torch.tensor([1.0, 0.0]), group_index=torch.tensor([0, 0]), mask=mask,
                        values=torch.tensor([[0.25, 0.5, 9.0], [0.5, 9.0, -0.5]]))
    adv, returns = compute_advantages(registered, x)
    # 1 - .25, 1 - .5; 0 - .5, (hole), 0 + .5
    assert torch.equal(adv, torch.tensor([[0.75, 0.5, 0.0], [-0.5, 0.0, 0.5]]))
    assert torch.equal(returns, torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]))
    # its declared need is checked before it runs
    with pytest.raises(ValueError, match="test_value_baseline estimator needs critic values"):
        compute_advantages(registered, AdvantageInputs(rewards=x.rewards, group_index=x.group_index, mask=mask))

    # the config accepts it, and what it needs reaches the run: a critic, counted by the memory guard
    cfg = build_config({}, [f"algorithm.advantage={registered}", "algorithm.kl_coef=0"])
    assert needs_of(cfg.algorithm) == Needs(critic=True)
    shape = ModelShape(params=1000, layers=2, hidden=8, intermediate=16, heads=2, kv_heads=2, head_dim=4, vocab=10)
    assert estimate_memory(cfg, shape, prompt_tokens=4).resident["critic"] == 16 * 1000
    with pytest.raises(ConfigError, match="accepted: .*test_value_baseline"):
        build_config({}, ["algorithm.advantage=test_value_baselin"])


def test_a_registered_estimator_trains_end_to_end(registered, tmp_path, tiny_model_dir):
    from test_trainer import _config

    from reinforge.tracking import RunDir
    from reinforge.trainer import Trainer

    cfg = _config(tmp_path, tiny_model_dir, f"algorithm.advantage={registered}", "trainer.steps=2",
                  "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.eval_at_start=false")
    metrics = RunDir.open(Trainer(cfg).run().run_dir).read_metrics()
    # the trainer built the critic because the estimator declared it, and trained it on its returns
    assert len(metrics) == 2 and all(m["value_loss"] > 0 and m["skipped"] == 0.0 for m in metrics)


def test_registry_refuses_a_second_function_under_a_taken_name():
    with pytest.raises(ValueError, match="'grpo' is already registered"):
        register_advantage("grpo")(value_baseline)
    with pytest.raises(TypeError, match="Needs"):
        register_advantage("x", needs={"critic": True})
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'; accepted: grpo, rloo"):
        ADVANTAGE_ESTIMATORS.lookup("nope")
    assert "test_value_baseline" not in ADVANTAGE_ESTIMATORS  # the fixture cleaned up


def test_unused_token_rewards_are_refused_not_dropped():
    x = AdvantageInputs(rewards=t([1.0, 0.0]), group_index=torch.tensor([0, 0]), mask=torch.ones(2, 2, dtype=torch.bool),
                        token_rewards=t([[0.5, 0.0], [0.0, 0.5]]))
    with pytest.raises(ValueError, match="grpo estimator is sequence-level.*reinforce_pp, reinforce_pp_baseline, gae"):
        compute_advantages("grpo", x)
    # REINFORCE++ reads them: token rewards 0.5, 1 | 0, 0.5 (the outcome on the last token added);
    # returns-to-go 1.5, 1 | .5, .5; mean .875, unbiased var (.390625 + .015625 + 2 * .140625) / 3
    # = .2291666667, std .4787135539
    adv, _ = compute_advantages("reinforce_pp", x)
    std = (0.6875 / 3) ** 0.5
    expected = t([[0.625, 0.125], [-0.375, -0.375]]) / std
    assert torch.allclose(adv, expected, atol=1e-6)


def test_inputs_are_checked_with_the_field_named():
    with pytest.raises(ValueError, match=r"AdvantageInputs.values must be \[N, T\]"):
        AdvantageInputs(rewards=t([1.0]), group_index=torch.tensor([0]), mask=torch.ones(1, 2, dtype=torch.bool),
                        values=torch.zeros(1, 3))
    with pytest.raises(ValueError, match="mask must be"):
        AdvantageInputs(rewards=t([1.0]), group_index=torch.tensor([0]), mask=torch.ones(2, 2, dtype=torch.bool))


# --------------------------------------------------------------------------- needs of the config


@pytest.mark.parametrize("name,expected", [
    ("grpo", Needs(reference=True)),  # kl_coef 0.04
    ("dr_grpo", Needs()),
    ("dapo", Needs(old_logprobs=True)),  # 4 mini-batches
    ("rloo", Needs()),
    ("reinforce_pp", Needs(reference=True, old_logprobs=True, token_rewards=True)),  # KL in the reward
    ("remax", Needs(greedy_baseline=True)),
    ("gspo", Needs(old_logprobs=True)),
    ("ppo", Needs(critic=True, token_rewards=True)),
    ("passk", Needs(correctness=True)),
    ("clip_cov", Needs(old_logprobs=True)),
    ("opo", Needs()),  # exact on-policy: one update per batch
    ("gpg", Needs()),
    ("sapo", Needs(old_logprobs=True)),  # 4 mini-batches
])
def test_needs_of_every_recipe(name, expected):
    assert needs_of(build_config({"recipe": name}).algorithm) == expected


@pytest.mark.parametrize("override,need", [
    ("algorithm.epochs=2", "old_logprobs"), ("algorithm.mini_batches=2", "old_logprobs"),
    ("algorithm.tis_cap=2.0", "old_logprobs"), ("algorithm.cov_penalty=kl_cov", "old_logprobs"),
    ("algorithm.kl_coef=0.1", "reference"), ("algorithm.advantage=gae", "critic"),
])
def test_each_setting_adds_its_need(override, need):
    base = needs_of(build_config({}, ["recipe=dr_grpo"]).algorithm)
    assert base == Needs()
    assert need in needs_of(build_config({}, ["recipe=dr_grpo", override]).algorithm).names()


def test_memory_guard_reads_the_needs():
    shape = ModelShape(params=1000, layers=2, hidden=8, intermediate=16, heads=2, kv_heads=2, head_dim=4, vocab=10)
    for overrides, reference, critic in ((["algorithm.kl_reward_coef=0.01"], 4000, 0),
                                         (["recipe=ppo"], 0, 16000), (["recipe=dr_grpo"], 0, 0)):
        cfg = build_config({}, overrides)
        resident = estimate_memory(cfg, shape, prompt_tokens=4).resident
        assert (resident["reference_model"], resident["critic"]) == (reference, critic), overrides


def test_config_rules_that_follow_from_needs():
    # a greedy baseline with KL in the reward is refused, whichever estimator declares the baseline
    with pytest.raises(ConfigError, match="advantage=remax with kl_reward_coef"):
        build_config({"recipe": "remax"}, ["algorithm.kl_reward_coef=0.1"])
    # KL-Cov replaces the clipped surrogate's clip, so it composes with that loss only
    with pytest.raises(ConfigError, match="kl_cov replaces the clipped surrogate's clip"):
        build_config({"recipe": "kl_cov"}, ["algorithm.policy_loss=cispo"])
    assert build_config({"recipe": "kl_cov"}).algorithm.policy_loss == "clipped"
    assert set(POLICY_LOSSES) == {"clipped", "gspo", "cispo", "reinforce", "gpg", "sapo", "gmpo", "dppo_tv",
                                  "dppo_kl", "dro"}


def test_scale_mode_is_read_in_one_place():
    # config and estimators share scale_mode: true/false are group/none in both
    assert build_config({}, ["algorithm.scale_rewards=true"]).algorithm.scale_rewards == "group"
    assert build_config({}, ["algorithm.scale_rewards=false"]).algorithm.scale_rewards == "none"
    assert [scale_mode(v) for v in (True, False, "batch")] == ["group", "none", "batch"]
    with pytest.raises(ConfigError, match="unknown scale mode 'grp'"):
        build_config({}, ["algorithm.scale_rewards=grp"])
    r = t([1.0, 0.0])
    g, count = torch.tensor([0, 0]), t([2.0])
    assert torch.equal(_scale_by_std(r, r, g, count, True, 0.0), _scale_by_std(r, r, g, count, "group", 0.0))


# --------------------------------------------------------------------------- action masks with holes

# 4 trajectories (2 prompts x 2) with 3, 2, 1 and 3 action tokens. Compact: the actions side by
# side; with holes: the same actions spread over 7 positions, with tool output between them.
LENGTHS = [3, 2, 1, 3]
POSITIONS = [[0, 2, 5], [1, 4], [3], [2, 3, 6]]


def _inputs(name: str, holes: bool) -> AdvantageInputs:
    gen = torch.Generator().manual_seed(0)
    width = 7 if holes else 3
    compact = {k: torch.randn(4, 3, generator=gen, dtype=F64) for k in ("token_rewards", "token_kl", "values")}
    mask = torch.zeros(4, width, dtype=torch.bool)
    # holes and padding hold garbage that must not count
    full = {k: torch.full((4, width), 1e3, dtype=F64) for k in compact}
    for i, (n, pos) in enumerate(zip(LENGTHS, POSITIONS)):
        cols = pos if holes else list(range(n))
        mask[i, cols] = True
        for k in compact:
            full[k][i, cols] = compact[k][i, :n]
    needs = ADVANTAGE_ESTIMATORS.needs(name)
    return AdvantageInputs(
        rewards=t([1.0, 0.0, 0.5, 0.25]), group_index=torch.tensor([0, 0, 1, 1]), mask=mask,
        token_rewards=full["token_rewards"] if needs.token_rewards else None,
        token_kl=full["token_kl"], kl_coef=0.1, values=full["values"],
        baseline_rewards=t([0.5, 0.0]), correct=t([1.0, 0.0, 0.0, 1.0]),
        scale="group", gamma=0.9, lam=0.8, passk_k=2,
    )


@pytest.mark.parametrize("name", ["grpo", "rloo", "remax", "reinforce_pp", "reinforce_pp_baseline", "gae", "passk"])
def test_every_estimator_skips_the_holes_of_an_action_mask(name):
    compact, holed = compute_advantages(name, _inputs(name, False)), compute_advantages(name, _inputs(name, True))
    for a, b in zip(compact, holed):
        if a is None:
            assert b is None
            continue
        if a.dim() == 1:
            assert torch.allclose(a, b, atol=1e-12, rtol=0)
            continue
        mask = _inputs(name, True).mask
        assert torch.equal(b[~mask], torch.zeros(int((~mask).sum()), dtype=b.dtype))  # nothing on holes
        for i, (n, pos) in enumerate(zip(LENGTHS, POSITIONS)):
            assert torch.allclose(a[i, :n], b[i, pos], atol=1e-12, rtol=0), (name, i)
