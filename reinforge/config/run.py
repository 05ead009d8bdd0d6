"""``RunConfig``: a whole run's config, its sections, and the checks that span sections."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import Field, field_validator, model_validator

from ..algorithms import ADVANTAGE_ESTIMATORS, is_group_relative, needs_of
from ..recipes import RECIPES
from .algorithm import AlgorithmConfig, CriticConfig
from .base import _Section
from .components import (
    EnvConfig,
    LearnerConfig,
    RolloutConfig,
    ScaleConfig,
    TrainerConfig,
)
from .curriculum import CurriculumConfig, check_ada_budget
from .model import ModelConfig
from .plugins import plugin_imports
from .sft import SFTConfig
from .task import RewardConfig, TaskConfig
from .tracking import TrackingConfig


class RunConfig(_Section):
    recipe: str = Field("grpo", description="Name of the recipe this config started from.")
    imports: list[str] = Field(
        default_factory=list, validate_default=True,
        description="Plugins imported before the rest of the config is validated, in every process that "
        "validates it (the trainer, Ray workers, `reinforge eval` and `reproduce` of the run): module names "
        "(`my_envs`) or .py files (`envs/my_envs.py`), so that their register_env / register_verifier calls "
        "count. `--import NAME` on the command line adds to it (docs/agents.md, Plugins). Installed packages "
        "need no import: their `reinforge.envs` / `reinforge.verifiers` entry points load at the first "
        "lookup of a name nothing registered.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    sft: SFTConfig | None = Field(
        None, description="Supervised warm start before RL (docs/sft.md): `reinforge train` runs it "
        "first, in <run>/sft/, and RL starts from its weights; `reinforge sft` runs it alone.")
    scale: ScaleConfig = Field(default_factory=ScaleConfig)
    env: EnvConfig | None = Field(None, description="A multi-turn environment: trajectories are "
                                  "conversations with it (docs/agents.md). null: single-turn completions.")

    @field_validator("imports", mode="before")
    @classmethod
    def _import_plugins(cls, v: Any) -> list[str]:
        # Fields are validated in order, so the plugins' registrations exist before reward.verifiers'.
        return plugin_imports(v)

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, v: str) -> str:
        if v not in RECIPES:
            raise ValueError(f"unknown recipe {v!r}; accepted: {', '.join(sorted(RECIPES))}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "RunConfig":
        algo, rollout = self.algorithm, self.rollout
        if algo.advantage == "passk" and rollout.num_samples < algo.passk_k:
            raise ValueError(
                f"algorithm.passk_k={algo.passk_k} needs rollout.num_samples >= {algo.passk_k} "
                f"(got {rollout.num_samples})"
            )
        if algo.dynamic_sampling and rollout.num_samples < 2:
            raise ValueError(
                "algorithm.dynamic_sampling keeps groups whose rewards differ, so it needs "
                "rollout.num_samples >= 2"
            )
        strategy = self.curriculum.strategy
        if algo.dynamic_sampling and strategy != "epochs":
            raise ValueError(
                f"algorithm.dynamic_sampling applies to curriculum.strategy=epochs; curriculum.strategy={strategy} "
                "chooses its own groups: set algorithm.dynamic_sampling=false"
            )
        if strategy in ("difficulty_filter", "greso", "reinforce_ada") and rollout.num_samples < 2:
            raise ValueError(f"curriculum.strategy={strategy} reads the outcomes of a group, so it needs "
                             "rollout.num_samples >= 2")
        cc = self.curriculum
        per_round = cc.ada_samples_per_round or rollout.num_samples
        if strategy == "reinforce_ada":
            check_ada_budget(rollout.num_samples, per_round, cc.max_rounds)
        if algo.dual_clip is not None and algo.policy_loss != "clipped":
            raise ValueError(
                f"algorithm.dual_clip applies to policy_loss=clipped only (got {algo.policy_loss!r}); "
                "set algorithm.dual_clip=null"
            )
        if needs_of(algo).greedy_baseline and algo.kl_reward_coef > 0:
            raise ValueError(
                f"algorithm.advantage={algo.advantage} with kl_reward_coef > 0 is not supported: the greedy "
                "baseline's KL is not computed, so the baseline would be biased. Use kl_coef (KL in the loss)."
            )
        if algo.cov_penalty == "kl_cov" and (algo.policy_loss != "clipped" or algo.dual_clip is not None):
            raise ValueError(
                "algorithm.cov_penalty=kl_cov replaces the clipped surrogate's clip with its own penalty "
                f"(arXiv:2505.22617), so it needs policy_loss=clipped and dual_clip=null (got "
                f"policy_loss={algo.policy_loss!r}, dual_clip={algo.dual_clip}); use cov_penalty=clip_cov otherwise"
            )
        if algo.max_staleness > 0 and self.scale.mode != "ray":
            raise ValueError(
                f"algorithm.max_staleness={algo.max_staleness} lets rollouts run ahead of the learner, "
                "which needs rollout workers of their own: add scale.mode=ray (or set max_staleness=0)"
            )
        if self.scale.mode == "ray" and algo.max_staleness < rollout.sync_every - 1:
            raise ValueError(
                f"rollout.sync_every={rollout.sync_every} makes samples up to {rollout.sync_every - 1} "
                f"versions old, beyond algorithm.max_staleness={algo.max_staleness}: raise max_staleness "
                f"to {rollout.sync_every - 1} or lower sync_every"
            )
        if rollout.partial and (self.scale.mode != "ray" or algo.max_staleness < 1 or rollout.backend != "hf"
                                or self.env is not None):
            raise ValueError(
                "rollout.partial=true updates the weights of generations in flight on rollout workers: it "
                "needs scale.mode=ray, algorithm.max_staleness >= 1 and rollout.backend=hf, single-turn "
                f"(got scale.mode={self.scale.mode}, max_staleness={algo.max_staleness}, "
                f"backend={rollout.backend}, env={'set' if self.env is not None else 'null'})"
            )
        if self.task.source == "env" and self.env is None:
            raise ValueError("task.source=env takes its examples from the environment: set env.name")
        if self.env is not None and self.scale.mode == "ray":
            # The workers (scale/worker.py) build a single-turn generator and the plain task's
            # reward: the run would silently train single-turn completions, not the agent.
            raise ValueError(
                f"scale.mode=ray with env.name={self.env.name}: Ray rollout workers generate single-turn "
                "completions, they do not run the multi-turn agent loop; train an environment with "
                "scale.mode=local, or remove env "
                "for single-turn training on Ray")
        if self.env is not None:
            if self.env.name == "verifiers" and self.task.source != "env":
                raise ValueError("env.name=verifiers trains on the taskset's own tasks: set task.source=env")
            if rollout.backend != "hf":
                raise ValueError("env: multi-turn agents decode with rollout.backend=hf (got "
                                 f"{rollout.backend!r})")
            if self.env.seat_mode and (needs_of(algo).greedy_baseline or self.curriculum.strategy == "reinforce_ada"):
                what = (f"algorithm.advantage={algo.advantage} (one greedy baseline per prompt)"
                        if needs_of(algo).greedy_baseline else "curriculum.strategy=reinforce_ada (groups per prompt)")
                raise ValueError(f"env.options.opponent={self.env.seat_mode} gives each game a group per seat, which "
                                 f"{what} does not support: use a group estimator (grpo, rloo, ...) and another "
                                 "curriculum")
            if self.env.turn_rewards == "tokens" and (not needs_of(algo).token_rewards or algo.gamma != 1.0):
                raise ValueError("env.turn_rewards=tokens needs an estimator that takes token rewards "
                                 "(algorithm.advantage=reinforce_pp, reinforce_pp_baseline or gae) with "
                                 f"algorithm.gamma=1 (got {algo.advantage}, gamma={algo.gamma}); or use "
                                 "env.turn_rewards=sum")
        if self.scale.learners > 1 and needs_of(algo).critic:
            raise ValueError(
                f"scale.learners={self.scale.learners}: the data-parallel learner trains the policy only, and "
                f"algorithm.advantage={algo.advantage} trains a critic too; use scale.learners=1 for PPO with a critic"
            )
        if algo.mini_batches > self.trainer.prompts_per_step:
            raise ValueError(
                f"algorithm.mini_batches={algo.mini_batches} splits prompt groups, so it must be "
                f"<= trainer.prompts_per_step={self.trainer.prompts_per_step}"
            )
        return self

    @model_validator(mode="after")
    def _one_sample_per_prompt(self) -> "RunConfig":
        """rollout.num_samples=1 with an algorithm that compares a prompt's samples trains on
        advantages that are all 0 (a gradient norm of exactly 0 at every step) or unscaled."""
        algo, n = self.algorithm, self.rollout.num_samples
        if n >= 2:
            return self
        if is_group_relative(algo.advantage):
            plain = [a for a in ("reinforce_pp", "remax", "gae") if a in ADVANTAGE_ESTIMATORS]
            raise ValueError(
                f"rollout.num_samples=1 with algorithm.advantage={algo.advantage}: it compares each sample with "
                "the other samples of its prompt, so with one sample every advantage is 0 and nothing is learned; "
                f"set rollout.num_samples >= 2, or use an estimator without a group baseline "
                f"(algorithm.advantage={' / '.join(plain)}, e.g. recipe=remax or recipe=reinforce_pp)"
            )
        if algo.advantage == "remax" and algo.scale_rewards == "group":  # the one other reader of the group std
            raise ValueError(
                "rollout.num_samples=1 with algorithm.scale_rewards=group: a group of one sample has no std to "
                "divide by (the advantages would be scaled by 1/eps); set algorithm.scale_rewards=none or batch, "
                "or rollout.num_samples >= 2"
            )
        return self

    @model_validator(mode="after")
    def _sft_with_an_environment(self) -> "RunConfig":
        """An SFT stage of a multi-turn run trains on a file of whole conversations (each row's
        last message the assistant's turn, e.g. written by scripts/env_policy_demos.py) and is
        evaluated through the environment; demonstrations from a task's answers, or sampled
        single-turn by expert iteration, do not exist for an environment."""
        if self.sft is None or self.env is None or self.sft.source == "file":
            return self
        raise ValueError(
            f"sft.source={self.sft.source} with env.name={self.env.name}: "
            + ("an environment's examples have no reference answers to make demonstrations from"
               if self.sft.source == "task" else "expert iteration samples single-turn completions, not episodes")
            + "; use sft.source=file with conversations played in the environment "
            "(python scripts/env_policy_demos.py CONFIG --policy NAME --out FILE; docs/sft.md)")

    @model_validator(mode="after")
    def _truncation_single_turn(self) -> "RunConfig":
        if self.task.truncate_prompts != "off" and self.env is not None:
            raise ValueError(
                f"task.truncate_prompts={self.task.truncate_prompts} cuts single-turn prompts; a multi-turn "
                "environment (env) builds its own conversation: set task.truncate_prompts=off"
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        out = self.model_dump(mode="json")
        if out.get("sft") is None:  # configs without a warm start read as they did before it existed
            out.pop("sft", None)
        return out

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)
