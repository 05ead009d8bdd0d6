"""Write docs/config-reference.md, the reference of every config key, from the config classes.

    python scripts/config_reference.py           # (re)write docs/config-reference.md
    python scripts/config_reference.py --check   # exit 1 when the committed file is out of date

Each key's type, default and constraints come from the pydantic field, and its text from the
field's ``description`` (or, for a field without one, a string literal right after it, the
attribute-docstring convention); a section's text is its class docstring. Nothing is written by
hand, so the reference cannot drift from the code: tests/test_config_reference.py regenerates it
and compares it with the committed file.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import sys
import textwrap
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined, to_jsonable_python

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "config-reference.md"
if str(ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(ROOT))

from reinforge.config import RunConfig  # noqa: E402


def rm_settings() -> type[BaseModel]:
    """The ``rm`` section of a ``reinforge train-rm`` config (wherever reward_models keeps it)."""
    for name in ("reinforge.reward_models.config", "reinforge.reward_models.train"):
        if importlib.util.find_spec(name) is not None:
            module = importlib.import_module(name)
            if hasattr(module, "RMSettings"):
                return module.RMSettings
    raise ImportError("RMSettings not found in reinforge.reward_models")


# ----------------------------------------------------------------------------- the walk


@dataclass
class Key:
    dotted: str
    type: str
    default: str
    description: str | None
    section: str | None = None  # dotted name of the section this key opens, if it is one


@dataclass
class Section:
    dotted: str  # "" for the top level
    model: type[BaseModel]
    keys: list[Key] = field(default_factory=list)


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds directly or as list items."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _is_list_of_models(annotation: Any) -> bool:
    for arg in [annotation, *typing.get_args(annotation)]:
        if typing.get_origin(arg) is list and _models_in(arg):
            return True
    return False


def walk(model: type[BaseModel], dotted: str = "") -> Iterator[Section]:
    """Every section under ``model`` (itself first), depth first in declaration order. The items
    of a list of sections are one section named ``key[]``."""
    section = Section(dotted, model)
    children: list[tuple[str, type[BaseModel]]] = []
    for name, info in model.model_fields.items():
        key_dotted = f"{dotted}.{name}" if dotted else name
        nested = _models_in(info.annotation)
        opens = None
        if nested:
            opens = key_dotted + ("[]" if _is_list_of_models(info.annotation) else "")
            children.append((opens, nested[0]))
        section.keys.append(Key(key_dotted, type_text(info), default_text(info),
                                description_of(model, name, info), opens))
    yield section
    for child_dotted, child in children:
        yield from walk(child, child_dotted)


def all_keys(model: type[BaseModel] = RunConfig, dotted: str = "") -> list[str]:
    return [k.dotted for s in walk(model, dotted) for k in s.keys]


# ----------------------------------------------------------------------------- field text


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if annotation is Any:
        return "Any"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(_scalar(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(_type_name(a) for a in args)}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation)


_BOUNDS = ((annotated_types.Gt, "gt", ">"), (annotated_types.Ge, "ge", ">="),
           (annotated_types.Lt, "lt", "<"), (annotated_types.Le, "le", "<="))


def type_text(info: FieldInfo) -> str:
    text = _type_name(info.annotation)
    bounds = [f"{op} {_scalar(getattr(m, attr))}" for m in info.metadata
              for kind, attr, op in _BOUNDS if isinstance(m, kind)]
    return ", ".join([text, *bounds])


def _scalar(value: Any) -> str:
    """A value as it is written in a YAML config."""
    text = yaml.safe_dump(to_jsonable_python(value), default_flow_style=True, sort_keys=False, width=10**9)
    return text.removesuffix("\n...\n").strip()


def default_text(info: FieldInfo) -> str:
    """The default as YAML; "" for a required key or a section whose keys keep their defaults."""
    if info.is_required():
        return ""
    value = info.default_factory() if info.default_factory is not None else info.default
    if value is PydanticUndefined or (isinstance(value, BaseModel) and not value.model_fields_set):
        return ""
    return _scalar(value)


def _attribute_docstrings(model: type[BaseModel]) -> dict[str, str]:
    """``name: type = ...`` followed by a string literal: that string, per field name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(model)))
    except (OSError, TypeError, SyntaxError):
        return {}
    out: dict[str, str] = {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    for stmt, nxt in zip(body, body[1:]):
        if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            out[stmt.target.id] = nxt.value.value
    return out


def description_of(model: type[BaseModel], name: str, info: FieldInfo) -> str | None:
    text = info.description or _attribute_docstrings(model).get(name)
    return " ".join(text.split()) if text else None


def class_text(model: type[BaseModel]) -> str | None:
    doc = model.__doc__
    if not doc or doc == BaseModel.__doc__ or doc is getattr(model.__base__, "__doc__", None):
        return None
    return re.sub(r"``([^`]+)``", r"`\1`", " ".join(inspect.cleandoc(doc).split()))  # rST code -> markdown


# ----------------------------------------------------------------------------- markdown


def md(text: str) -> str:
    """Text for a table cell or paragraph: markdown's special characters escaped outside code
    spans (``*``, ``~``, backslashes, ``<`` that would open an HTML tag); ``|`` escaped everywhere
    (a table would split on it)."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(part.replace("|", "\\|"))
        else:
            part = part.replace("\\", "\\\\").replace("*", "\\*").replace("|", "\\|").replace("~", "\\~")
            out.append(re.sub(r"<(?=[A-Za-z/!?])", "&lt;", part))  # what would read as an HTML tag
    return "".join(out)


def code(text: str) -> str:
    return "`" + text.replace("|", "\\|") + "`"


def section_markdown(section: Section, level: int = 3) -> list[str]:
    title = code(section.dotted) if section.dotted else "Top level"
    lines = [f"{'#' * level} {title} ({section.model.__name__})", ""]
    doc = class_text(section.model)
    if doc:
        lines += [md(doc), ""]
    lines += ["| key | type | default | description |", "|---|---|---|---|"]
    for key in section.keys:
        if key.section:
            desc = (md(key.description) + " " if key.description else "") + f"Its keys: {code(key.section)} below."
        else:
            desc = md(key.description) if key.description else "(no description)"
        default = code(key.default) if key.default else ("its keys' defaults" if key.section else "required")
        lines.append(f"| {code(key.dotted)} | {code(key.type)} | {default} | {desc} |")
    return lines + [""]


def render() -> str:
    run_sections = list(walk(RunConfig))
    rm_sections = list(walk(rm_settings(), "rm"))
    keys = [k for s in run_sections + rm_sections for k in s.keys]
    lines = [
        "# Config reference",
        "",
        "<!-- Generated by scripts/config_reference.py from the config classes; do not edit by hand. "
        "tests/test_config_reference.py fails when this file is out of date. -->",
        "",
        "Every key of a run config, with its type, default and what it does (the `description` of its "
        "field in `reinforge/config/`). Set a key in a YAML section (`trainer:` then `steps: 20`) or on "
        "the command line (`trainer.steps=20`); the recipe's preset comes first, then the YAML file, then "
        "the command line (README.md, \"Using it\"). A key's default here is the class's; a recipe "
        "(`reinforge recipes show NAME`) may set another. Values are YAML: `null`, `true`, `[a, b]`, "
        "`{k: v}`. Items of a list of sections are written `key[].item`.",
        "",
        f"{len(keys)} keys: {sum(len(s.keys) for s in run_sections)} of `reinforge train` / `sft` / `eval` "
        f"(`RunConfig`), {sum(len(s.keys) for s in rm_sections)} of the `rm` section of `reinforge train-rm`.",
        "",
        "## `reinforge train`, `reinforge sft`, `reinforge eval` (RunConfig)",
        "",
        "`reinforge sft` reads the same config; its settings are the `sft` section (a `sft:` section in a "
        "train config runs it before RL).",
        "",
    ]
    for section in run_sections:
        lines += section_markdown(section)
    lines += [
        "## `reinforge train-rm` (the `rm` section)",
        "",
        "A train-rm config is a run config as above (model = the sampling policy, task, reward = the "
        "labelling verifiers, rollout, tracking, trainer.seed) plus this section.",
        "",
    ]
    for section in rm_sections:
        lines += section_markdown(section)
    return "\n".join(lines).rstrip("\n") + "\n"


def missing_descriptions() -> list[str]:
    """Keys that are not sections and have no description."""
    return [k.dotted for s in [*walk(RunConfig), *walk(rm_settings(), "rm")] for k in s.keys
            if not k.description and not k.section]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in argv:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python scripts/config_reference.py")
            return 1
        return 0
    OUT.write_text(text)
    missing = missing_descriptions()
    print(f"wrote {OUT.relative_to(ROOT)}; {len(missing)} keys without a description"
          + (f": {', '.join(missing)}" if missing else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
