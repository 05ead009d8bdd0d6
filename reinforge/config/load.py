"""Loading a run config: the recipe's preset, then the YAML file, then ``key=value`` overrides,
validated into a ``RunConfig``; a ``ConfigError`` names each wrong key with the keys or values
that are accepted."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ..recipes import RECIPES
from .base import ConfigError
from .callables import name_callables
from .textfile import read_utf8
from .run import RunConfig


def parse_value(text: str) -> Any:
    """`key=value` values are YAML scalars/lists/maps: 3, 0.1, true, null, [a, b], {k: v}."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def parse_override(item: str) -> tuple[str, Any]:
    """``"trainer.steps=20"`` -> ``("trainer.steps", 20)``; the value is parsed as YAML."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key=value (e.g. trainer.steps=20)")
    key, value = item.split("=", 1)
    return key.strip(), parse_value(value)


def deep_merge(base: dict, update: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def set_dotted(tree: dict, dotted: str, value: Any) -> None:
    """Set ``tree["a"]["b"]["c"] = value`` for ``dotted="a.b.c"``, creating missing sections; the
    one place every command-line, sweep and eval override goes through. The value is copied, so
    the tree never shares a list or mapping with the caller."""
    keys = dotted.split(".")
    if not all(keys):
        raise ConfigError(f"override key {dotted!r} has an empty part; write section.key, e.g. trainer.steps")
    node = tree
    for k in keys[:-1]:
        nxt = node.setdefault(k, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {dotted!r}: {k!r} is not a config section")
        node = nxt
    node[keys[-1]] = copy.deepcopy(value)


def apply_overrides(raw: dict[str, Any], overrides: list[str] | None) -> dict[str, Any]:
    """A copy of ``raw`` with every ``key=value`` of ``overrides`` set (no recipe, no validation)."""
    raw = copy.deepcopy(raw)
    for item in overrides or []:
        set_dotted(raw, *parse_override(item))
    return raw


def recipe_preset(name: str) -> dict[str, Any]:
    """The preset of recipe ``name`` (a copy); ConfigError names the recipes that exist."""
    if name not in RECIPES:
        raise ConfigError(f"recipe: unknown recipe {name!r}; accepted: {', '.join(sorted(RECIPES))}")
    return copy.deepcopy(RECIPES[name].preset)


# Errors about a value's range or kind: the message says what is accepted, and "(got X)" is added.
_RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number",
                 "int_parsing", "int_from_float", "float_parsing", "bool_parsing", "literal_error")


def _format_validation_error(err: ValidationError) -> str:
    """One line for one problem ("invalid config: trainer.steps: Input should be greater than 0 (got
    0)"), else one line per problem under "invalid config:"."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-"))
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            section = _section_for(loc.rsplit(".", 1)[0] if "." in loc else "")
            accepted = ", ".join(section.model_fields) if section else "?"
            msg = f"unknown key; accepted keys here: {accepted}"
        elif e["type"] in _RANGE_ERRORS:
            msg = f"{msg} (got {e.get('input')!r})"
        elif e["type"] == "value_error" and e.get("ctx", {}).get("error") is not None:
            msg = str(e["ctx"]["error"])  # our own message, which names its keys, without "Value error, "
        lines.append(f"{loc}: {msg}" if loc else msg)
    if len(lines) == 1:
        return f"invalid config: {lines[0]}"
    return "invalid config:\n" + "\n".join(f"  {line}" for line in lines)


def _section_for(loc: str) -> type[BaseModel] | None:
    model: type[BaseModel] = RunConfig
    if not loc:
        return model
    for part in loc.split("."):
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        nxt = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nxt is None:
            return None
        model = nxt
    return model


def build_config(raw: dict[str, Any] | None = None, overrides: list[str] | None = None,
                 **sections: dict[str, Any]) -> RunConfig:
    """Recipe preset <- YAML dict <- ``sections`` <- ``key=value`` overrides, then validated.

    ``sections``: whole or partial sections as Python dicts, e.g.
    ``reward={"verifiers": [{"name": "python", "options": {"function": my_reward}}]}``. A callable
    anywhere in the config is recorded as ``module:qualname`` (reinforge/config/callables.py)."""
    raw = deep_merge(raw or {}, sections) if sections else (raw or {})
    raw = apply_overrides(raw, overrides)
    merged = deep_merge(recipe_preset(raw.get("recipe", "grpo")), raw)
    return validate_config(merged)


def validate_config(raw: dict[str, Any]) -> RunConfig:
    """A whole config dict (no recipe preset merged under it) as a RunConfig; ConfigError lists
    every problem with the accepted keys or values. Callables become their names."""
    try:
        return RunConfig.model_validate(name_callables(raw))
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err)) from None


def load_config(path: str | Path | None, overrides: list[str] | None = None, *,
                ignore_sections: tuple[str, ...] = (), **sections: dict[str, Any]) -> RunConfig:
    """The RunConfig of a YAML file plus ``sections`` (Python dicts, callables allowed: see
    :func:`build_config`) plus `key=value` overrides. `ignore_sections` are top-level sections
    another command owns (`rm:` of a train-rm config, read by `reinforge eval`)."""
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            raw = yaml.safe_load(read_utf8(p, "config file", ConfigError)) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"config file {str(p)!r} is not valid YAML: {err}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"config file {str(p)!r} must hold a mapping of sections")
        raw = {k: v for k, v in raw.items() if k not in ignore_sections}
    return build_config(raw, overrides, **sections)
