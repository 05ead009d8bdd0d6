"""A run's config history: its segments.

A run trains under one config until a resume changes it; each stretch of steps under one config
is a *segment*. ``config.yaml`` is always the config now in force (what the next resume starts
from); ``segments.json`` records every segment: the step it took effect, the checkpoint it resumed
from, the whole config, and the change from the segment before, each key's change with its kind::

    {"segments": [
      {"from_step": 1, "config": {...}, "changes": []},
      {"from_step": 11, "resumed_from": 10, "started": "...", "argv": [...], "config": {...},
       "changes": [{"key": "learner.lr", "before": 1e-05, "after": 0.001, "kind": "segment"}]}
    ]}

``kind`` is ``"free"`` for a change that does not alter what a step computes (more steps, eval or
checkpoint cadence, exporters, progress) and ``"segment"`` for one that does (accepted only with
``--new-segment``). Which key is which is the trainer's resume policy
(reinforge/lifecycle/resume.py); this module only keeps the record. A training run is created with
its first segment recorded, so a later hand edit of ``config.yaml`` shows as a change on the next
resume; a run made before segments existed has no ``segments.json``, and its one segment is
``config.yaml``.

History is what survived: a resume from the checkpoint of step S drops the segments that began
after S (their steps were dropped from the logs too), so the record never names a config under
which no surviving step ran. ``segments.json`` is written (atomically) before ``config.yaml``; a
crash between the two leaves a segment that began after the latest checkpoint, which the next
resume drops.
"""

from __future__ import annotations

import datetime as _dt
import sys
from collections.abc import Callable
from typing import Any

import yaml

from reinforge.tracking.history import (
    SEGMENTS_FILE,
    Change,
    Segment,
    _text,
    config_changes,
)
from reinforge.tracking.io import (
    DamagedRunError,
    atomic_write_json,
    atomic_write_text,
    read_json,
)
from reinforge.tracking.run_dir import CONFIG_FILE, RunDir

__all__ = [
    "SEGMENTS_FILE",
    "Change",
    "Segment",
    "config_changes",
    "format_changes",
    "read_segments",
    "record_resume",
    "segment_label",
]

SEGMENTS_FIX = ("restore it from a copy, or delete it (the run then continues under config.yaml, and the config "
               "changes earlier resumes recorded are forgotten)")


def read_segments(run: RunDir) -> list[Segment]:
    """The run's segments, oldest first (one, from config.yaml, when it has no segments.json). A
    damaged file raises DamagedRunError naming it and the fix."""
    path = run.path / SEGMENTS_FILE
    raw = read_json(path, kind=dict, default=None, fix=SEGMENTS_FIX)
    if raw is None:
        return [Segment(from_step=1, config=run.load_config())]
    listed = raw.get("segments")
    if not isinstance(listed, list) or not listed:
        raise DamagedRunError(path, "lists no segment", SEGMENTS_FIX)
    segments = []
    for i, d in enumerate(listed, start=1):
        try:
            segments.append(Segment.from_dict(d))
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            raise DamagedRunError(path, f"segment {i} is malformed ({type(err).__name__}: {err})",
                                  SEGMENTS_FIX) from None
    return segments


def _write(run: RunDir, segments: list[Segment]) -> None:
    # segments.json first: a crash before config.yaml leaves a segment after the latest
    # checkpoint, which the next resume drops (see the module docstring).
    atomic_write_json(run.path / SEGMENTS_FILE, {"segments": [s.to_dict() for s in segments]})
    atomic_write_text(run.path / CONFIG_FILE, yaml.safe_dump(segments[-1].config, sort_keys=False))


def record_resume(
    run: RunDir,
    resumed_from: int,
    config: dict[str, Any],
    classify: Callable[[str], str],
    *,
    argv: list[str] | None = None,
) -> list[Segment]:
    """Record that the run continues from the checkpoint of step ``resumed_from`` under
    ``config`` (a whole config dict); returns the history. Segments that began after that step
    are dropped; a new segment starting at ``resumed_from + 1`` is appended when ``config``
    differs from the config then in force, its changes classified by ``classify(key)``. The
    files are left untouched when nothing changes."""
    old = read_segments(run)
    kept = [s for s in old if s.from_step <= resumed_from]
    if resumed_from <= 0 or not kept:  # nothing trained survives: the new config is the first
        history = [Segment(from_step=1, config=config)]
    else:
        history = list(kept)
        diff = config_changes(kept[-1].config, config)
        if diff:
            history.append(Segment(
                from_step=resumed_from + 1, config=config,
                changes=[Change(k, a, b, classify(k)) for k, a, b in diff],
                resumed_from=resumed_from,
                started=_dt.datetime.now().astimezone().isoformat(timespec="seconds"),
                argv=list(argv if argv is not None else sys.argv),
            ))
    unchanged = ([s.to_dict() for s in history] == [s.to_dict() for s in old]
                 and run.load_config() == history[-1].config)
    if not unchanged:
        _write(run, history)
    return history


def segment_label(run: RunDir) -> str | None:
    """The changes that altered what a step computes, with the step each took effect, e.g.
    ``learner.lr=0.001@11``; None for a run trained under one such config. ``reinforge compare``
    groups runs by it, so a run whose learning rate changed half-way is not averaged with runs
    that kept theirs."""
    parts = []
    for seg in read_segments(run)[1:]:
        parts += [f"{c.key}={_text(c.after)}@{seg.from_step}" for c in seg.changes if c.kind == "segment"]
    return "; ".join(parts) or None


def format_changes(changes: list[Change]) -> str:
    """One line per change: ``  learner.lr: 1e-05 -> 0.001``."""
    return "\n".join(f"  {c.describe()}" for c in changes)
