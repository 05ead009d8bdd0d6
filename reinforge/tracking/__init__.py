"""Tracking: the run directory (everything a run produced and needs to be reproduced), its writer
lock and config history (segments), crash-safe file writes, the runs index, sweeps, reproduction
checks and optional exporters (wandb, MLflow, TensorBoard, trackio)."""

from reinforge.tracking.io import (
    DamagedRunError,
    append_jsonl,
    append_jsonl_many,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_jsonl,
    rewrite_jsonl,
)
from reinforge.tracking.lock import RunLockedError
from reinforge.tracking.run_dir import RUN_KINDS, RUN_STATES, NotARunDirectoryError, RunDir

__all__ = [
    "RunDir",
    "NotARunDirectoryError",
    "DamagedRunError",
    "RunLockedError",
    "RUN_STATES",
    "RUN_KINDS",
    "append_jsonl",
    "append_jsonl_many",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "read_jsonl",
    "rewrite_jsonl",
]
