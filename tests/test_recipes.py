"""Every recipe end to end on a tiny real model; the main ones learn; recipes are presets that
the command line can override; the sampling-side pieces and the critic behave in a real run."""

from __future__ import annotations

import subprocess

import pytest
import torch

from reinforge.batch import TrainBatch
from reinforge.config import AlgorithmConfig, ConfigError, LearnerConfig, build_config
from reinforge.learner import Learner
from reinforge.recipes import RECIPES
from reinforge.rollout import HFGenerator, SamplingParams
from reinforge.tracking import RunDir
from reinforge.trainer import Trainer
from test_trainer import _config


def half_constant_reward(completion: str, example) -> float:
    """Even-numbered prompts always score 0.5 (their group carries no signal); odd ones score the
    share of '7's, so dynamic sampling has groups to drop and groups to keep."""
    if int(example.prompt.split()[-1]) % 2 == 0:
        return 0.5
    return completion.count("7") / max(len(completion), 1)


_FAST = ("trainer.steps=2", "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.eval_at_start=false")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_runs_end_to_end(tmp_path, tiny_model_dir, name):
    cfg = _config(tmp_path, tiny_model_dir, f"recipe={name}", *_FAST)
    for section, values in RECIPES[name].preset.items():  # the preset reached the run's config
        resolved = getattr(cfg, section).model_dump(mode="json")
        for key, value in values.items():
            assert resolved[key] == (list(value) if isinstance(value, tuple) else value), (section, key)
    result = Trainer(cfg).run()
    rd = RunDir.open(result.run_dir)
    metrics = rd.read_metrics()
    assert rd.status()["state"] == "finished" and len(metrics) == 2
    for m in metrics:
        assert m["skipped"] == 0.0
        assert all(v == v for k, v in m.items() if isinstance(v, float) and k != "grad_norm"), m  # no NaN
        # a step whose groups all had equal rewards runs no row (learner.skip_zero_advantage)
        assert m["entropy"] > 0 if "entropy" in m else m["learner_rows_skipped"] == 1.0
    algo = cfg.algorithm
    last = metrics[-1]
    if algo.advantage == "gae":
        assert last["value_loss"] > 0 and "vf_clip_fraction" in last
    if algo.dynamic_sampling:
        assert last["sampling_rounds"] >= 1
    if algo.kl_coef > 0:
        assert "kl" in last
    if algo.epochs > 1 or algo.mini_batches > 1 or algo.kl_reward_coef > 0:
        # the learner's log-probs at rollout time were computed and compared with the sampler's
        assert last["logprob_diff_max"] < 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo", "rloo", "ppo"])
def test_main_recipes_raise_the_reward(tmp_path, tiny_model_dir, name):
    cfg = _config(tmp_path, tiny_model_dir, f"recipe={name}", "trainer.steps=12", "trainer.eval_every=0",
                  "trainer.checkpoint_every=0", "trainer.eval_at_start=false", "learner.lr=1e-2",
                  "critic.lr=1e-3")
    rewards = [m["reward_mean"] for m in RunDir.open(Trainer(cfg).run().run_dir).read_metrics()]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.2, (name, rewards)


def test_recipe_components_can_be_overridden(tmp_path):
    cfg = build_config({"recipe": "dapo"}, ["algorithm.clip_eps_high=0.3", "reward.overlong_buffer=0.5"])
    assert cfg.algorithm.clip_eps_high == 0.3 and cfg.reward.overlong_buffer == 0.5
    assert cfg.algorithm.dynamic_sampling  # the rest of the preset stays
    # YAML beats the preset, the command line beats the YAML
    cfg = build_config({"recipe": "grpo", "algorithm": {"kl_coef": 0.0}}, ["algorithm.loss_agg=token_mean"])
    assert cfg.algorithm.kl_coef == 0.0 and cfg.algorithm.loss_agg == "token_mean"
    assert cfg.algorithm.scale_rewards == "group"
    with pytest.raises(ConfigError, match="passk_k=4 needs rollout.num_samples >= 4"):
        build_config({"recipe": "passk"}, ["rollout.num_samples=2"])
    with pytest.raises(ConfigError, match="algorithm.policy_loss"):
        build_config({}, ["algorithm.policy_loss=ppo2"])


