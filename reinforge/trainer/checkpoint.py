"""Checkpoints: trainable weights, optimiser and scheduler, RNG states and data position.

A checkpoint is a folder written under a temporary name and renamed into place, so a crash or
Ctrl-C mid-write leaves the previous checkpoint as the latest complete one. Which checkpoints a
run holds is answered in one place, :mod:`reinforge.tracking.checkpoints`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from ..tracking.checkpoints import CHECKPOINTS_DIR, COMPLETE_MARKER, checkpoint_name, list_checkpoints


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
    keep: int = 1,
) -> Path:
    root = checkpoint_root(run_path)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(step)
    tmp = root / f".tmp-{checkpoint_name(step)}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "weights.safetensors"))
    torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    # state.json last: its presence marks the folder complete (tracking.checkpoints lists it).
    (tmp / COMPLETE_MARKER).write_text(json.dumps({"step": step, **trainer_state}, indent=1))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for _, old in list_checkpoints(run_path)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(path: Path) -> dict[str, Any]:
    path = Path(path)
    state = json.loads((path / COMPLETE_MARKER).read_text())
    return {
        "state": state,
        "weights": load_file(str(path / "weights.safetensors")),
        "optimizer": torch.load(path / "optimizer.pt", weights_only=False),
        "rng": torch.load(path / "rng.pt", weights_only=False),
    }
