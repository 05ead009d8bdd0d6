"""Gymnasium environments (``pip install reinforge[gymnasium]``) as ``env.name: gymnasium``:

    task: {source: env}
    env:  {name: gymnasium, options: {env_id: FrozenLake-v1, render_mode: ansi, is_slippery: false}}

``env_id`` is a gymnasium id (``gymnasium.make(env_id, **kwargs)``, a ``module:Env-v0`` id
imports its module first), or a ``module:function`` factory returning a gymnasium environment.

Text in and out: an observation that is a string (a ``Text`` space) is shown as it is; with
``render_mode: ansi`` the environment's text rendering is shown (colour codes dropped, a
highlighted cell kept as ``[x]``), followed by the raw observation for non-text spaces; otherwise
``str(observation)``. An action is the model's text for a ``Text`` action space, or for a
``Discrete`` one the last integer in its turn (the prompt says which integers are allowed); a turn
with no valid integer leaves the environment untouched and asks again (reward 0). Success: the
environment's ``info["success"]`` when it gives one, else a positive reward on termination.
Baseline: ``random`` (the action space's ``sample()``, seeded per episode).
"""

from __future__ import annotations

import importlib
import re
from typing import Any

from reinforge.agents.adapters.base import register_text_env

_MISSING = "env.name=gymnasium needs gymnasium: pip install 'reinforge[gymnasium]'"
_ANSI_SPAN = re.compile(r"\x1b\[[0-9;]*m([^\x1b]*)\x1b\[0m")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_INT = re.compile(r"-?\d+")


def _gymnasium():
    try:
        import gymnasium
    except ImportError as err:
        raise ImportError(f"{_MISSING} ({err})") from None
    return gymnasium


def ansi_text(text: str) -> str:
    """Terminal rendering as plain text: a coloured span (a highlighted cell) becomes ``[span]``."""
    return _ANSI.sub("", _ANSI_SPAN.sub(lambda m: f"[{m.group(1)}]", text))


class GymnasiumTextEnv:
    """A gymnasium environment under the adapter contract (text observations and actions)."""

    def __init__(self, env):
        gym = _gymnasium()
        spaces = gym.spaces
        self.env = env
        self.action_space = env.action_space
        self.discrete = isinstance(env.action_space, spaces.Discrete)
        if not (self.discrete or isinstance(env.action_space, spaces.Text)):
            raise TypeError(f"{env.spec.id if env.spec else type(env).__name__}: its action space is "
                            f"{env.action_space}; the gymnasium adapter takes Text or Discrete actions")
        self.text_obs = isinstance(env.observation_space, spaces.Text)
        self.ansi = getattr(env, "render_mode", None) == "ansi"

    def _text(self, obs) -> str:
        if self.text_obs:
            return str(obs)
        if self.ansi:
            return f"{ansi_text(str(self.env.render())).strip()}\n(observation: {obs})"
        return str(obs)

    def _actions(self) -> str:
        lo = int(self.action_space.start)
        return f"an integer from {lo} to {lo + int(self.action_space.n) - 1}"

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        obs, info = self.env.reset(seed=seed)
        self.action_space.seed(seed)  # the random baseline's draws, per episode
        text = self._text(obs)
        if self.discrete:
            text += f"\nAnswer each turn with one action: {self._actions()}."
        return text, dict(info or {})

    def step(self, action: str):
        if self.discrete:
            found = _INT.findall(action)
            choice = int(found[-1]) if found else None
            if choice is None or not self.action_space.contains(choice):
                return f"Not a valid action. Answer with {self._actions()}.", 0.0, False, False, {"invalid_action": True}
            action = choice
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._text(obs), float(reward), bool(terminated), bool(truncated), dict(info or {})

    def sample_random_action(self) -> str:
        return str(self.action_space.sample())

    def close(self) -> None:
        self.env.close()


def make_gymnasium(env_id: str | None = None, **kwargs: Any) -> GymnasiumTextEnv:
    """A gymnasium environment by id, or from a ``module:function`` factory."""
    if not env_id:
        raise TypeError("env.options.env_id is required: a gymnasium id (e.g. FrozenLake-v1) or 'module:function'")
    gym = _gymnasium()
    factory = _factory(str(env_id))
    env = factory(**kwargs) if factory is not None else gym.make(env_id, **kwargs)
    return GymnasiumTextEnv(env)


def _factory(env_id: str):
    """The function named by ``module:function``, or None when ``env_id`` is a gymnasium id."""
    module, sep, attr = env_id.partition(":")
    if not sep or not attr.isidentifier():
        return None
    try:
        obj = getattr(importlib.import_module(module), attr, None)
    except ImportError:
        return None
    return obj if callable(obj) and not isinstance(obj, type) else None


def gymnasium_success(reward: float, info: dict) -> bool:
    """Without ``info["success"]``: a positive reward on termination (FrozenLake, Blackjack, Taxi)."""
    return reward > 0


def random_policy(observation: str, rng, env) -> str:
    """A uniformly random action from the action space (seeded per episode)."""
    return env.sample_random_action()


register_text_env("gymnasium", make_gymnasium,
                  doc="a gymnasium environment with text or discrete actions (env.options.env_id; reinforge[gymnasium])",
                  observation="append", success=gymnasium_success, baselines={"random": random_policy})
