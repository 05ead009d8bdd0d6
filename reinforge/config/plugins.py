"""Plugins: the modules a run imports before its config is validated, so that their
``register_env`` / ``register_verifier`` calls count, and the Python entry points through which
an installed package offers environments (group ``reinforge.envs``) and verifiers (group
``reinforge.verifiers``) with no import written anywhere (docs/agents.md, "Plugins").

- ``imports`` (a top-level config key, and ``--import`` on the command line): module names
  (``my_envs``, ``pkg.envs``) or Python files (``envs/my_envs.py``), imported in order when a
  config is validated, in every process that validates it (the trainer, Ray workers,
  ``reinforge eval`` and ``reproduce`` of the saved run). Each is imported once per process.
- entry points are listed by name only (cheap: no import) for validation, and one is loaded at the
  first lookup of a name that nothing registered (reinforge/agents/registry.py,
  reinforge/rewards/registry.py).

Standard library only (layer 1): the registries live in the layers that own what they register.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from .base import ConfigError
from .callables import _import_failure

__all__ = ["ENV_GROUP", "VERIFIER_GROUP", "import_plugins", "command_line_imports", "entry_point_names",
           "load_entry_point", "plugin_imports", "REGISTERED_VERIFIERS"]

ENV_GROUP = "reinforge.envs"
VERIFIER_GROUP = "reinforge.verifiers"

_IMPORTED: dict[str, ModuleType] = {}  # each plugin imported once per process (by its resolved name)
_COMMAND_LINE: list[str] = []          # `--import` of the command under way
# Names given to reinforge.rewards.register_verifier (kept here so that the config can accept them).
REGISTERED_VERIFIERS: set[str] = set()


def import_plugins(names: Sequence[str], where: str = "") -> list[ModuleType]:
    """Import each plugin of ``names`` (a module name, or a path ending in .py); a plugin that
    fails is one ConfigError line naming it, the file and line that failed, and the fix (after
    ``where``, e.g. "--import", when given)."""
    return [_import_one(str(n), f"{where}: " if where else "") for n in names]


def _import_one(name: str, where: str) -> ModuleType:
    is_file = name.endswith(".py") or "/" in name or "\\" in name
    key = str(Path(name).expanduser().resolve()) if is_file else name
    if key in _IMPORTED:
        return _IMPORTED[key]
    if is_file:
        path = Path(key)
        if not path.is_file():
            raise ConfigError(f"{where}plugin file {name!r} does not exist (give a module name or a path to a .py file)")
        # One module name per file path, the same in every process (a Ray worker unpickles the
        # plugin's objects by it), so the same file named twice is one import.
        mod_name = f"reinforge_plugin_{path.stem}_{hashlib.sha1(key.encode()).hexdigest()[:8]}"
        try:
            spec = importlib.util.spec_from_file_location(mod_name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[mod_name] = module  # dataclasses and pickling look their module up there
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - any failure of the user's module code
            sys.modules.pop(mod_name, None)
            raise ConfigError(_import_failure("plugin", name, err, path).replace(
                "cannot load plugin", f"{where}cannot import plugin")) from None
    else:
        try:
            module = importlib.import_module(name)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - any failure of the user's module code
            msg = _import_failure("plugin", name, err, None, name).replace(
                "or give 'path/to/file.py:function'", "or give the path of its .py file")
            raise ConfigError(f"{where}{msg}") from None
    _IMPORTED[key] = module
    return module


@contextlib.contextmanager
def command_line_imports(names: Sequence[str] | None) -> Iterator[None]:
    """While a command runs: ``--import`` plugins, imported now (a bad one fails before anything
    else) and added to the ``imports`` of every config the command validates, so that they are
    saved with the run and imported again by its Ray workers, ``eval`` and ``reproduce``."""
    names = [str(n) for n in names or []]
    import_plugins(names, "--import")
    _COMMAND_LINE[:] = names
    try:
        yield
    finally:
        _COMMAND_LINE.clear()


def plugin_imports(value: Any) -> list[str]:
    """A config's ``imports`` with the command line's added (each once, in order), all imported."""
    if value is None:
        value = []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ValueError(f"must be a list of module names or .py paths, e.g. [my_envs, envs/extra.py] (got {value!r})")
    out = list(dict.fromkeys([*value, *_COMMAND_LINE]))
    import_plugins(out)
    return out


def _entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=group))


def entry_point_names(group: str) -> list[str]:
    """The names installed packages offer in ``group`` (nothing is imported)."""
    return sorted({ep.name for ep in _entry_points(group)})


def load_entry_point(group: str, name: str) -> Any | None:
    """The object of entry point ``name`` in ``group`` (None when no package offers it); one that
    fails to load is a ConfigError naming the entry point, its package and the error."""
    for ep in _entry_points(group):
        if ep.name != name:
            continue
        try:
            return ep.load()
        except (Exception, SystemExit) as err:  # noqa: BLE001 - any failure of the package's code
            dist = getattr(ep, "dist", None)
            pkg = f" of package {dist.name} {dist.version}" if dist is not None else ""
            raise ConfigError(
                f"entry point {ep.name} = {ep.value} (group {group}){pkg} failed to load: {type(err).__name__}: "
                f"{' '.join(str(err).split())[:300]}; fix or reinstall that package, or uninstall it") from None
    return None
