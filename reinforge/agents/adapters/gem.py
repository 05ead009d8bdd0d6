"""GEM environments (``pip install reinforge[gem]``; GEM: "A Gym for Generalist LLMs",
https://github.com/axon-rl/gem) as ``env.name: gem``:

    task: {source: env}
    env:  {name: gem, options: {env_id: "game:GuessTheNumber-v0-easy"}}   # plus the env's kwargs

GEM's ``reset(seed)`` seeds the global ``random`` and ``numpy.random`` and its games draw from
them: the adapter core (adapters/base.py) runs every call inside the episode's own streams. Each
step's observation is GEM's reply plus its ``info["suffix"]`` (the next-turn instruction, as GEM's
own observation wrappers add it). Success is the terminal reward reaching GEM's success reward
(``LanguageGameReward.success_reward``, 1.0); GEM's format error (-0.1) and the partial reward of
a game that ran out of turns are not successes. Baselines: ``random`` (the game's own
``sample_random_action``) and, for GuessTheNumber, ``bisect`` (halving the range from the hints).
"""

from __future__ import annotations

import logging
import re
import weakref
from typing import Any

from reinforge.agents.adapters.base import BaselineNotApplicable, register_text_env

_MISSING = "env.name=gem needs GEM: pip install 'reinforge[gem]'"


def _gem():
    # Importing gem calls logging.basicConfig(level=INFO), which would print every library's INFO
    # lines in the trainer: the root logger is put back as it was.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        import gem
        from gem.envs.registration import ENV_REGISTRY
    except ImportError as err:
        raise ImportError(f"{_MISSING} ({err})") from None
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return gem, ENV_REGISTRY


class GemTextEnv:
    """A GEM environment under the adapter contract: text in and out, the suffix appended."""

    def __init__(self, env):
        self.env = env

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        obs, info = self.env.reset(seed=seed)
        return str(obs), dict(info or {})

    def step(self, action: str):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info or {})
        text = str(obs)
        if info.get("suffix") and not (terminated or truncated):
            text = f"{text}\n{info['suffix']}"
        return text, float(reward), bool(terminated), bool(truncated), info

    def sample_random_action(self) -> str:
        return self.env.sample_random_action()

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def make_gem(env_id: str | None = None, **kwargs: Any) -> GemTextEnv:
    """A GEM environment by id (``gem.make(env_id, **kwargs)``)."""
    if not env_id:
        raise TypeError("env.options.env_id is required: a GEM environment id, e.g. 'game:GuessTheNumber-v0-easy'")
    gem, registry = _gem()
    if env_id not in registry:
        near = sorted(k for k in registry if k.split("-")[0] == str(env_id).split("-")[0]) or sorted(registry)[:8]
        raise TypeError(f"env_id={env_id!r} is not a GEM environment; e.g. {', '.join(near)}")
    return GemTextEnv(gem.make(env_id, **kwargs))


def _success_reward() -> float:
    try:
        from gem.utils.constants import LanguageGameReward
    except ImportError:
        return 1.0
    return float(LanguageGameReward.success_reward)


def gem_success(reward: float, info: dict) -> bool:
    """GEM reports no verdict: the terminal reward reaching its success reward is one."""
    return reward >= _success_reward() - 1e-9


def random_policy(observation: str, rng, env) -> str:
    """GEM's own random action for the game (``sample_random_action``, drawn from the episode's
    isolated global streams)."""
    try:
        return env.sample_random_action()
    except (NotImplementedError, AttributeError):
        raise BaselineNotApplicable("this GEM environment has no sample_random_action") from None


_RANGE = re.compile(r"between (-?\d+) and (-?\d+)")
_HINT = re.compile(r"you guessed (-?\d+), and the target number is (higher|lower)")
_BOUNDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _hinted_range(observation: str, env) -> list[int]:
    """GuessTheNumber's range as the game's text leaves it: from its instructions, then narrowed by
    each "higher"/"lower" hint (kept per game, so a policy reads only what a player sees)."""
    if not str(getattr(env.env, "env_id", "")).startswith("game:GuessTheNumber"):
        raise BaselineNotApplicable("plays GuessTheNumber only")
    found = _RANGE.search(observation)
    if found:  # the opening instructions: a new game
        _BOUNDS[env] = [int(found.group(1)), int(found.group(2))]
    lo_hi = _BOUNDS.setdefault(env, [1, 100])
    hint = _HINT.search(observation)
    if hint:
        guess = int(hint.group(1))
        if hint.group(2) == "higher":
            lo_hi[0] = max(lo_hi[0], guess + 1)
        else:
            lo_hi[1] = min(lo_hi[1], guess - 1)
    return lo_hi


def bisect_policy(observation: str, rng, env) -> str:
    """GuessTheNumber played by halving the range the hints leave (always wins the easy game)."""
    lo, hi = _hinted_range(observation, env)
    return "\\boxed{" + str((lo + hi) // 2) + "}"


def hinted_random_policy(observation: str, rng, env) -> str:
    """GuessTheNumber played by a uniform guess within the range the hints leave: a random player
    that reads the hints (wins about 0.76 of easy games, against 0.34 for GEM's random guesses)."""
    lo, hi = _hinted_range(observation, env)
    return "\\boxed{" + str(rng.randint(lo, max(lo, hi))) + "}"


register_text_env("gem", make_gem, doc="a GEM environment (env.options.env_id, plus its kwargs; reinforge[gem])",
                  observation="append", success=gem_success,
                  baselines={"random": random_policy, "hinted_random": hinted_random_policy, "bisect": bisect_policy})
