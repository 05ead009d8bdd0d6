"""Issue 28, finding 4: a config value the run cannot use is refused when the config is validated,
in one line that names the key and what is accepted, before anything loads: counts below 1, negative
seeds, inf and NaN, AdamW betas outside [0, 1), an empty covariance window, one sample per prompt
with an estimator that compares a prompt's samples, and a run folder that cannot be made."""

from __future__ import annotations

import subprocess

import pytest
import torch
from tiny_run import cli_in_process, save_tiny_run_inputs, tiny_run_overrides

from reinforge.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInputs, compute_advantages, register_advantage
from reinforge.config import ConfigError, build_config
from reinforge.recipes import RECIPES
from reinforge.tracking.location import check_new_run_location


def _refusal(*overrides: str, raw: dict | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        build_config(raw or {}, list(overrides))
    msg = str(err.value)
    assert "\n" not in msg, msg  # one problem, one line
    return msg


@pytest.mark.parametrize("override, key, accepted", [
    ("trainer.eval_max_prompts=0", "trainer.eval_max_prompts", "greater than or equal to 1 (got 0)"),
    ("trainer.eval_max_prompts=-1", "trainer.eval_max_prompts", "greater than or equal to 1 (got -1)"),
    ("trainer.num_threads=-1", "trainer.num_threads", "greater than or equal to 1 (got -1)"),
    ("trainer.num_threads=0", "trainer.num_threads", "greater than or equal to 1 (got 0)"),
    ("trainer.seed=-1", "trainer.seed", "greater than or equal to 0 (got -1)"),
    ("learner.betas=[1.0, 0.99]", "learner.betas", "[0, 1)"),
    ("learner.betas=[0.9, -0.5]", "learner.betas", "[0, 1)"),
    ("algorithm.cov_bounds=[5.0, 1.0]", "algorithm.cov_bounds", "lower <= upper"),
    ("learner.lr=.inf", "learner.lr", "finite number (got inf)"),
    ("reward.correct_threshold=.nan", "reward.correct_threshold", "finite number"),
    ("curriculum.success_threshold=.inf", "curriculum.success_threshold", "finite number"),
    ("trainer.stop_grace_s=-.inf", "trainer.stop_grace_s", "finite number"),
    ("tracking.run_name=a/b", "tracking.run_name", "plain folder name"),
    ("tracking.run_name=..", "tracking.run_name", "plain folder name"),
    ("tracking.run_name=''", "tracking.run_name", "plain folder name"),
])
def test_a_value_out_of_range_is_refused_naming_the_key_and_the_range(override, key, accepted):
    msg = _refusal(override)
    assert msg.startswith(f"invalid config: {key}: ") and accepted in msg, msg


def test_the_values_next_to_the_refused_ones_are_accepted():
    cfg = build_config({}, ["trainer.eval_max_prompts=1", "trainer.num_threads=1", "trainer.seed=0",
                            "learner.betas=[0.0, 0.999]", "algorithm.cov_bounds=[1.0, 1.0]", "tracking.run_name=a.b",
                            "task.truncate_prompts=off"])
    assert (cfg.trainer.eval_max_prompts, cfg.trainer.num_threads, cfg.task.truncate_prompts) == (1, 1, "off")
    assert build_config({}, ["task.truncate_prompts=left"]).task.truncate_prompts == "left"


def test_one_sample_per_prompt_gives_a_group_estimator_nothing_to_compare():
    # what the refusal prevents: one-sample groups get advantages of exactly 0 whatever the rewards
    x = AdvantageInputs(rewards=torch.tensor([0.0, 1.0, 0.3]), group_index=torch.tensor([0, 1, 2]),
                        mask=torch.ones(3, 4, dtype=torch.bool))
    for name in ("grpo", "rloo"):
        assert torch.count_nonzero(compute_advantages(name, x).advantages) == 0, name
    # and ReMax's group std of one sample is 0: the advantage r - r_greedy would be divided by eps
    remax = AdvantageInputs(**{**x.__dict__, "baseline_rewards": torch.zeros(3)})
    assert compute_advantages("remax", remax).advantages.abs().max() > 1e5


@pytest.mark.parametrize("advantage", ["grpo", "rloo", "reinforce_pp_baseline", "passk"])
def test_one_sample_per_prompt_with_a_group_relative_estimator_is_refused(advantage):
    msg = _refusal("rollout.num_samples=1", f"algorithm.advantage={advantage}", "algorithm.passk_k=1",
                   "algorithm.kl_reward_coef=0", "algorithm.scale_rewards=none")
    assert f"rollout.num_samples=1 with algorithm.advantage={advantage}" in msg
    assert "set rollout.num_samples >= 2" in msg and "recipe=remax" in msg


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_every_recipe_with_one_sample_per_prompt_is_refused_unless_it_needs_no_group(recipe):
    accepted = {"remax", "reinforce_pp", "ppo"}  # a greedy baseline, batch whitening, a critic
    if recipe in accepted:
        assert build_config({"recipe": recipe}, ["rollout.num_samples=1"]).rollout.num_samples == 1
    else:
        assert "rollout.num_samples" in _refusal("rollout.num_samples=1", raw={"recipe": recipe})


def test_remax_dividing_by_a_one_sample_group_std_is_refused():
    msg = _refusal("recipe=remax", "rollout.num_samples=1", "algorithm.scale_rewards=group")
    assert "algorithm.scale_rewards=group" in msg and "scale_rewards=none or batch" in msg
    assert build_config({}, ["recipe=remax", "rollout.num_samples=1", "algorithm.scale_rewards=batch"])


def test_a_registered_estimator_declared_group_relative_is_refused_with_one_sample():
    register_advantage("test_group_mean", group_relative=True)(lambda x: None)
    register_advantage("test_no_group")(lambda x: None)
    try:
        assert "algorithm.advantage=test_group_mean" in _refusal("rollout.num_samples=1",
                                                                 "algorithm.advantage=test_group_mean")
        assert build_config({}, ["rollout.num_samples=1", "algorithm.advantage=test_no_group",
                                 "algorithm.scale_rewards=none"]).rollout.num_samples == 1
    finally:
        ADVANTAGE_ESTIMATORS.unregister("test_group_mean")
        ADVANTAGE_ESTIMATORS.unregister("test_no_group")


def test_truncation_is_refused_for_multi_turn_runs():
    msg = _refusal("task.truncate_prompts=left", "env={name: calculator}")
    assert "task.truncate_prompts=left" in msg and "set task.truncate_prompts=off" in msg


# ----------------------------------------------------------------------------- where the run goes


def test_an_output_dir_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    for out in (tmp_path / "f", tmp_path / "f" / "sub"):
        with pytest.raises(ConfigError, match=r"tracking.output_dir=.*, not a folder: set tracking.output_dir"):
            check_new_run_location(out, None)


def test_a_run_name_that_exists_is_refused_with_the_resume_command(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "config.yaml").write_text("{}")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"tracking.run_name='taken': .* already exists; choose another "
                       r"tracking.run_name, or continue that run with `reinforge train --resume .*taken`"):
        check_new_run_location(tmp_path, "taken")
    with pytest.raises(ConfigError, match="tracking.run_name='file'.*already exists; choose another tracking.run_name$"):
        check_new_run_location(tmp_path, "file")
    (tmp_path / "empty").mkdir()
    check_new_run_location(tmp_path, "empty")  # as RunDir.create, an empty folder is used
    check_new_run_location(tmp_path / "new" / "deeper", "fresh")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    return save_tiny_run_inputs(tmp_path_factory.mktemp("badcfg"))