def test_recipes_cli_lists_papers_and_shows_presets(capsys):
    from reinforge.cli import main

    def run(*a):  # the CLI's entry point in this process: a listing needs no process of its own
        code = main(["recipes", *a])
        out = capsys.readouterr()
        return subprocess.CompletedProcess(a, code, out.out, out.err)

    listing = run()
    assert listing.returncode == 0
    for name, recipe in RECIPES.items():
        assert name in listing.stdout and f"arXiv:{recipe.paper.arxiv}" in listing.stdout
    shown = run("show", "gspo")
    assert shown.returncode == 0
    assert "policy_loss: gspo" in shown.stdout and "2507.18071" in shown.stdout
    assert "clip_eps_low: 0.0003" in shown.stdout and "mini_batches: 4" in shown.stdout
    bad = run("show", "ppo3")
    assert bad.returncode == 2 and "unknown recipe 'ppo3'" in bad.stderr and "dr_grpo" in bad.stderr


def test_dynamic_sampling_fills_the_batch_with_informative_groups(tmp_path, tiny_model_dir):
    cfg = _config(tmp_path, tiny_model_dir, "recipe=dapo", "algorithm.max_sampling_rounds=6", "trainer.steps=3",
                  "trainer.eval_every=0", "trainer.checkpoint_every=0", "trainer.eval_at_start=false",
                  reward="test_recipes:half_constant_reward")
    metrics = RunDir.open(Trainer(cfg).run().run_dir).read_metrics()
    assert any(m["sampling_rounds"] >= 2 for m in metrics)  # half the prompts are dropped every round
    for m in metrics:
        assert m["informative_groups"] <= 4
        if m["informative_groups"] == 4:
            assert m["uniform_group_frac"] == 0.0  # no all-equal group reached the update


def test_overlong_filter_leaves_truncated_rows_out_of_the_loss(tiny_model, tiny_tokenizer):
    gen = HFGenerator(tiny_model, tiny_tokenizer)
    prompts = [tiny_tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False)]
    rollout = gen.generate(prompts, SamplingParams(num_samples=4, max_new_tokens=6))
    learner = Learner(tiny_model, LearnerConfig(lr=1e-2), AlgorithmConfig())
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    nothing = torch.zeros_like(rollout.completion_mask)
    stats = learner.step(TrainBatch(rollout=rollout, advantages=adv, loss_mask=nothing))
    assert stats["loss"] == 0.0 and stats["grad_norm"] == 0.0


def test_ppo_resume_restores_the_critic_exactly(tmp_path, tiny_model_dir):
    common = ("recipe=ppo", "trainer.eval_every=0", "trainer.eval_at_start=false", "critic.lr=1e-3")
    straight = Trainer(_config(tmp_path, tiny_model_dir, *common, "tracking.run_name=straight")).run()
    half = Trainer(_config(tmp_path, tiny_model_dir, *common, "tracking.run_name=resumed", "trainer.steps=2")).run()
    rd = RunDir.open(half.run_dir)
    resumed = Trainer(build_config(rd.load_config(), ["trainer.steps=4"]), run_dir=rd, resume=True).run()
    a = RunDir.open(straight.run_dir).read_metrics()
    b = RunDir.open(resumed.run_dir).read_metrics()
    keys = ("reward_mean", "loss", "value_loss", "grad_norm", "critic_grad_norm")
    assert [[m[k] for k in keys] for m in a] == [[m[k] for k in keys] for m in b]


def _learner_batch(tiny_model, tiny_tokenizer):
    from test_rollout_learner import _batch

    rollout, adv = _batch(HFGenerator(tiny_model, tiny_tokenizer), tiny_tokenizer)
    gen = torch.Generator().manual_seed(5)
    # an "old" policy a little away from the current one, so ratios differ from 1 and clip
    old = rollout.sampler_logprobs + 0.3 * torch.randn(rollout.sampler_logprobs.shape, generator=gen)
    old = old.masked_fill(~rollout.completion_mask, 0.0)
    # a loss mask that drops whole rows (as overlong filtering does), whichever rows stopped
    loss_mask = rollout.completion_mask & (torch.arange(len(rollout)) % 3 != 0)[:, None]
    weights = torch.rand(rollout.completion_mask.shape, generator=gen) + 0.5
    return TrainBatch(rollout=rollout, advantages=adv, old_logprobs=old, loss_mask=loss_mask, is_weights=weights)


