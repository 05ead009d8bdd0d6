"""Where a new run directory will go, checked before anything loads.

``RunDir.create`` makes the directory only after the model has loaded (the run's config records
the resolved dtype), so a ``tracking.output_dir`` that is a file, or a ``tracking.run_name`` that
is taken, would otherwise end a run that has already spent its start-up. The same rules as
``create``'s, as a ``ConfigError`` that names the key and the fix; ``create`` still decides in the
end (a folder made in between is refused there).
"""

from __future__ import annotations

import os
from pathlib import Path

from reinforge.config import ConfigError

__all__ = ["check_new_run_location"]


def check_new_run_location(output_dir: str | Path, run_name: str | None, *, dir_key: str = "tracking.output_dir",
                           name_key: str = "tracking.run_name", resume: str = "reinforge train --resume") -> None:
    """Raise ConfigError unless a run named ``run_name`` (None: a fresh name is chosen) can be
    created under ``output_dir``: the folder (or its nearest existing parent) is a writable
    folder, and an explicit run name is free (absent, or an empty folder)."""
    out = Path(output_dir)
    existing = out
    while not existing.exists() and existing != existing.parent:  # the nearest part that exists
        existing = existing.parent
    if existing.exists() and not existing.is_dir():
        what = "is a file" if existing == out else f"is under {str(existing)!r}, which is a file"
        raise ConfigError(f"{dir_key}={str(out)!r} {what}, not a folder: set {dir_key} to a folder "
                          "(it is created when missing)")
    if existing.exists() and not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{dir_key}={str(out)!r}: {str(existing)!r} is not writable by this user: set "
                          f"{dir_key} to a folder you can write to")
    if run_name is None:
        return
    path = out / run_name
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        if path.is_dir():
            fix = f"choose another {name_key}, or continue that run with `{resume} {path}`"
        else:
            fix = f"choose another {name_key}"
        raise ConfigError(f"{name_key}={run_name!r}: {str(path)!r} already exists; {fix}")
