"""The registry through which a config names an environment (``env.name``): user factories
registered with :func:`register_env`, the bundled ones (agents/envs.py) added at the first lookup,
and ``module:function`` / ``file.py:function`` names loaded on demand."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reinforge.rewards.verifiers import load_callable

__all__ = ["ENVS", "EnvSpec", "register_env", "env_spec", "env_factory"]


@dataclass(frozen=True)
class EnvSpec:
    """A registered environment: ``factory(task, **options) -> Env`` (called once per trajectory,
    with the run's task); ``make_task(task_config) -> Task`` when the environment makes its own
    examples (``task.source: env``); ``doc``: one line for errors and docs."""

    name: str
    factory: Callable[..., Any]
    make_task: Callable[..., Any] | None = None
    doc: str = ""


ENVS: dict[str, EnvSpec] = {}


def register_env(name: str, *, make_task: Callable[..., Any] | None = None):
    """Register ``factory(task, **options) -> Env`` under ``name`` (a decorator); a config then
    names it as ``env.name``. The bundled names (calculator, guess_number, code_feedback) are taken."""
    _register_bundled()

    def deco(factory):
        if name in ENVS and not _same_function(ENVS[name].factory, factory):
            raise ValueError(f"an environment named {name!r} is already registered")
        # The same function registered again (a script run as __main__ and imported by name by a
        # verifier or a Ray worker) keeps the first registration.
        ENVS.setdefault(name, EnvSpec(name, factory, make_task, _doc(factory)))
        return factory

    return deco


def env_spec(name: str) -> EnvSpec:
    """The registered environment ``name``, or for ``module:function`` / ``file.py:function`` that
    function as the factory (its module may also register further environments)."""
    _register_bundled()
    if ":" in name and name not in ENVS:
        factory = load_callable(name, "environment factory")
        return ENVS.get(name) or EnvSpec(name, factory, None, _doc(factory))
    if name not in ENVS:
        raise ValueError(f"env.name={name!r} is not a registered environment; registered: "
                         f"{', '.join(sorted(ENVS))} (or name your factory as 'module:function' or "
                         "'file.py:function')")
    return ENVS[name]


def env_factory(name: str, options: dict[str, Any], task) -> Callable[[], Any]:
    """A no-argument function making a fresh environment for one trajectory. One environment is
    made here, so bad options fail before any model loads."""
    spec = env_spec(name)

    def make():
        env = spec.factory(task, **options)
        for attr in ("reset", "step"):
            if not callable(getattr(env, attr, None)):
                raise TypeError(f"environment {name!r} has no {attr}() method (see reinforge.agents.Env)")
        return env

    try:
        make()
    except TypeError as err:
        raise ValueError(f"env.options for environment {name!r}: {err}") from None
    return make


def _doc(factory) -> str:
    return (factory.__doc__ or "").strip().split("\n")[0]


def _same_function(a, b) -> bool:
    """One function seen twice: the same object, or the same qualified name defined in the same
    file (a module imported again under another name, such as a script that is also __main__)."""
    if a is b:
        return True
    try:
        return a.__qualname__ == b.__qualname__ and inspect.getsourcefile(a) == inspect.getsourcefile(b)
    except (AttributeError, TypeError):
        return False


def _register_bundled() -> None:
    from reinforge.agents import envs

    for name, (factory, make_task) in envs.BUNDLED.items():
        ENVS.setdefault(name, EnvSpec(name, factory, make_task, _doc(factory)))
