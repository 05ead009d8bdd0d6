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

from reinforge.tracking.lock import LOCK_FILE, describe_holder
from reinforge.tracking.run_dir import CONFIG_FILE, RunDir, task_label
from reinforge.tracking.sampled_evals import read_sampled_eval, sampled_eval_labels
from reinforge.tracking.segments import read_segments

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


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def run_info(run: RunDir, metric: str = "accuracy") -> RunInfo:
    """One run's line: state, recipe, task, steps logged / configured, best and final held-out
    ``metric`` (greedy evaluations in evals.jsonl; for an eval directory the best pass@1 of its
    sampled evaluations)."""
    status = run.status()
    writer = run.writer()
    try:
        cfg = run.load_config()
    except (OSError, ValueError):
        cfg = {}
    task_name = task_label(cfg.get("task") or {}, cfg.get("env"))
    kind = status.get("kind", "train")
    try:
        metrics = run.read_metrics()
        evals = [e for e in run.read_evals() if _num(e.get(metric)) and "step" in e]
    except ValueError:  # a corrupt line: show the run, flag it
        metrics, evals = [], []
    steps_done = max((int(m["step"]) for m in metrics if "step" in m), default=0)
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
    try:
        segments = len(read_segments(run))
    except (OSError, ValueError):
        segments = 1
    locked = (run.path / LOCK_FILE).exists()
    return RunInfo(
        path=run.path,
        kind=kind,
        state=effective_state(status, writer if locked else False),
        recipe="-" if kind == "eval" else str(cfg.get("recipe", "?")),
        task=str(task_name or "?"),
        steps_done=steps_done,
        steps_total=(cfg.get("trainer") or {}).get("steps") if kind == "train" else None,
        best=best,
        best_step=best_step,
        final=final,
        sweep=(cfg.get("tracking") or {}).get("sweep"),
        started=status.get("started"),
        writer=writer,
        segments=segments,
    )


def format_runs_table(infos: list[RunInfo], root: Path, metric: str = "accuracy") -> str:
    """A plain-text table, one run per line, paths relative to ``root``. ``writer`` names the
    process holding a run's writer lock (pid@host); ``segments`` counts the configs a run trained
    under (more than one when a resume changed its config, see segments.json)."""
    headers = ["run", "status", "recipe", "task", "steps", f"best {metric}", f"final {metric}", "sweep",
               "segments", "writer"]
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
        state = i.state if i.kind == "train" else f"{i.state} ({i.kind})"
        writer = "-" if not i.writer else (f"{i.writer.get('pid')}@{i.writer.get('hostname')}"
                                           if i.writer.get("pid") is not None else describe_holder(i.writer))
        rows.append([name, state, i.recipe, i.task, steps, best, final, i.sweep or "-", str(i.segments), writer])
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows)] if rows else [len(h) for h in headers]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)
