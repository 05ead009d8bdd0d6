"""The records of a run's config history (tracking/segments.py reads and extends it): a segment,
a change between two configs, and the first segment a new run starts with. Kept apart from
segments.py because ``RunDir.create`` writes the first segment, and segments.py reads runs through
``RunDir``: this module imports neither."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reinforge.tracking.io import atomic_write_json

__all__ = ["SEGMENTS_FILE", "CHANGE_KINDS", "Change", "Segment", "config_changes", "flatten_dotted", "start_history"]

SEGMENTS_FILE = "segments.json"
CHANGE_KINDS = ("free", "segment")


@dataclass
class Change:
    key: str          # dotted config key, e.g. "learner.lr"
    before: Any
    after: Any
    kind: str = "segment"

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "before": self.before, "after": self.after, "kind": self.kind}

    def describe(self) -> str:
        return f"{self.key}: {_text(self.before)} -> {_text(self.after)}"


@dataclass
class Segment:
    from_step: int                     # the first step trained under this config
    config: dict[str, Any]
    changes: list[Change] = field(default_factory=list)   # from the previous segment's config
    resumed_from: int | None = None    # the checkpoint step the segment resumed from
    started: str | None = None
    argv: list[str] | None = None

    @property
    def changes_what_a_step_means(self) -> bool:
        return any(c.kind == "segment" for c in self.changes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"from_step": self.from_step}
        if self.resumed_from is not None:
            out.update(resumed_from=self.resumed_from, started=self.started, argv=self.argv)
        out["changes"] = [c.to_dict() for c in self.changes]
        out["config"] = self.config
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Segment":
        return cls(from_step=int(d["from_step"]), config=dict(d["config"]),
                   changes=[Change(c["key"], c.get("before"), c.get("after"), c.get("kind", "segment"))
                            for c in d.get("changes") or []],
                   resumed_from=d.get("resumed_from"), started=d.get("started"), argv=d.get("argv"))


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, sort_keys=True, default=str)


def flatten_dotted(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``: the inverse of ``config.set_dotted``, the one flattener
    of configs (run comparison, exporters' parameters, resume diffs). Lists and empty sections stay
    whole values."""
    out: dict[str, Any] = {}
    for k, v in tree.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flatten_dotted(v, key + "."))
        else:
            out[key] = v
    return out


_ABSENT = object()


def config_changes(before: dict[str, Any], after: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, before, after) for every leaf that differs, sorted by key; lists are compared
    whole. A key missing on one side shows as None there."""
    a, b = flatten_dotted(before), flatten_dotted(after)
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, _ABSENT), b.get(key, _ABSENT)
        if va != vb:
            out.append((key, None if va is _ABSENT else va, None if vb is _ABSENT else vb))
    return out


def start_history(run_path: Path, config: dict[str, Any]) -> None:
    """Record a new run's first segment (``RunDir.create`` calls it after writing config.yaml)."""
    atomic_write_json(Path(run_path) / SEGMENTS_FILE, {"segments": [Segment(from_step=1, config=config).to_dict()]})
