"""How a run ended, as the trainer reports it: the result of a finished or interrupted run, the
status and the one line a stop prints, and a failure recorded with its reason (status.json is
never left at "running")."""

from __future__ import annotations

import errno
import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..lifecycle.stopping import StartupInterrupted
from ..tracking.checkpoints import list_checkpoints
from ..tracking.io import DiskFullError, is_disk_full

log = logging.getLogger("reinforge")


@dataclass
class RunResult:
    run_dir: Path
    steps_done: int
    summary: dict[str, Any] = field(default_factory=dict)


def interrupted(trainer, step: int) -> RunResult:
    rd = trainer.run_dir
    ckpts = list_checkpoints(rd.path)
    since = f"the checkpoint of step {ckpts[-1][0]}" if ckpts else "step 0 (no checkpoint was written)"
    rd.set_status("interrupted", step=step, resume=f"reinforge train --resume {rd.path}")
    print(f"reinforge: interrupted at step {step}; a resume continues from {since}. Resume with: "
          f"reinforge train --resume {rd.path}", file=sys.stderr)
    return RunResult(rd.path, step)

def startup_interrupted(trainer, stop: StartupInterrupted) -> None:
    """A stop before the first step: nothing was trained; a run directory that exists (a
    resume, or a new run created just before) is marked interrupted. Raises the stop on."""
    rd = trainer.run_dir
    if rd is not None and (rd.path / "config.yaml").is_file():
        rd.set_status("interrupted", step=trainer._plan.checkpoint_step if trainer._plan is not None else 0,
                      resume=f"reinforge train --resume {rd.path}")
    raise stop

def failed(trainer, err: Exception) -> Exception:
    """Mark the run failed with the reason (never left at "running"); returns the exception to
    raise: a full disk becomes a DiskFullError saying what filled up and what is intact."""
    rd = trainer.run_dir
    if is_disk_full(err) and not isinstance(err, DiskFullError):
        ckpts = list_checkpoints(rd.path) if rd is not None else []
        where = getattr(err, "filename", None) or "the run directory"
        kept = f"the latest checkpoint {ckpts[-1][1].name} is intact" if ckpts else "no checkpoint was written yet"
        err = DiskFullError(errno.ENOSPC, f"no space left on device writing {where}; {kept}: free space, then "
                                f"`reinforge train --resume {rd.path if rd else '...'}`")
    # A refused command (a config change the resume policy rejects) leaves the run as it was.
    refused = isinstance(err, ConfigError)
    if (not refused and rd is not None and (rd.path / "config.yaml").is_file()
            and rd.status().get("state") != "failed"):
        try:
            rd.set_status("failed", reason=f"{type(err).__name__}: {err}")
        except OSError as status_err:  # e.g. the disk is still full
            log.error("could not mark %s failed: %s", rd.path, status_err)
    return err
