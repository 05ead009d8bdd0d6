"""Python callables in a config (a reward function, an environment factory) given as objects by a
script that trains from Python. Each is recorded under a name that a later process can load:
``module:qualname``, or ``path/to/script.py:qualname`` for a function of the script being run
(``__main__``). config.yaml keeps the name (plain YAML; ``reinforge reproduce`` loads it again),
and this process keeps the object, so loading the name here returns the very function given,
without importing the script a second time (which would run its module code again)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["callable_name", "name_callables", "given_callable"]

_GIVEN: dict[str, Callable[..., Any]] = {}


def callable_name(fn: Callable[..., Any]) -> str:
    """``module:qualname`` of ``fn`` (its file's path for the script run as ``__main__``)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    if module == "__main__":
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        if main_file:
            module = str(Path(main_file).resolve())
    if module is None:
        raise ValueError(f"cannot name {fn!r} in a config: it has no module; give 'module:function' instead")
    return f"{module}:{qualname}"


def name_callables(tree: Any) -> Any:
    """``tree`` (a raw config dict) with every callable replaced by its name, each remembered for
    :func:`given_callable`. Classes count too (an environment class is its own factory)."""
    if isinstance(tree, dict):
        return {k: name_callables(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [name_callables(v) for v in tree]
    if callable(tree):
        name = callable_name(tree)
        _GIVEN[name] = tree
        return name
    return tree


def given_callable(name: str) -> Callable[..., Any] | None:
    """The object a config of this process named ``name``, if one was given as an object."""
    return _GIVEN.get(name)
