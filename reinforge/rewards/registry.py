"""Verifiers from plugins: a name registered with :func:`register_verifier` (in a module the
config's ``imports`` names), or offered by an installed package as an entry point of group
``reinforge.verifiers``, loaded at the first lookup of a name nothing registered. A config then
names it in ``reward.verifiers`` like a built-in one (docs/agents.md, Plugins)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from reinforge.config.base import ConfigError
from reinforge.config.plugins import REGISTERED_VERIFIERS, VERIFIER_GROUP, load_entry_point
from reinforge.config.task import BUILTIN_VERIFIERS
from reinforge.rewards.verifiers import VerifierResult

__all__ = ["VERIFIER_PLUGINS", "VerifierPlugin", "register_verifier", "verifier_plugin", "build_plugin_verifier"]


@dataclass(frozen=True)
class VerifierPlugin:
    """``factory(**options) -> fn`` with ``fn(completion, example) -> float | VerifierResult``;
    the factory also gets ``task`` and ``answer_format`` when its signature names them.
    ``correctness``: its verdict (a VerifierResult's ``correct``, else score >=
    reward.correct_threshold) counts as correct in accuracy; False for a shaping term."""

    name: str
    factory: Callable[..., Any]
    correctness: bool = True
    doc: str = ""


VERIFIER_PLUGINS: dict[str, VerifierPlugin] = {}


def register_verifier(name: str, factory: Callable[..., Any] | None = None, *, correctness: bool = True):
    """Register ``factory`` under ``name`` (a decorator, or called with the factory)."""
    if name in BUILTIN_VERIFIERS:
        raise ValueError(f"verifier name {name!r} is built in; register yours under another name")

    def deco(fn):
        old = VERIFIER_PLUGINS.get(name)
        if old is not None and old.factory is not fn and getattr(old.factory, "__qualname__", None) != getattr(
                fn, "__qualname__", ""):
            raise ValueError(f"a verifier named {name!r} is already registered")
        VERIFIER_PLUGINS.setdefault(name, VerifierPlugin(name, fn, correctness, (fn.__doc__ or "").strip().split("\n")[0]))
        REGISTERED_VERIFIERS.add(name)
        return fn

    return deco(factory) if factory is not None else deco


def verifier_plugin(name: str) -> VerifierPlugin | None:
    """The plugin verifier ``name``: registered, or loaded now from its entry point (whose module
    may register it, or whose object is the factory). None when no plugin has that name."""
    if name in VERIFIER_PLUGINS:
        return VERIFIER_PLUGINS[name]
    obj = load_entry_point(VERIFIER_GROUP, name)
    if obj is None:
        return None
    if name not in VERIFIER_PLUGINS:
        if not callable(obj):
            raise ConfigError(f"entry point {name!r} (group {VERIFIER_GROUP}) is a {type(obj).__name__}, not a "
                              "verifier factory; point it at factory(**options) -> fn(completion, example)")
        register_verifier(name, obj, correctness=bool(getattr(obj, "correctness", True)))
    return VERIFIER_PLUGINS[name]


class _PluginVerifier:
    def __init__(self, name: str, fn: Callable[..., Any]):
        self.name = name
        self.fn = fn

    def __call__(self, completion: str, example) -> VerifierResult:
        out = self.fn(completion, example)
        return out if isinstance(out, VerifierResult) else VerifierResult(out)  # checked where it is scored


def build_plugin_verifier(plugin: VerifierPlugin, options: dict[str, Any], *, task, answer_format: str,
                          where: str) -> _PluginVerifier:
    kwargs = dict(options)
    try:
        params = inspect.signature(plugin.factory).parameters
    except (TypeError, ValueError):
        params = {}
    for key, value in (("task", task), ("answer_format", answer_format)):
        if key in params:
            kwargs.setdefault(key, value)
    try:
        fn = plugin.factory(**kwargs)
    except TypeError as err:
        raise ValueError(f"{where}.options (verifier {plugin.name!r}): {err}") from None
    if not callable(fn):
        raise ValueError(f"{where}: verifier {plugin.name!r}'s factory returned a {type(fn).__name__}, not a "
                         "function fn(completion, example) -> float | VerifierResult")
    return _PluginVerifier(plugin.name, fn)
