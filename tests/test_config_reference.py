"""docs/config-reference.md is generated from the config classes (scripts/config_reference.py);
it must match them, so a new or changed key fails here until the reference is regenerated."""

import importlib.util
import sys
from pathlib import Path

from pydantic import BaseModel

from reinforge.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]


def _script():
    if "config_reference" not in sys.modules:
        spec = importlib.util.spec_from_file_location("config_reference", ROOT / "scripts" / "config_reference.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules["config_reference"]


def _keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key under ``model``, walked here independently of the script."""
    out = []
    for name, info in model.model_fields.items():
        dotted = f"{prefix}{name}"
        out.append(dotted)
        ann = info.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        for c in list(candidates):
            candidates += list(getattr(c, "__args__", ()))
        nested = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nested is not None:
            is_list = any(getattr(c, "__origin__", None) is list for c in candidates)
            out += _keys(nested, dotted + ("[]." if is_list else "."))
    return out


def test_committed_reference_is_up_to_date():
    text = _script().render()
    committed = (ROOT / "docs" / "config-reference.md").read_text()
    assert committed == text, "docs/config-reference.md is out of date: run python scripts/config_reference.py"


def test_every_run_config_key_is_documented():
    text = (ROOT / "docs" / "config-reference.md").read_text()
    keys = _keys(RunConfig)
    assert len(keys) > 150 and "algorithm.clip_eps_high" in keys and "reward.verifiers[].weight" in keys
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing, f"keys missing from docs/config-reference.md: {missing}"


def _undescribed(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        ann = info.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        for c in list(candidates):
            candidates += list(getattr(c, "__args__", ()))
        nested = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nested is not None:  # a section: its keys carry the descriptions
            out += _undescribed(nested, f"{prefix}{name}.")
        elif not (info.description or "").strip():
            out.append(f"{prefix}{name}")
    return out


def test_every_key_says_what_it_does():
    from reinforge.reward_models.config import RMSettings

    missing = _undescribed(RunConfig) + _undescribed(RMSettings, "rm.")
    assert not missing, f"config keys without a description (Field(description=...)): {missing}"
