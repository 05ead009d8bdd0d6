"""Tracking: the run directory (everything a run produced and needs to be reproduced) and
crash-safe file writes."""

from reinforge.tracking.io import (
    append_jsonl,
    append_jsonl_many,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_jsonl,
    rewrite_jsonl,
)
from reinforge.tracking.run_dir import RUN_STATES, NotARunDirectoryError, RunDir

__all__ = [
    "RunDir",
    "NotARunDirectoryError",
    "RUN_STATES",
    "append_jsonl",
    "append_jsonl_many",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "read_jsonl",
    "rewrite_jsonl",
]