@pytest.mark.parametrize("algo", [
    dict(policy_loss="gspo", loss_agg="seq_mean_token_mean", clip_eps_low=0.05, clip_eps_high=0.05),
    dict(policy_loss="cispo", clip_eps_low=1.0, clip_eps_high=0.1),
    dict(policy_loss="reinforce", loss_agg="seq_mean_token_sum"),
    dict(policy_loss="clipped", dual_clip=2.0, entropy_coef=0.01, loss_agg="token_sum_norm"),
    dict(cov_penalty="kl_cov", cov_ratio=0.2),
    dict(cov_penalty="clip_cov", cov_ratio=0.2, cov_bounds=(-100.0, 100.0)),
])
def test_composed_update_does_not_depend_on_micro_batch_split(tiny_model, tiny_tokenizer, algo):
    import copy

    batch = _learner_batch(tiny_model, tiny_tokenizer)
    results = []
    for budget in (10_000, 40):  # one micro-batch vs many
        torch.manual_seed(0)  # Clip-Cov's random pick
        model = copy.deepcopy(tiny_model)
        learner = Learner(model, LearnerConfig(lr=1e-2, micro_batch_tokens=budget, grad_clip=1e9),
                          AlgorithmConfig(**algo), max_new_tokens=10)
        results.append(learner.step(batch))
    a, b = results
    for key in ("loss", "pg_loss", "entropy", "clip_fraction"):
        assert a[key] == pytest.approx(b[key], abs=1e-5), key
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    assert a["grad_norm"] > 0


def test_clip_cov_and_kl_cov_change_the_update(tiny_model, tiny_tokenizer):
    batch = _learner_batch(tiny_model, tiny_tokenizer)

    def run(**algo):
        import copy

        torch.manual_seed(0)
        learner = Learner(copy.deepcopy(tiny_model), LearnerConfig(grad_clip=1e9), AlgorithmConfig(**algo))
        return learner.step(batch)

    plain = run()
    # every token inside a huge covariance window, ratio 1: Clip-Cov detaches them all
    assert run(cov_penalty="clip_cov", cov_ratio=1.0, cov_bounds=(-1e9, 1e9))["grad_norm"] == 0.0
    kl = run(cov_penalty="kl_cov", cov_ratio=0.5, kl_cov_coef=1.0)
    assert kl["loss"] > plain["loss"] and kl["cov_selected_frac"] > 0.3


def test_learner_applies_kl_cov_and_clip_cov_as_the_pure_functions_say(tiny_model, tiny_tokenizer):
    import copy

    from reinforge.algorithms import aggregate_loss, kl_cov_loss, tokens_with_gradient

    batch = _learner_batch(tiny_model, tiny_tokenizer)
    m = batch.effective_loss_mask
    current = Learner(tiny_model, LearnerConfig(), AlgorithmConfig()).compute_logprobs(batch.rollout)

    # KL-Cov on every token (cov_ratio 1): the unclipped surrogate plus |logp - logp_old|, times
    # the importance weights, token-mean; not the clipped surrogate with the penalty on top
    learner = Learner(copy.deepcopy(tiny_model), LearnerConfig(grad_clip=1e9),
                      AlgorithmConfig(cov_penalty="kl_cov", cov_ratio=1.0))
    stats = learner.step(batch)
    per_token, _ = kl_cov_loss(current, batch.old_logprobs, batch.advantages, m, m)
    expected = aggregate_loss(per_token * batch.is_weights, m, "token_mean")
    assert stats["cov_selected_frac"] == 1.0 and stats["clip_fraction"] == 0.0
    assert stats["pg_loss"] == pytest.approx(float(expected), abs=1e-5)

    # Clip-Cov with a window holding every token and a budget of all of them: it detaches exactly
    # the tokens that still had a gradient (the clip had cut off the others), so none is left
    learner = Learner(copy.deepcopy(tiny_model), LearnerConfig(grad_clip=1e9),
                      AlgorithmConfig(cov_penalty="clip_cov", cov_ratio=1.0, cov_bounds=(-1e9, 1e9)))
    stats = learner.step(batch)
    trained = tokens_with_gradient("clipped", current, batch.old_logprobs, batch.advantages, m,
                                   clip_eps_low=0.2, clip_eps_high=0.2)
    assert 0 < trained.sum() < m.sum()  # some tokens are clipped, so the test tells the two apart
    assert stats["cov_selected_frac"] == pytest.approx(float(trained.sum() / m.sum()))
    assert stats["grad_norm"] == 0.0
