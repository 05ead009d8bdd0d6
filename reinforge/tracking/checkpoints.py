"""Which checkpoints a run directory holds, and whether they are intact: the one place that says.

The trainer writes ``checkpoints/step_NNNNNN/`` under a temporary name and renames it into place
with ``state.json`` written last (reinforge/lifecycle/checkpoint.py), so a folder with a
``state.json`` is complete. Everything that reads checkpoints (resume, ``reinforge eval
--checkpoint``, pruning of old ones) finds them here.

``state.json`` records the size and SHA-256 of every other file of the checkpoint
(``"files"``); :func:`verify_checkpoint` checks them, so a file damaged after it was written (a
truncated copy, a bad sector, an overwrite) is named before anything loads it, instead of
resuming on garbage weights. A ``step_NNNNNN`` folder without ``state.json`` can only come from
damage (the rename into place happens after ``state.json`` is written): it is not listed, and
:func:`damaged_checkpoints` reports it. Checkpoints written before checksums were recorded have
no ``"files"``; they are checked for their files' presence only. ``state.json`` also records the
digest of its own content (``"state_sha256"``, :func:`state_digest`): a state edited by hand is
damage too, found before anything loads rather than as a missing key after the model has loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CHECKPOINTS_DIR", "COMPLETE_MARKER", "CHECKPOINT_FILES", "checkpoint_name", "list_checkpoints",
           "find_checkpoint", "file_digest", "CheckpointCheck", "DamagedCheckpointError", "verify_checkpoint", "damaged_checkpoints"]

CHECKPOINTS_DIR = "checkpoints"
COMPLETE_MARKER = "state.json"
#: The files every checkpoint has besides state.json (a critic's state is inside optimizer.pt).
CHECKPOINT_FILES = ("weights.safetensors", "optimizer.pt", "rng.pt")
_NAME = re.compile(r"step_(\d+)")
_CHUNK = 1 << 20


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


class DamagedCheckpointError(RuntimeError):
    """A checkpoint (or the run's records) cannot be used: the message names the file and the fix."""


def file_digest(path: str | os.PathLike) -> dict[str, int | str]:
    """``{"bytes": size, "sha256": hex digest}`` of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": h.hexdigest()}


def state_digest(state: dict) -> str:
    """The SHA-256 of a checkpoint's ``state.json`` content without its own ``"state_sha256"``
    (keys sorted), recorded in it, so that a hand edit of the state (a removed key, a changed
    step) is found by :func:`verify_checkpoint` like damage to any other file."""
    body = {k: v for k, v in state.items() if k != "state_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass
class CheckpointCheck:
    """What :func:`verify_checkpoint` found: ``problem`` names the damaged file and how (None when
    intact); ``verified`` is False for a checkpoint made before checksums were recorded."""

    path: Path
    problem: str | None = None
    verified: bool = True

    @property
    def intact(self) -> bool:
        return self.problem is None


def verify_checkpoint(path: str | os.PathLike) -> CheckpointCheck:
    """Check a checkpoint folder against the sizes and SHA-256 digests in its ``state.json``.
    Reads every file once (about 1 GB/s); a checkpoint without recorded digests (made by an older
    reinforge) is checked for the presence of its files and marked ``verified=False``."""
    path = Path(path)
    marker = path / COMPLETE_MARKER
    try:
        state = json.loads(marker.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return CheckpointCheck(path, f"{COMPLETE_MARKER} is missing")
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return CheckpointCheck(path, f"{COMPLETE_MARKER} is not readable JSON ({err})")
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        return CheckpointCheck(path, f"{COMPLETE_MARKER} has no step number")
    m = _NAME.fullmatch(path.name)
    if m and int(m.group(1)) != state["step"]:  # a resume would continue from the wrong step
        return CheckpointCheck(path, f"{COMPLETE_MARKER} says step {state['step']}, not the folder's {int(m.group(1))}")
    if "state_sha256" in state and state["state_sha256"] != state_digest(state):
        return CheckpointCheck(path, f"{COMPLETE_MARKER} does not match its recorded SHA-256 (edited after it was "
                                     "written?)")
    files = state.get("files")
    if not isinstance(files, dict):
        for name in CHECKPOINT_FILES:
            if not (path / name).is_file():
                return CheckpointCheck(path, f"{name} is missing", verified=False)
        return CheckpointCheck(path, verified=False)
    for name, want in sorted(files.items()):
        f = path / name
        try:
            size = f.stat().st_size
        except FileNotFoundError:
            return CheckpointCheck(path, f"{name} is missing")
        if size != want.get("bytes"):
            return CheckpointCheck(path, f"{name} has {size} bytes, {want.get('bytes')} were written (truncated?)")
        if file_digest(f)["sha256"] != want.get("sha256"):
            return CheckpointCheck(path, f"{name} does not match its recorded SHA-256 (overwritten or corrupted)")
    return CheckpointCheck(path)


def damaged_checkpoints(run_path: str | os.PathLike) -> list[tuple[int, Path]]:
    """``step_NNNNNN`` folders without ``state.json``: never a checkpoint being written (those are
    ``.tmp-...``), so damage. Oldest first."""
    root = Path(run_path) / CHECKPOINTS_DIR
    try:
        entries = list(root.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []
    out = [(int(m.group(1)), p) for p in entries
           if (m := _NAME.fullmatch(p.name)) and p.is_dir() and not (p / COMPLETE_MARKER).is_file()]
    return sorted(out)
