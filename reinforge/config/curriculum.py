"""The ``curriculum`` section of a run config: which strategy picks a step's prompts and how many
samples each gets. Plain pydantic, so ``reinforge.config`` can hold it without importing the
strategies."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

STRATEGIES = ("epochs", "difficulty_filter", "greso", "reinforce_ada", "difficulty_schedule", "mixture")


class MixtureEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    task: dict[str, Any] = Field(
        ..., description="Keys of the `task` section for this task (e.g. {name: leg_counting, options: "
        "{max_animals: 3}}), merged over the run's `task` section, so prompt_suffix, few_shot, sizes "
        "and seed carry over unless given here."
    )
    weight: float = Field(1.0, gt=0, description="Share of the step's prompts drawn from this task "
                          "(normalised over the entries).")
    label: str | None = Field(None, description="Name in metrics and example ids (default: task.name).")


class CurriculumConfig(BaseModel):
    """Which prompts a step trains on and how many samples each gets (docs/curricula.md).
    ``algorithm.dynamic_sampling`` (DAPO) stays where it is; it applies with strategy=epochs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    strategy: Literal[STRATEGIES] = Field(
        "epochs",
        description="'epochs': seeded epochs over the training prompts, every group kept (DAPO's "
        "dynamic sampling with algorithm.dynamic_sampling). 'difficulty_filter': online difficulty "
        "filtering, train only on groups whose pass rate lies in pass_rate_band (Bae et al., 2025, "
        "'Online Difficulty Filtering for Reasoning Oriented RL', arXiv:2504.03380; PRIME's accuracy "
        "filter, arXiv:2502.01456). 'greso': skip prompts before rollout whose recent groups were all "
        "correct or all wrong, with GRESO's probabilistic skipping and self-tuning exploration "
        "(Zheng et al., 2025, 'Act Only When It Pays', arXiv:2506.02177). 'reinforce_ada': sample a "
        "prompt in rounds until its group has the outcomes ada_target asks for or max_rounds rounds "
        "were spent, then form a balanced group of rollout.num_samples (Xiong et al., 2025, "
        "'Reinforce-Ada', arXiv:2510.04996). 'difficulty_schedule': train on levels of task "
        "options that grow when recent training accuracy passes level_threshold. 'mixture': several "
        "tasks by weight, optionally adapted by learning progress (Matiisen et al., 2017, "
        "'Teacher-Student Curriculum Learning', arXiv:1707.00183).",
    )
    success_threshold: float = Field(
        1.0,
        description="A sample counts as a success (pass rates, accuracy per level or task) when its "
        "verifier reward (before length shaping) reaches this value; 1.0 reads 0/1 rewards as accuracy.",
    )
    max_rounds: int = Field(
        4, ge=1,
        description="difficulty_filter, greso: generation rounds per step at most while fewer than "
        "trainer.prompts_per_step groups were kept (as DAPO's dynamic sampling). reinforce_ada: rounds "
        "per prompt at most, so its sample budget is max_rounds x ada_samples_per_round.",
    )
    pass_rate_band: tuple[float, float] = Field(
        (0.25, 0.75),
        description="difficulty_filter: keep a group when lo <= its pass rate <= hi. Bae et al. show "
        "the policy-improvement bound is largest for pass rates near 0.5; PRIME keeps 0.2..0.8.",
    )
    filter_skip_known: bool = Field(
        False,
        description="difficulty_filter: also skip, before rollout, prompts whose last observed pass rate "
        "was outside the band (offline-style filtering as in Kimi k1.5, arXiv:2501.12599, done online).",
    )
    greso_target_zero_variance: float = Field(
        0.25, gt=0, lt=1,
        description="greso: the share of rolled-out groups that may be zero-variance; the exploration "
        "probabilities move by greso_p_step each step towards it, a third of it for all-correct groups "
        "and two thirds for all-wrong ones (the split of the authors' code: hard prompts are more "
        "likely to change).",
    )
    greso_p_init: float = Field(
        0.5, gt=0, le=1,
        description="greso: initial exploration probability p (easy and hard): a prompt whose last z "
        "visits were all zero-variance of one kind is rolled out with probability max(p^z, 0.01).",
    )
    greso_p_step: float = Field(0.01, gt=0, le=1, description="greso: change of p per step (paper: 0.01).")
    greso_p_range: tuple[float, float] = Field(
        (0.05, 0.95), description="greso: the exploration probabilities stay within this range (paper: 0.05..0.95)."
    )
    ada_samples_per_round: int | None = Field(
        None, ge=1,
        description="reinforce_ada: samples per active prompt per round (null: rollout.num_samples).",
    )
    ada_target: Literal["both", "balanced", "positive"] = Field(
        "balanced",
        description="reinforce_ada: when a prompt stops being sampled (once it has at least "
        "rollout.num_samples samples): 'positive' at least one success (Reinforce-Ada-pos), 'both' at "
        "least one success and one failure, 'balanced' at least half a group of each "
        "(Reinforce-Ada-balance, the paper's best).",
    )
    levels: list[dict[str, Any]] = Field(
        default_factory=list,
        description="difficulty_schedule: task.options overrides per level, easiest first (e.g. "
        "[{max_n: 15}, {max_n: 255}, {max_n: 1023}]); each level is its own seeded dataset, and "
        "questions held out by the `task` section are never trained on. Held-out evaluation stays "
        "on the `task` section as configured.",
    )
    level_threshold: float = Field(
        0.6, gt=0, le=1,
        description="difficulty_schedule: move to the next level when the training accuracy over the "
        "last level_window steps at this level reaches this value (a competence-based schedule as in "
        "Platanios et al., 2019, arXiv:1903.09848).",
    )
    level_window: int = Field(4, ge=1, description="difficulty_schedule: steps of training accuracy the level rule reads.")
    mixture: list[MixtureEntry] = Field(
        default_factory=list, description="mixture: the tasks and their weights (at least two)."
    )
    mixture_adapt: bool = Field(
        False,
        description="mixture: weight tasks by absolute learning progress |fast EMA - slow EMA| of "
        "their training accuracy (Matiisen et al., 2017), mixed with the configured weights by "
        "mixture_explore.",
    )
    mixture_explore: float = Field(
        0.2, ge=0, le=1, description="mixture_adapt: share of the configured weights in the mix."
    )
    mixture_ema: tuple[float, float] = Field(
        (0.5, 0.1), description="mixture_adapt: rates of the fast and slow accuracy averages."
    )

    @model_validator(mode="after")
    def _consistent(self) -> "CurriculumConfig":
        lo, hi = self.pass_rate_band
        if not 0 <= lo <= hi <= 1:
            raise ValueError(f"curriculum.pass_rate_band={self.pass_rate_band}: needs 0 <= lo <= hi <= 1")
        plo, phi = self.greso_p_range
        if not 0 < plo <= phi <= 1:
            raise ValueError(f"curriculum.greso_p_range={self.greso_p_range}: needs 0 < lo <= hi <= 1")
        fast, slow = self.mixture_ema
        if not (0 < slow <= 1 and 0 < fast <= 1):
            raise ValueError(f"curriculum.mixture_ema={self.mixture_ema}: rates must lie in (0, 1]")
        if self.strategy == "difficulty_schedule" and len(self.levels) < 2:
            raise ValueError("curriculum.strategy=difficulty_schedule needs curriculum.levels: at least two "
                             "task.options overrides, easiest first (e.g. [{max_n: 15}, {max_n: 1023}])")
        if self.strategy == "mixture":
            if len(self.mixture) < 2:
                raise ValueError("curriculum.strategy=mixture needs curriculum.mixture: at least two entries "
                                 "like {task: {name: leg_counting}, weight: 1.0}")
            labels = [e.label or e.task.get("name") for e in self.mixture]
            if None in labels or len(set(labels)) != len(labels):
                raise ValueError(f"curriculum.mixture: every entry needs a distinct label or task.name (got {labels})")
        return self


def check_ada_budget(group_size: int, samples_per_round: int, max_rounds: int) -> None:
    """Reinforce-Ada samples a prompt in at most ``max_rounds`` rounds of ``samples_per_round``:
    that budget must cover one group (the config validation and the strategy both ask here)."""
    if samples_per_round * max_rounds < group_size:
        raise ValueError(
            f"curriculum: reinforce_ada's budget max_rounds x ada_samples_per_round = {max_rounds} x "
            f"{samples_per_round} is smaller than the group size rollout.num_samples={group_size}; raise "
            "curriculum.max_rounds or curriculum.ada_samples_per_round"
        )
