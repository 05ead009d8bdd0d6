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
from ..lifecycle.checkpoint import non_finite_stop
from ..lifecycle.stopping import StartupInterrupted
from ..tracking.checkpoints import list_checkpoints
from ..tracking.io import DiskFullError, is_disk_full

log = logging.getLogger("reinforge")


@dataclass
class RunResult:
    """``stopped_by``: the signal that stopped the run ("SIGINT", "SIGTERM", "SIGHUP"), None when
    it finished or stopped where it was told to (``stop_after_step``); the command line's exit
    status follows it (reinforge/cli/exits.py)."""

    run_dir: Path
    steps_done: int
    summary: dict[str, Any] = field(default_factory=dict)
    stopped_by: str | None = None


def interrupted(trainer, step: int) -> RunResult:
    rd = trainer.run_dir
    name = trainer._stop.signal_name
    ckpts = list_checkpoints(rd.path)
    since = f"the checkpoint of step {ckpts[-1][0]}" if ckpts else "step 0 (no checkpoint was written)"
    rd.set_status("interrupted", step=step, resume=f"reinforge train --resume {rd.path}",
                  **({"signal": name} if name else {}))
    try:  # after a SIGHUP the terminal may be gone; status.json has the same words
        print(f"reinforge: {'stopped by ' + name if name else 'interrupted'} at step {step}; a resume continues "
              f"from {since}. Resume with: reinforge train --resume {rd.path}", file=sys.stderr)
    except OSError:
        pass
    return RunResult(rd.path, step, stopped_by=name)

def startup_interrupted(trainer, stop: StartupInterrupted) -> None:
    """A stop before the first step: nothing was trained; a run directory that exists (a
    resume, or a new run created just before) is marked interrupted. Raises the stop on."""
    rd = trainer.run_dir
    if rd is not None and (rd.path / "config.yaml").is_file():
        rd.set_status("interrupted", step=trainer._plan.checkpoint_step if trainer._plan is not None else 0,
                      resume=f"reinforge train --resume {rd.path}", signal=stop.args[0] if stop.args else "SIGINT")
    raise stop

def non_finite_stopped(trainer, step: int) -> Exception:
    """The run marked failed after trainer.max_consecutive_nan non-finite losses; returns the
    error to raise, which says which checkpoint a resume starts from, or that none was written."""
    rd = trainer.run_dir
    err = non_finite_stop(rd.path, trainer.nan_streak, step, lr_key="learner.lr",
                          resume=f"reinforge train --resume {rd.path}")
    rd.set_status("failed", step=step, reason=str(err))
    return err


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
            and _not_yet_failed(rd)):
        try:
            rd.set_status("failed", reason=f"{type(err).__name__}: {err}")
        except OSError as status_err:  # e.g. the disk is still full
            log.error("could not mark %s failed: %s", rd.path, status_err)
    return err


def _not_yet_failed(rd) -> bool:
    """Whether status.json should now say "failed": not when it does already, nor when it is itself
    damaged (it is left as found; the error names it and the fix)."""
    try:
        return rd.status().get("state") != "failed"
    except ValueError:
        return False
