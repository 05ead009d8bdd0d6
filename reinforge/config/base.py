"""What every config section shares: the default model's name, the error a config that cannot
run raises, the base class of the sections (unknown keys rejected) and the renamed-key helper."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

DEFAULT_MODEL = "smollm2-135m-instruct"


class ConfigError(ValueError):
    """A config that cannot run; the message names the key and what is accepted."""


def _rename_key(data, old: str, new: str):
    """A section's raw dict with a renamed key moved to its new name, so that configs saved by
    earlier runs still load (and `reinforge reproduce` still works)."""
    if isinstance(data, dict) and old in data:
        data = dict(data)
        value = data.pop(old)
        data.setdefault(new, value)
    return data


class _Section(BaseModel):
    # No section has a use for inf or NaN (YAML's .inf/.nan): a learning rate of inf passes `gt=0`
    # and a NaN threshold compares false with everything, so both would reach the run.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
