"""Adapters from environment ecosystems to reinforge environments (docs/agents.md): the core for
gymnasium-style text environments (``base.register_text_env``) and, each imported only when its
environment is named, gymnasium, GEM, TextArena and OpenEnv."""

from reinforge.agents.adapters.base import (
    TEXT_ENVS,
    BaselineNotApplicable,
    IsolatedRNG,
    TextEnvAdapter,
    TextEnvSpec,
    TextEnvTask,
    episode_seeds,
    register_text_env,
    run_policy,
    text_env_spec,
)

__all__ = ["TEXT_ENVS", "BaselineNotApplicable", "IsolatedRNG", "TextEnvAdapter", "TextEnvSpec", "TextEnvTask", "episode_seeds",
           "register_text_env", "run_policy", "text_env_spec"]