def _cli(*args: str) -> subprocess.CompletedProcess:
    return cli_in_process("train", *args)  # a refusal needs no process of its own


def test_the_cli_refuses_a_bad_value_in_one_line(inputs):
    proc = _cli(*tiny_run_overrides(inputs, "bad", "trainer.eval_max_prompts=0"))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == ("reinforge: invalid config: trainer.eval_max_prompts: Input should be greater "
                                   "than or equal to 1 (got 0)")
    assert not (inputs / "runs" / "bad").exists()


@pytest.mark.parametrize("where", ["file", "taken"])
def test_the_cli_refuses_a_run_folder_it_cannot_make_before_the_model_loads(inputs, where):
    (inputs / "runs").mkdir(exist_ok=True)
    (inputs / "a_file").write_text("x")
    (inputs / "runs" / "taken").mkdir(exist_ok=True)
    (inputs / "runs" / "taken" / "status.json").write_text("{}")
    extra = [f"tracking.output_dir={inputs / 'a_file'}"] if where == "file" else []
    proc = _cli(*tiny_run_overrides(inputs, "taken" if where == "taken" else "x", *extra))
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("reinforge: tracking."), proc.stderr
    assert ("tracking.output_dir" if where == "file" else "--resume") in lines[0]
    assert "model.dtype" not in proc.stderr + proc.stdout  # refused before the dtype probe and the model
