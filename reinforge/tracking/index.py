"""The runs index: find the run directories under a folder and summarise each in one line
(``reinforge runs``). Computed from the run directories alone, nothing is cached, so it is always
true to what is on disk."""

from __future__ import annotations

import math
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinforge.tracking.io import DamagedRunError
from reinforge.tracking.lock import LOCK_FILE, describe_holder
from reinforge.tracking.run_dir import CONFIG_FILE, RunDir, task_label
from reinforge.tracking.sampled_evals import read_sampled_eval, sampled_eval_labels
from reinforge.tracking.segments import read_segments
from reinforge.tracking.validate import logged_steps, missing_steps, step_ranges

__all__ = ["find_runs", "RunInfo", "run_info", "effective_state", "run_state", "format_runs_table", "pid_alive"]

# Never searched: trackers' stores and caches can hold thousands of folders. (Run directories are
# not searched inside at all.)
_SKIP_DIRS = {"wandb", "mlruns", "__pycache__", "node_modules"}


def find_runs(root: str | os.PathLike, *, max_depth: int = 4) -> list[RunDir]:
    """Run directories (folders with a config.yaml) at or below ``root``, sorted by path. A run
    directory is not searched further (its sub-folders are its own)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{str(root)!r} is not a directory")
    found: list[RunDir] = []

    def walk(d: Path, depth: int) -> None:
        if (d / CONFIG_FILE).is_file():
            found.append(RunDir(d))
            return
        if depth >= max_depth:
            return
        try:
            children = sorted(p for p in d.iterdir() if p.is_dir() and p.name not in _SKIP_DIRS
                              and not p.name.startswith("."))
        except OSError:
            return
        for child in children:
            walk(child, depth + 1)

    walk(root, 0)
    return sorted(found, key=lambda r: str(r.path))


def pid_alive(pid: Any) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, ValueError, TypeError):
        return False
    return True


def effective_state(status: dict[str, Any], writer: dict[str, Any] | None | bool = False) -> str:
    """The recorded state, except that a "running" run that no process writes is "stale": it
    was killed or crashed without writing its end state (resume it with ``reinforge train
    --resume``). ``writer`` is the run's lock holder (:meth:`RunDir.writer`: None when the lock is
    free); without it (runs made before the lock existed) a dead pid on this host means stale."""
    state = status.get("state", "unknown")
    if state != "running":
        return state
    if writer is not False:
        return "running" if writer else "stale"
    if status.get("hostname") == socket.gethostname() and "pid" in status and not pid_alive(status["pid"]):
        return "stale"
    return state


def run_state(run: RunDir) -> str:
    """:func:`effective_state` of a run, from its status and its writer lock."""
    locked = (run.path / LOCK_FILE).exists()
    return effective_state(run.status(), run.writer() if locked else False)


@dataclass
class RunInfo:
    path: Path
    kind: str
    state: str
    recipe: str
    task: str
    steps_done: int
    steps_total: int | None
    best: float | None
    best_step: int | None
    final: float | None
    sweep: str | None
    started: str | None
    writer: dict[str, Any] | None = None   # the process holding the writer lock
    segments: int = 1                      # configs the run trained under (resumes that changed it)
    problem: str | None = None             # a damaged or missing record: the file and what is wrong
    stopped_by: str | None = None          # the signal that interrupted the run (SIGTERM, SIGINT, SIGHUP)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def run_info(run: RunDir, metric: str = "accuracy") -> RunInfo:
    """One run's line: state, recipe, task, steps logged / configured, best and final held-out
    ``metric`` (greedy evaluations in evals.jsonl; for an eval directory the best pass@1 of its
    sampled evaluations). A damaged file never fails the listing: the line shows what could be read,
    and ``problem`` names the file and what is wrong (state "damaged" when status.json is)."""
    try:
        return _run_info(run, metric)
    except Exception as err:  # noqa: BLE001 - one run's unforeseen damage must not hide the others
        return RunInfo(path=run.path, kind="train", state="damaged", recipe="?", task="?", steps_done=0,
                       steps_total=None, best=None, best_step=None, final=None, sweep=None, started=None,
                       problem=_problem(run, err))


def _problem(run: RunDir, err: Exception) -> str:
    """What is wrong, in a few words, with the file named relative to the run."""
    if isinstance(err, DamagedRunError) and err.problem:
        try:
            name = str(err.path.relative_to(run.path))
        except ValueError:
            name = str(err.path)
        return f"{name}: {err.problem}"
    text = str(err).splitlines()[0] if str(err) else type(err).__name__
    return text.replace(f"{run.path}{os.sep}", "")


def _run_info(run: RunDir, metric: str) -> RunInfo:
    problems: list[str] = []

    def read(what, default):
        try:
            return what()
        except (OSError, ValueError) as err:
            problems.append(_problem(run, err))
            return default

    status = read(run.status, None)
    writer = run.writer()
    cfg = read(run.load_config, {})
    task_name = task_label(cfg.get("task") or {}, cfg.get("env"))
    kind = (status or {}).get("kind", "train")
    metrics = read(run.read_metrics, [])
    evals = [e for e in read(run.read_evals, []) if isinstance(e, dict) and _num(e.get(metric)) and "step" in e]
    steps_done = max(logged_steps(metrics), default=0)
    if status is not None and status.get("state") == "finished" and isinstance(status.get("step"), int):
        steps_done = max(steps_done, status["step"])  # a finished run trained every step to its last
    gap = missing_steps(metrics, steps_done) if kind == "train" else []
    if gap:
        problems.append(f"metrics.jsonl has no record of step(s) {step_ranges(gap)}")
    best = best_step = final = None
    if evals:
        trained = [e for e in evals if e["step"] > 0] or evals  # best of the trained checkpoints
        b = max(trained, key=lambda e: (e[metric], -e["step"]))
        best, best_step = float(b[metric]), int(b["step"])
        last = max(evals, key=lambda e: e["step"])
        final = float(last[metric])
    elif kind == "eval":
        for label in sampled_eval_labels(run):
            try:
                s, _ = read_sampled_eval(run, label)
            except (OSError, ValueError):
                continue
            if _num(s.get("accuracy")) and (best is None or s["accuracy"] > best):
                best = float(s["accuracy"])
    segments = len(read(lambda: read_segments(run), [None]))
    locked = (run.path / LOCK_FILE).exists()
    return RunInfo(
        path=run.path,
        kind=kind,
        state="damaged" if status is None else effective_state(status, writer if locked else False),
        recipe="-" if kind == "eval" else str(cfg.get("recipe", "?")),
        task=str(task_name or "?"),
        steps_done=steps_done,
        steps_total=(cfg.get("trainer") or {}).get("steps") if kind == "train" else None,
        best=best,
        best_step=best_step,
        final=final,
        sweep=(cfg.get("tracking") or {}).get("sweep"),
        started=(status or {}).get("started"),
        writer=writer,
        segments=segments,
        problem="; ".join(dict.fromkeys(problems)) or None,  # (config.yaml's fault can come twice)
        stopped_by=(status or {}).get("signal") if (status or {}).get("state") == "interrupted" else None,
    )


def format_runs_table(infos: list[RunInfo], root: Path, metric: str = "accuracy") -> str:
    """A plain-text table, one run per line, paths relative to ``root``. ``writer`` names the
    process holding a run's writer lock (pid@host); ``segments`` counts the configs a run trained
    under (more than one when a resume changed its config, see segments.json); ``problem``, shown
    when a run has one, names a damaged file or the steps metrics.jsonl lacks."""
    problems = any(i.problem for i in infos)  # the column shows only when a run has one
    headers = ["run", "status", "recipe", "task", "steps", f"best {metric}", f"final {metric}", "sweep",
               "segments", "writer"] + (["problem"] if problems else [])
    rows = []
    for i in infos:
        try:
            name = str(i.path.relative_to(root)) or i.path.name
        except ValueError:
            name = str(i.path)
        if name == ".":
            name = i.path.name
        steps = "-" if i.kind != "train" else f"{i.steps_done}/{i.steps_total if i.steps_total is not None else '?'}"
        best = "-" if i.best is None else (f"{i.best:.3f}" + (f" @{i.best_step}" if i.best_step is not None else " (pass@1)"))
        final = "-" if i.final is None else f"{i.final:.3f}"
        state = f"{i.state} by {i.stopped_by}" if i.stopped_by else i.state
        state = state if i.kind == "train" else f"{state} ({i.kind})"
        writer = "-" if not i.writer else (f"{i.writer.get('pid')}@{i.writer.get('hostname')}"
                                           if i.writer.get("pid") is not None else describe_holder(i.writer))
        rows.append([name, state, i.recipe, i.task, steps, best, final, i.sweep or "-", str(i.segments), writer]
                    + ([i.problem or "-"] if problems else []))
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)] if rows else [len(h) for h in headers]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)
