"""reinforge: reinforcement-learning post-training of language models.

Train from Python with a reward and an environment defined in the same script::

    import reinforge

    def reward(completion: str, example) -> float:
        return float(completion.strip() == example.answer)

    cfg = reinforge.load_config("configs/main.yaml", ["trainer.steps=10"],
                                reward={"verifiers": [{"name": "python", "options": {"function": reward}}]})
    result = reinforge.Trainer(cfg).run()      # result.run_dir, result.summary

A callable in the config is recorded as ``module:qualname`` (a script's own functions as
``path/to/script.py:qualname``), so config.yaml stays plain YAML and ``reinforge reproduce`` can
load it again. examples/ has a custom reward, a custom multi-turn environment and a custom
advantage estimator, each one short file.

The names below load on first use: ``import reinforge`` imports neither torch nor transformers (the
command line installs its signal handlers before anything heavy loads).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    # training and its result
    "Trainer": "reinforge.trainer",
    "RunResult": "reinforge.trainer",
    # the config and its loaders
    "RunConfig": "reinforge.config",
    "ConfigError": "reinforge.config",
    "load_config": "reinforge.config",
    "build_config": "reinforge.config",
    # registries: advantage estimators, policy losses, environments
    "register_advantage": "reinforge.algorithms",
    "register_policy_loss": "reinforge.algorithms",
    "ADVANTAGE_ESTIMATORS": "reinforge.algorithms",
    "POLICY_LOSSES": "reinforge.algorithms",
    "AdvantageInputs": "reinforge.algorithms",
    "Advantages": "reinforge.algorithms",
    "Needs": "reinforge.algorithms",
    "register_env": "reinforge.agents",
    "ENVS": "reinforge.agents",
    # environment, tool and verifier types
    "Env": "reinforge.agents",
    "ToolEnv": "reinforge.agents",
    "StepResult": "reinforge.agents",
    "Tool": "reinforge.agents",
    "Example": "reinforge.tasks",
    "VerifierResult": "reinforge.rewards",
    # runs on disk
    "RunDir": "reinforge.tracking",
    "compare_runs": "reinforge.evaluation.compare",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:  # PEP 562: load a public name's module on first use
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'reinforge' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs; never run
    from reinforge.agents import ENVS, Env, StepResult, Tool, ToolEnv, register_env
    from reinforge.algorithms import (
        ADVANTAGE_ESTIMATORS,
        POLICY_LOSSES,
        AdvantageInputs,
        Advantages,
        Needs,
        register_advantage,
        register_policy_loss,
    )
    from reinforge.config import ConfigError, RunConfig, build_config, load_config
    from reinforge.evaluation.compare import compare_runs
    from reinforge.rewards import VerifierResult
    from reinforge.tasks import Example
    from reinforge.tracking import RunDir
    from reinforge.trainer import RunResult, Trainer
