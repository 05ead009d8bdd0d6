"""Which checkpoints a run directory holds: the one place that lists them.

The trainer writes ``checkpoints/step_NNNNNN/`` under a temporary name and renames it into place
with ``state.json`` written last (reinforge/trainer/checkpoint.py), so a folder with a
``state.json`` is complete. Everything that reads checkpoints (resume, ``reinforge eval
--checkpoint``, pruning of old ones) finds them here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = ["CHECKPOINTS_DIR", "COMPLETE_MARKER", "checkpoint_name", "list_checkpoints", "find_checkpoint"]

CHECKPOINTS_DIR = "checkpoints"
COMPLETE_MARKER = "state.json"
_NAME = re.compile(r"step_(\d+)")


def checkpoint_name(step: int) -> str:
    return f"step_{int(step):06d}"


def list_checkpoints(run_path: str | os.PathLike) -> list[tuple[int, Path]]:
    """Complete checkpoints of the run at ``run_path`` as (step, folder), oldest first.
    Folders being written (``.tmp-...``) and folders without ``state.json`` are left out."""
    root = Path(run_path) / CHECKPOINTS_DIR
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = []
    for p in entries:
        m = _NAME.fullmatch(p.name)
        if m and (p / COMPLETE_MARKER).is_file():
            out.append((int(m.group(1)), p))
    return sorted(out)


def find_checkpoint(run_path: str | os.PathLike, which: str | int) -> tuple[int, Path]:
    """The checkpoint named ``step_000010``, ``10`` or ``latest``; FileNotFoundError lists the
    complete checkpoints that exist."""
    ckpts = list_checkpoints(run_path)
    if str(which) == "latest":
        if not ckpts:
            raise FileNotFoundError(f"run {str(run_path)!r} has no complete checkpoint")
        return ckpts[-1]
    m = re.fullmatch(r"(?:step_)?(\d+)", str(which))
    step = int(m.group(1)) if m else None
    for s, p in ckpts:
        if s == step:
            return s, p
    have = ", ".join(p.name for _, p in ckpts) or "none"
    raise FileNotFoundError(
        f"run {str(run_path)!r} has no checkpoint {which!r}; complete checkpoints: {have} "
        "(trainer.keep_checkpoints sets how many are kept)"
    )
