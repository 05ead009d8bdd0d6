"""Python callables in a config (a reward function, an environment factory) given as objects by a
script that trains from Python. Each is recorded under a name that a later process can load:
``module:qualname``, or ``path/to/script.py:qualname`` for a function of the script being run
(``__main__``). config.yaml keeps the name (plain YAML; ``reinforge reproduce`` loads it again),
and this process keeps the object, so loading the name here returns the very function given,
without importing the script a second time (which would run its module code again).

:func:`load_callable` loads a name. A file or module that cannot be loaded (a syntax error, an
exception or a missing package at import) is one :class:`~reinforge.config.ConfigError` line
naming the file, the line and the fix, raised while the run is built (before the policy loads),
never a traceback."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .base import ConfigError

__all__ = ["callable_name", "name_callables", "given_callable", "load_callable"]

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


def load_callable(target: str, what: str = "function"):
    """``package.module:function`` or ``path/to/file.py:function`` (``Class.method`` qualnames
    too); a function this process gave the config as an object is that object. ``what`` names it
    in errors ("reward function", "environment factory")."""
    given = given_callable(target)
    if given is not None:
        return given
    if ":" not in target:
        raise ConfigError(f"{what} {target!r} must look like 'module:function' or 'file.py:function'")
    module_name, attr = target.rsplit(":", 1)
    if module_name.endswith(".py"):
        path = Path(module_name).expanduser()
        if not path.is_file():
            raise ConfigError(f"{what} file {str(path)!r} does not exist (from {target!r})")
        try:
            spec = importlib.util.spec_from_file_location(f"reinforge_user_reward_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - any failure of the user's module code
            raise ConfigError(_import_failure(what, target, err, path.resolve())) from None
    else:
        try:
            module = importlib.import_module(module_name)
        except (Exception, SystemExit) as err:  # noqa: BLE001 - any failure of the user's module code
            raise ConfigError(_import_failure(what, target, err, None, module_name)) from None
    fn = module
    for part in attr.split("."):
        fn = getattr(fn, part, None)
    if not callable(fn):
        defined = sorted(k for k, v in vars(module).items()
                         if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == module.__name__)
        listed = f"; it defines: {', '.join(defined[:12])}" if defined else ""
        raise ConfigError(f"{what} {target!r}: {module_name!r} has no callable {attr!r}{listed}")
    return fn


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _import_failure(what: str, target: str, err: BaseException, path: Path | None,
                    module_name: str | None = None) -> str:
    """One line: which file and line failed while ``target``'s module was imported, how, and the fix."""
    kind = type(err).__name__
    if isinstance(err, SyntaxError):  # its own file and line (the user's file, or one it imports)
        where = f"{err.filename} line {err.lineno}" if err.lineno else str(err.filename)
        code = f" (`{_one_line(err.text, 80)}`)" if err.text and err.text.strip() else ""
        return (f"cannot load {what} {target!r}: {where}: {kind}: {err.msg}{code}; fix that line of the file")
    missing = getattr(err, "name", None) if isinstance(err, ImportError) else None
    if module_name is not None and missing and (module_name == missing or module_name.startswith(missing + ".")):
        return (f"cannot import module {module_name!r} for {what} {target!r}: {_one_line(err)}; run from the folder "
                "that holds it or add that folder to PYTHONPATH, or give 'path/to/file.py:function'")
    frame = _user_frame(err, path)
    where = f"{frame.filename} line {frame.lineno}" if frame is not None else (str(path) if path else module_name)
    code = f" (`{_one_line(frame.line, 80)}`)" if frame is not None and frame.line else ""
    fix = (f"install {missing!r} or remove that import" if isinstance(err, ImportError) and missing
           else "fix that line, or what it calls")
    return f"cannot load {what} {target!r}: {where}{code} raised {kind}: {_one_line(err)} at import; {fix}"


def _user_frame(err: BaseException, path: Path | None):
    """The line of the user's module whose execution failed: in the file given (``path``), else
    the first frame outside importlib and this module (the named module's top level)."""
    here = Path(__file__).resolve()
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not f.filename.startswith("<") and Path(f.filename).resolve() != here
              and "importlib" not in Path(f.filename).parts]
    if path is None and frames:
        path = Path(frames[0].filename).resolve()
    own = [f for f in frames if Path(f.filename).resolve() == path]
    return own[-1] if own else (frames[0] if frames else None)
