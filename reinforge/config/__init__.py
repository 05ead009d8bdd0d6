"""Typed run configuration: loaded from YAML, overridden with ``key=value`` or Python sections,
validated before any model loads, and saved whole into the run directory.

Every section rejects unknown keys, so a typo names itself in the error together with the keys
that are accepted. docs/config-reference.md lists every key (``scripts/config_reference.py``
writes it from these classes).

Layer 1: this package imports only ``reinforge.algorithms``, ``reinforge.recipes`` and itself.
``base`` <- the sections (``model``, ``task``, ``algorithm``, ``components``, ``tracking``,
``sft``, ``curriculum``) <- ``run`` (``RunConfig``) <- ``load``; ``callables`` names the Python
functions a config was given as objects.
"""

from __future__ import annotations

from .algorithm import AlgorithmConfig, CriticConfig
from .base import DEFAULT_MODEL, ConfigError, _rename_key, _Section
from .callables import callable_name, given_callable, name_callables
from .components import EnvConfig, LearnerConfig, RolloutConfig, ScaleConfig, TrainerConfig
from .curriculum import CurriculumConfig, MixtureEntry, check_ada_budget
from .load import (
    apply_overrides,
    build_config,
    deep_merge,
    load_config,
    parse_override,
    parse_value,
    recipe_preset,
    set_dotted,
    validate_config,
)
from .model import LoraConfig, ModelConfig
from .run import RunConfig
from .sft import ExpertIterationConfig, SFTConfig
from .task import FewShotExample, HackingGuardConfig, RewardConfig, TaskConfig, VerifierSpec
from .tracking import (
    EXPORTERS,
    MlflowOptions,
    TensorboardOptions,
    TrackingConfig,
    TrackioOptions,
    WandbOptions,
    missing_exporter,
    missing_exporter_message,
)

__all__ = [
    "DEFAULT_MODEL", "EXPORTERS", "AlgorithmConfig", "ConfigError", "CriticConfig", "CurriculumConfig", "EnvConfig",
    "ExpertIterationConfig", "FewShotExample", "HackingGuardConfig", "LearnerConfig", "LoraConfig", "MixtureEntry",
    "MlflowOptions", "ModelConfig", "RewardConfig", "RolloutConfig", "RunConfig", "SFTConfig", "ScaleConfig",
    "TaskConfig", "TensorboardOptions", "TrackingConfig", "TrackioOptions", "TrainerConfig", "VerifierSpec",
    "WandbOptions", "_Section", "_rename_key", "apply_overrides", "build_config", "callable_name",
    "check_ada_budget", "deep_merge", "given_callable", "load_config", "missing_exporter", "missing_exporter_message",
    "name_callables", "parse_override", "parse_value", "recipe_preset", "set_dotted", "validate_config",
]
