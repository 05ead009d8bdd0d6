"""The ``reinforge train-rm`` config: a training config (``RunConfig``: the sampling policy, the
task, the labelling verifiers, sampling settings, tracking, the seed) plus an ``rm:`` section
(``RMSettings``), loaded by ``load_rm_config``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError

from reinforge.config import ConfigError, RunConfig, _Section, apply_overrides, build_config
from reinforge.config.textfile import read_utf8
from reinforge.rewards.models.verifiers import AGGREGATES


class RMSettings(_Section):
    """What ``reinforge train-rm`` trains, from which data, and how it is measured."""

    kind: Literal["prm", "outcome"] = Field(
        "prm", description="'prm': a process reward model from Monte-Carlo step labels (Math-Shepherd, "
        "arXiv:2312.08935); 'outcome': an outcome reward model from the verifiers' verdicts.")
    init: str | None = Field(None, description="Local model folder the reward model starts from "
                             "(null: model.path, the policy's weights, as Math-Shepherd and PRIME do).")
    train_prompts: int = Field(32, ge=1, description="Training prompts labelled (from the task's training split).")
    eval_prompts: int = Field(16, ge=1, description="Held-out prompts labelled and measured on.")
    samples_per_prompt: int = Field(4, ge=1, description="Completions per prompt: N of the best-of-N measurement.")
    mc_rollouts: int = Field(4, ge=1, description="kind=prm: completions sampled from each step's prefix (Math-Shepherd's N).")
    labels: Literal["soft", "hard"] = Field(
        "soft", description="kind=prm: 'soft' = the fraction of rollouts reaching a correct answer "
        "(Math-Shepherd's soft estimation), 'hard' = 1 if any does (hard estimation).")
    separator: str = Field("\n", description="Literal string between steps.")
    pattern: str | None = Field(None, description="Regular expression between steps (wins over separator).")
    max_steps: int = Field(8, ge=1, description="The most steps per completion (the rest joins the last).")
    aggregate: Literal[AGGREGATES] = Field("min", description="kind=prm: a completion's score for best-of-N "
                                           "from its step scores (min, last, mean, prod).")
    lr: float = Field(2e-5, gt=0, description="AdamW learning rate of the reward model.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled weight decay while training the reward model.")
    epochs: int = Field(2, ge=1, description="Passes over the labelled training completions.")
    batch_size: int = Field(8, ge=1, description="Completions per optimiser step.")
    max_length: int = Field(512, ge=16, description="Tokens the reward model reads (longer texts lose their start).")
    freeze_body: bool = Field(False, description="Train the score head only (PURE's first stage).")
    bootstrap_resamples: int = Field(2000, ge=100, description="Bootstrap resamples of the intervals.")
    generation_batch_size: int = Field(64, ge=1, description="Completions generated together.")


class RMRunConfig:
    """A train-rm config: a training config (model = the sampling policy, task, reward = the
    labelling verifiers, rollout = sampling settings, tracking, trainer.seed) plus ``rm``."""

    def __init__(self, run: RunConfig, rm: RMSettings) -> None:
        self.run, self.rm = run, rm

    def __getattr__(self, name: str):  # tracking, model, task, trainer, recipe: RunDir.create reads them
        if name in ("run", "rm"):
            raise AttributeError(name)
        return getattr(self.run, name)

    def to_dict(self) -> dict[str, Any]:
        return {**self.run.to_dict(), "rm": self.rm.model_dump(mode="json")}

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], overrides: list[str] | None = None) -> "RMRunConfig":
        raw = apply_overrides(raw, overrides)
        rm_raw = raw.pop("rm", None) or {}
        if not isinstance(rm_raw, dict):
            raise ConfigError("rm: must be a mapping of train-rm settings (kind, train_prompts, ...)")
        run = build_config(raw)
        try:
            rm = RMSettings.model_validate(rm_raw)
        except ValidationError as err:
            lines = [f"  rm.{'.'.join(map(str, e['loc']))}: {e['msg']}" + (
                f"; accepted keys here: {', '.join(RMSettings.model_fields)}" if e["type"] == "extra_forbidden" else "")
                for e in err.errors()]
            raise ConfigError("invalid train-rm config:\n" + "\n".join(lines)) from None
        if any(v.name in ("outcome_rm", "prm", "judge", "implicit_prm") for v in run.reward.verifiers):
            raise ConfigError("train-rm labels completions with verifiers of the answer (reward.verifiers: task, "
                              "math_verify, ...), not with reward models")
        return cls(run, rm)


def load_rm_config(path: str | Path | None, overrides: list[str] | None = None) -> RMRunConfig:
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            raw = yaml.safe_load(read_utf8(p, "config file", ConfigError)) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {' '.join(str(err).split())}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections")
    return RMRunConfig.from_dict(raw, overrides)
