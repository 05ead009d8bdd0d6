"""Is a run directory whole? The checks a resume makes before anything loads, and the gaps a report
must own up to.

A resume reads every file of the run that the continued run depends on, first, so a damaged one
is one line naming the file, what is wrong and the fix, before minutes go into loading a model
(``lifecycle/resume.py`` calls :func:`check_run_files` and, once the checkpoint is chosen,
:func:`check_records`). What cannot be read back is refused; what is only missing from the record
while the training state is intact is a warning, and the gap stays visible (:func:`missing_steps`
in the summary and in ``reinforge runs``):

- ``status.json``, ``config.yaml``, ``segments.json``, ``evals/step_N.json`` up to the checkpoint,
  and a line of ``metrics.jsonl``/``evals.jsonl``/``samples.jsonl`` that is not a JSON object:
  refused (the resume would fail later on them, or report from garbage).
- ``metrics.jsonl`` without the records of some steps up to the checkpoint (truncated mid-file, or
  deleted): a warning. The checkpoint holds everything training needs, so the run goes on exactly;
  the lost lines can come back only from a copy, and a refusal would leave no way on but to train
  again from step 0. The summary and ``reinforge runs`` name the steps without metrics.
- ``evals.jsonl`` and ``evals/`` disagreeing up to the checkpoint: a warning, for the same reason.
- no checkpoint left although one was certainly written (a later step was logged after a
  checkpoint step, or the run finished): refused, since a resume would start over from step 0 and
  drop every record.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TextIO

from reinforge.tracking.checkpoints import CHECKPOINTS_DIR, DamagedCheckpointError
from reinforge.tracking.io import DamagedRunError, json_kind
from reinforge.tracking.run_dir import EVALS_FILE, METRICS_FILE, SAMPLES_FILE, RunDir
from reinforge.tracking.segments import read_segments

__all__ = ["check_records", "check_run_files", "first_non_object", "logged_steps", "missing_steps", "step_ranges"]

_LOG_FIX = "delete or repair that line, then resume"


def step_ranges(steps: Iterable[int]) -> str:
    """``[1, 2, 3, 5]`` as ``1-3, 5``."""
    out: list[str] = []
    for s in sorted(set(steps)):
        if out and out[-1].split("-")[-1] == str(s - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{s}"
        else:
            out.append(str(s))
    return ", ".join(out)


def logged_steps(records: Iterable[Any]) -> set[int]:
    return {int(r["step"]) for r in records
            if isinstance(r, dict) and isinstance(r.get("step"), (int, float)) and not isinstance(r["step"], bool)}


def missing_steps(records: Iterable[Any], upto: int) -> list[int]:
    """Steps 1..``upto`` with no record in ``records`` (metrics.jsonl's): every trained step logs one."""
    have = logged_steps(records)
    return [s for s in range(1, int(upto) + 1) if s not in have]


def first_non_object(path: Path) -> tuple[int, str] | None:
    """(line number, what it holds) of the first line of a JSON-lines file that parses but is not a
    JSON object (the readers index every record by key); None when there is none. Lines that are not
    JSON are read_jsonl's to report."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise DamagedRunError(path, "is a directory, not the JSON-lines log reinforge writes there",
                              "move it out of the run directory, then resume") from None
    for lineno, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw.decode("utf-8"))
        except ValueError:
            continue
        if not isinstance(value, dict):
            return lineno, json_kind(value)
    return None


def check_run_files(run: RunDir) -> None:
    """Read the files a resume depends on before the checkpoint is chosen: status.json, config.yaml,
    segments.json, and that every line of the JSON-lines logs is an object. Raises DamagedRunError
    (one line: the file, what is wrong, the fix). Lines that are not JSON at all are
    ``lifecycle.resume.check_logs``'s."""
    run.status()
    run.load_config()
    read_segments(run)
    for name in (METRICS_FILE, EVALS_FILE, SAMPLES_FILE):
        bad = first_non_object(run.path / name)
        if bad is not None:
            raise DamagedRunError(run.path / name, f"line {bad[0]} is {bad[1]}, not a JSON object", _LOG_FIX)


def check_records(run: RunDir, step: int, *, out: TextIO) -> list[str]:
    """Check the records a resume from the checkpoint of ``step`` keeps (0: no checkpoint). Raises
    DamagedRunError for an unreadable evaluation detail file, DamagedCheckpointError when the
    checkpoints were lost; returns the warnings it printed on ``out`` (gaps in the logs)."""
    for s in run.eval_steps():
        if s <= step:
            run.read_eval_details(s)  # DamagedRunError names the file and the fix
    metrics = run.read_metrics()
    if step == 0:
        _refuse_if_checkpoints_lost(run, metrics)
        return []
    warnings = []
    gap = missing_steps(metrics, step)
    if gap:
        warnings.append(
            f"warning: {run.path / METRICS_FILE} has no record of step(s) {step_ranges(gap)} (the file was "
            f"truncated or deleted); the checkpoint of step {step} is intact, so training continues exactly, but "
            "those steps stay without metrics, and the summary and `reinforge runs` say so; to keep them, stop "
            "now (Ctrl-C) and restore the file from a copy")
    details = {s for s in run.eval_steps() if s <= step}
    lines = {s for s in logged_steps(run.read_evals()) if s <= step}
    if details - lines:
        warnings.append(
            f"warning: {run.path / EVALS_FILE} has no record of the evaluation(s) of step(s) "
            f"{step_ranges(details - lines)} (their details are in evals/); `reinforge runs` and the summary's "
            "guardrails leave them out; restore the file from a copy to keep them")
    if lines - details:
        warnings.append(
            f"warning: {run.path / 'evals'} has no details of the evaluation(s) of step(s) "
            f"{step_ranges(lines - details)} that evals.jsonl lists; the summary pairs the evaluations that "
            "have details; restore them from a copy to keep them")
    for w in warnings:
        print(w, file=out)
    return warnings


def _refuse_if_checkpoints_lost(run: RunDir, metrics: list[Any]) -> None:
    """A resume with no checkpoint starts over from step 0 and drops every record after it: right
    for a run stopped before its first checkpoint, data loss for one whose checkpoints are gone."""
    written = _a_checkpoint_was_written(run, metrics)
    if written is None:
        return
    raise DamagedCheckpointError(
        f"cannot resume {run.path}: the checkpoint of step {written} was written, but {run.path / CHECKPOINTS_DIR} "
        "holds no checkpoint now (deleted or moved?), and a resume would start over from step 0, dropping every "
        f"record: restore {CHECKPOINTS_DIR}/ from a copy, or start a new run from the same config: "
        f"`reinforge train {run.path / 'config.yaml'} tracking.run_name=NEW_NAME`")


def _a_checkpoint_was_written(run: RunDir, metrics: list[Any]) -> int | None:
    """A step whose checkpoint was certainly completed, or None: the last step of a finished run, or
    a step due for a checkpoint under its segment's cadence after which another step was logged
    (a step is logged before its checkpoint, and a failed checkpoint ends the run)."""
    status = run.status()
    if status.get("state") == "finished" and isinstance(status.get("step"), int) and status["step"] > 0:
        return status["step"]
    last = max(logged_steps(metrics), default=0)
    section = "sft" if status.get("stage") == "sft" else "trainer"  # `reinforge sft` runs: sft.checkpoint_every
    segments = read_segments(run)
    for i, seg in enumerate(segments):
        end = min(segments[i + 1].from_step - 1 if i + 1 < len(segments) else last, last - 1)
        every = (seg.config.get(section) or {}).get("checkpoint_every")
        if isinstance(every, int) and every > 0:
            due = [s for s in range(seg.from_step, end + 1) if s % every == 0]
            if due:
                return due[-1]
    return None
