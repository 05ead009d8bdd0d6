"""Checkpoints: trainable weights, optimiser and scheduler, RNG states and data position.

A checkpoint is a folder written under a temporary name and renamed into place, so a crash or
Ctrl-C mid-write leaves the previous checkpoint as the latest complete one. Its ``state.json``,
written last, records the size and SHA-256 of every other file, which a resume verifies
(:func:`reinforge.tracking.checkpoints.verify_checkpoint`). A write that fails (a full disk, an
interrupt) removes the partial ``.tmp-step_*`` folder; a full disk is reported as a
:class:`~reinforge.tracking.io.DiskFullError` saying what filled up and which checkpoint is intact.
Which checkpoints a run holds is answered in one place, :mod:`reinforge.tracking.checkpoints`.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..tracking.checkpoints import (
    CHECKPOINTS_DIR,
    COMPLETE_MARKER,
    DamagedCheckpointError,
    checkpoint_name,
    file_digest,
    list_checkpoints,
    state_digest,
)
from ..tracking.io import DiskFullError, is_disk_full


def checkpoint_root(run_path: Path) -> Path:
    return Path(run_path) / CHECKPOINTS_DIR


def latest_checkpoint(run_path: Path) -> Path | None:
    ckpts = list_checkpoints(run_path)
    return ckpts[-1][1] if ckpts else None


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():  # sampling on a GPU draws from its own generators
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available() and len(state["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    run_path: Path,
    step: int,
    *,
    weights: dict[str, torch.Tensor],
    optimizer_state: dict[str, Any],
    trainer_state: dict[str, Any],
    keep: int = 2,
    rng: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write the checkpoint of ``step`` (``rng`` defaults to the RNG states now) and keep the
    ``keep`` newest. ``extra``: more state, each ``name`` as ``name.pt`` (an asynchronous run's
    rollouts sampled ahead). On a full disk the partial folder is removed and DiskFullError raised."""
    root = checkpoint_root(run_path)
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{checkpoint_name(step)}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "weights.safetensors"))
        _torch_save(optimizer_state, tmp / "optimizer.pt")
        _torch_save(rng if rng is not None else rng_state(), tmp / "rng.pt")
        for name, obj in (extra or {}).items():
            _torch_save(obj, tmp / f"{name}.pt")
        files = {f.name: file_digest(f) for f in sorted(tmp.iterdir())}
        # state.json last: its presence marks the folder complete (tracking.checkpoints lists it).
        state = {"step": step, **trainer_state, "files": files}
        state["state_sha256"] = state_digest(json.loads(json.dumps(state)))  # as a resume reads it back
        (tmp / COMPLETE_MARKER).write_text(json.dumps(state, indent=1))
        for f in tmp.iterdir():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, Exception) and is_disk_full(err):
            raise DiskFullError(errno.ENOSPC, _disk_full_message(run_path, root, final.name)) from err
        raise
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in list_checkpoints(run_path)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _disk_full_message(run_path: Path, root: Path, name: str) -> str:
    try:
        free = f"{shutil.disk_usage(root).free / 2**20:.1f} MiB free"
    except OSError:
        free = "free space unknown"
    intact = list_checkpoints(run_path)
    kept = (f"the previous checkpoint {intact[-1][1].name} is intact" if intact
            else "no earlier checkpoint exists")
    return (f"no space left on device writing checkpoint {name} in {root} ({free}); the partial folder was "
            f"removed and {kept}: free space, then `reinforge train --resume {run_path}`")


class _RecordingFile:
    """A binary file that keeps the OSError of a failed write: torch.save reports one as its own
    "unexpected pos" RuntimeError, losing the ENOSPC behind it."""

    def __init__(self, path: Path):
        self._f = open(path, "wb", buffering=0)
        self.error: OSError | None = None

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        try:
            while view:  # a short write (a full disk) is pushed on until it raises
                view = view[self._f.write(view):]
        except OSError as err:
            self.error = err
            raise
        return len(memoryview(data).cast("B"))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._f.close()


def _torch_save(obj: Any, path: Path) -> None:
    f = _RecordingFile(path)
    try:
        torch.save(obj, f)
    except Exception as err:
        if f.error is not None:
            raise f.error from err
        raise
    finally:
        f.close()


def remove_partial_checkpoints(run_path: Path) -> list[str]:
    """Remove the ``.tmp-step_*`` folders a killed process (SIGKILL, power loss) left mid-write;
    returns their names. Only the run's writer may call it."""
    root = checkpoint_root(run_path)
    gone = sorted(p.name for p in root.glob(".tmp-*") if p.is_dir()) if root.is_dir() else []
    for name in gone:
        shutil.rmtree(root / name, ignore_errors=True)
    return gone


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint's state, weights, optimiser and RNG states, and under ``extra`` the other
    ``*.pt`` files ``save_checkpoint`` wrote by name. A file that cannot be read raises
    DamagedCheckpointError naming it (call ``verify_checkpoint`` first to check digests)."""
    path = Path(path)

    def read(name: str, load):
        try:
            return load(path / name)
        except Exception as err:
            raise DamagedCheckpointError(
                f"{path / name} cannot be read ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
            ) from err

    return {
        "state": read(COMPLETE_MARKER, lambda p: json.loads(p.read_text())),
        "weights": read("weights.safetensors", lambda p: load_file(str(p))),
        "optimizer": read("optimizer.pt", lambda p: torch.load(p, weights_only=False)),
        "rng": read("rng.pt", lambda p: torch.load(p, weights_only=False)),
        "extra": {f.stem: read(f.name, lambda p: torch.load(p, weights_only=False))
                  for f in sorted(path.glob("*.pt")) if f.name not in ("optimizer.pt", "rng.pt")},
    }


class NonFiniteLossError(FloatingPointError):
    """``trainer.max_consecutive_nan`` updates in a row were skipped for a non-finite loss or
    gradient; the message says which checkpoint a resume would start from, or that none exists."""


def non_finite_stop(run_path: Path, streak: int, step: int, *, lr_key: str, resume: str,
                    checkpoint_key: str = "trainer.checkpoint_every") -> NonFiniteLossError:
    """The error that ends a run after ``streak`` non-finite losses up to ``step``: what is true of
    its checkpoints (a run with trainer.checkpoint_every=0 has none before its last step), and the
    fix. A plain resume would compute the same non-finite losses again, so it names a change."""
    first = step - streak + 1
    head = (f"{streak} consecutive non-finite losses (steps {first}-{step}; those updates were skipped, so the "
            f"weights are step {first - 1}'s)")
    ckpts = list_checkpoints(run_path)
    if ckpts:
        saved, path = ckpts[-1]
        return NonFiniteLossError(
            f"{head}; the latest checkpoint is {path.name} (step {saved}): lower {lr_key} (or learner.grad_clip), "
            f"then `{resume} --new-segment {lr_key}=<lower value>`")
    return NonFiniteLossError(
        f"{head}; no checkpoint was written ({checkpoint_key} is 0 or larger than {step}), so there is "
        f"nothing to resume from: start the run again with a lower {lr_key} (or learner.grad_clip), and "
        f"{checkpoint_key} set to have checkpoints to resume from")
