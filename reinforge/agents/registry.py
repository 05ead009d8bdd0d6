"""The registry through which a config names an environment (``env.name``): user factories
registered with :func:`register_env` (in a module the config's ``imports`` names), the bundled ones
(agents/envs.py) added at the first lookup, ``module:function`` / ``file.py:function`` names loaded
on demand, and installed packages' entry points (group ``reinforge.envs``) loaded at the first
lookup of a name nothing registered.

An environment that makes its own examples (``task.source: env``) has a ``make_task``: given to
:func:`register_env`, or, for a factory named as ``module:function`` / ``file.py:function`` (or an
entry point's factory), the factory's ``make_task`` attribute (``my_env.make_task = make_my_task``).
It is called as ``make_task(task_config, **env.options)`` (:func:`make_env_task`), so the
environment's id and options are written once, in ``env.options``; a ``make_task(task_config)``
that takes nothing else is called with the task config alone."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reinforge.config.base import ConfigError
from reinforge.config.plugins import ENV_GROUP, entry_point_names, load_entry_point
from reinforge.rewards.verifiers import load_callable

__all__ = ["ENVS", "EnvSpec", "register_env", "env_spec", "env_factory", "make_env_task"]


@dataclass(frozen=True)
class EnvSpec:
    """A registered environment: ``factory(task, **options) -> Env`` (called once per trajectory,
    with the run's task); ``make_task(task_config, **options) -> Task`` when the environment makes
    its own examples (``task.source: env``; :func:`make_env_task`); ``doc``: one line for errors
    and docs."""

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
    """The registered environment ``name``; for ``module:function`` / ``file.py:function`` that
    function as the factory, its ``make_task`` attribute (or the registration of the same function
    by its module) making the examples; else an installed package's ``reinforge.envs`` entry point
    of that name (its module may register it, or its object is the factory)."""
    _register_bundled()
    if ":" in name and name not in ENVS:
        factory = load_callable(name, "environment factory")
        if name in ENVS:
            return ENVS[name]
        registered = next((s for s in ENVS.values() if _same_function(s.factory, factory)), None)
        make_task = getattr(factory, "make_task", None) or (registered.make_task if registered else None)
        return EnvSpec(name, factory, make_task, _doc(factory))
    if name not in ENVS:
        obj = load_entry_point(ENV_GROUP, name)
        if obj is not None and name not in ENVS:
            if not callable(obj):
                raise ConfigError(f"entry point {name!r} (group {ENV_GROUP}) is a {type(obj).__name__}, not an "
                                  "environment factory; point it at factory(task, **options) -> Env")
            ENVS[name] = EnvSpec(name, obj, getattr(obj, "make_task", None), _doc(obj))
    if name not in ENVS:
        offered = entry_point_names(ENV_GROUP)
        raise ValueError(f"env.name={name!r} is not a registered environment; registered: "
                         f"{', '.join(sorted({*ENVS, *offered}))} (import the module that registers it with "
                         "`imports: [MODULE]` or --import MODULE, or name your factory as 'module:function' or "
                         "'file.py:function')")
    return ENVS[name]


def make_env_task(spec: EnvSpec, task_config, options: dict[str, Any]):
    """``spec.make_task(task_config, **options)``. A make_task without ``**kwargs`` gets the options
    it names (the factory, made once at build time, is the one that refuses an unknown option), so
    one written before make_task took options, ``make_task(task_config)``, still works."""
    try:
        params = list(inspect.signature(spec.make_task).parameters.values())
    except (TypeError, ValueError):  # no signature to read: it gets what the contract says
        params = None
    if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params):
        named = {p.name for p in params[1:] if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
        options = {k: v for k, v in options.items() if k in named}
    return spec.make_task(task_config, **options)


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
