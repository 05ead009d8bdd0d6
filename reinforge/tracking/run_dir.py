"""A run is a directory.

Layout (every file written atomically or appended line by line, see :mod:`reinforge.tracking.io`)::

    <output_dir>/<run name>/
        config.yaml          the config in force, whole (RunConfig.to_yaml())
        segments.json        the config history: each config and the step it took effect (tracking/segments.py)
        writer.lock          the writer's OS lock, and its pid and host (tracking/lock.py)
        environment.json     python, platform, cpus, torch threads, every package version, git commit
        git_diff.patch       uncommitted changes to tracked files, when the repo was dirty
        status.json          {"state": running|finished|failed|interrupted, "started", "pid", ...}
        metrics.jsonl        one line per step: {"step", "time", <metric>: value, ...}
        samples.jsonl        logged completions: {"step", <row fields>...}
        evals.jsonl          one line per held-out evaluation: {"step", "time", <summary>...}
        evals/step_000010.json   per-prompt details of that evaluation
        trajectories/step_000010.jsonl   agents: every trajectory of that step (agents/scoring.py)
        checkpoints/         written by the trainer, listed by tracking/checkpoints.py
        final_model/         the trained model (save_pretrained), written by the trainer
        sft/                 the SFT stage before RL, itself a run directory (reinforge/sft/stage.py)
        learning_curves.png  tracking/curves.py
        summary.json, summary.md  :meth:`RunDir.write_summary`
        exporters.json       ids of the wandb / MLflow / trackio runs this run also logs to
        tensorboard/         TensorBoard event files (when tracking.exporters has tensorboard)
        sampled_evals/, boundary/   `reinforge eval` (tracking/sampled_evals.py)

``status.json`` has ``"kind": "eval"`` for a directory made by ``reinforge eval`` on a bare model
(no training); other directories are training runs. Training runs made by ``reinforge sweep``
carry ``tracking.sweep`` in their config.

One process writes a run at a time: :meth:`RunDir.create` takes the writer lock, and a writer
that opens an existing run takes it with :meth:`RunDir.acquire_writer`. Readers never lock.

Every report and comparison is computed from these files alone, so a run directory can be copied
to another machine and compared later. A file that cannot be read as what was written there raises
DamagedRunError, one line naming the file, what is wrong and the fix (tracking/validate.py checks a
whole run before a resume loads anything).
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from reinforge.tracking import lock as _lock
from reinforge.tracking.checkpoints import (
    CHECKPOINTS_DIR,
    find_checkpoint,
    list_checkpoints,
)
from reinforge.tracking.environment import collect_environment
from reinforge.tracking.history import SEGMENTS_FILE, start_history
from reinforge.tracking.io import (
    DamagedRunError,
    append_jsonl,
    append_jsonl_many,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_json,
    read_jsonl,
    rewrite_jsonl,
)

if TYPE_CHECKING:
    from reinforge.config import RunConfig

log = logging.getLogger(__name__)

__all__ = ["RunDir", "NotARunDirectoryError", "RUN_STATES", "RUN_KINDS", "collect_environment", "task_label",
           "safe_name"]

CONFIG_FILE = "config.yaml"
ENVIRONMENT_FILE = "environment.json"
GIT_DIFF_FILE = "git_diff.patch"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
EVALS_FILE = "evals.jsonl"
EVAL_DETAILS_DIR = "evals"
FINAL_MODEL_DIR = "final_model"
RUN_KINDS = ("train", "eval", "train_rm")  # train_rm: `reinforge train-rm` (reward_models/train.py)
WARM_START_DIR = "sft"  # the SFT stage before RL (reinforge/sft/stage.py): a run directory inside the run
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"

RUN_STATES = ("running", "finished", "failed", "interrupted")
TRAJECTORIES_DIR = "trajectories"  # agents: every trajectory of a step (agents/scoring.py writes them)
EVAL_DETAILS_FIX = ("restore it from a copy, or delete it (the summary then pairs the evaluations that are left; "
                    "evals.jsonl keeps its accuracy)")
_MAX_GIT_DIFF_BYTES = 5 * 1024 * 1024


class NotARunDirectoryError(FileNotFoundError):
    """The path is not a reinforge run directory (no config.yaml)."""


def _now_iso() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def safe_name(text: str) -> str:
    """``text`` made safe as a file name (runs of other characters become ``_``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "run"


def task_label(task: dict[str, Any], env: dict[str, Any] | None = None) -> str:
    """A task's short name: the reasoning-gym dataset name, the data file's stem, or for
    ``task.source: env`` the environment's name (a verifiers environment's taskset id)."""
    if task.get("source") == "env" and env:
        if env.get("name") == "verifiers" and (env.get("options") or {}).get("taskset"):
            return f"verifiers-{env['options']['taskset']}"
        return str(env.get("name", "env"))
    if task.get("source", "reasoning_gym") == "file" and task.get("path"):
        return Path(str(task["path"])).stem
    return str(task.get("name", "task"))


def _eval_detail_name(step: int) -> str:
    return f"step_{int(step):06d}.json"


_DETAIL_RE = re.compile(r"^step_(-?\d+)\.json$")


# ----------------------------------------------------------------------------- the run directory


class RunDir:
    """One run's directory: config, environment, status, metrics, samples, evals, plots."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        # Exporters (wandb, MLflow, ...) start on the first log call, so opening a run to read
        # it never contacts a tracking backend; a terminal set_status() finishes them.
        self._exporters = None
        self._purge_step: int | None = None
        self._writer_holds = 0  # acquisitions of the writer lock made through this object

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def checkpoints_dir(self) -> Path:
        return self.path / CHECKPOINTS_DIR

    # -- creation / opening

    @classmethod
    def create(cls, config: "RunConfig", *, name: str | None = None, kind: str = "train",
               precision: dict | None = None) -> "RunDir":
        """Create ``<config.tracking.output_dir>/<name>`` and write config, environment, status.

        The name is ``name``, else ``config.tracking.run_name``, else
        ``<YYYYmmdd-HHMMSS>-<recipe>-<task>`` (``<YYYYmmdd-HHMMSS>-eval-<model>-<task>`` for
        ``kind="eval"``, a directory of evaluations of a model that was not trained here). An
        existing directory is never reused: a default name gets a ``-2``, ``-3``... suffix; an
        explicit name that exists and is not empty raises FileExistsError (resume an existing
        run with :meth:`open`).

        The returned RunDir holds the writer lock, taken before any file is written, so no other
        process can resume a half-made run; :meth:`release_writer` (or the process's end) gives
        it back. ``precision``: how ``model.dtype`` was chosen (``reinforge.precision.DtypeChoice``),
        recorded in environment.json.
        """
        if kind not in RUN_KINDS:
            raise ValueError(f"unknown run kind {kind!r}; accepted: {', '.join(RUN_KINDS)}")
        output_dir = Path(config.tracking.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        explicit = name if name is not None else config.tracking.run_name
        if explicit is not None:
            if not explicit or explicit in (".", "..") or "/" in explicit or "\\" in explicit:
                raise ValueError(f"run name {explicit!r} must be a plain directory name")
            path = output_dir / explicit
            try:
                path.mkdir()
            except FileExistsError:
                if not path.is_dir() or any(path.iterdir()):
                    raise FileExistsError(
                        f"run directory {str(path)!r} already exists; choose another "
                        f"tracking.run_name, or resume it with `reinforge train --resume {path}`"
                    ) from None
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            what = config.recipe if kind == "train" else f"eval-{Path(config.model.path).name}"
            env = getattr(config, "env", None)
            label = task_label(config.task.model_dump(), env.model_dump() if env is not None else None)
            base = safe_name(f"{stamp}-{what}-{label}")
            suffix = 1
            while True:
                path = output_dir / (base if suffix == 1 else f"{base}-{suffix}")
                try:
                    path.mkdir()  # atomic: two processes never get the same directory
                    break
                except FileExistsError:
                    suffix += 1

        run = cls(path)
        run.acquire_writer()  # an explicit, empty directory may be raced for: one creator wins
        atomic_write_text(path / CONFIG_FILE, config.to_yaml())
        if kind == "train":
            start_history(run.path, config.to_dict())
        env, diff = collect_environment()
        env["seeds"] = {"trainer": config.trainer.seed, "task": config.task.seed}
        if precision is not None:
            env["precision"] = {k: v for k, v in precision.items() if k != "hardware"}
        if diff:
            data = diff.encode("utf-8")
            if len(data) > _MAX_GIT_DIFF_BYTES:
                env["git"]["diff_truncated"] = True
                data = data[:_MAX_GIT_DIFF_BYTES]
            atomic_write_bytes(path / GIT_DIFF_FILE, data)
            env["git"]["diff_file"] = GIT_DIFF_FILE
        atomic_write_json(path / ENVIRONMENT_FILE, env)
        atomic_write_json(
            path / STATUS_FILE,
            {"state": "running", "started": _now_iso(), "pid": os.getpid(),
             "hostname": socket.gethostname(), **({"kind": kind} if kind != "train" else {})},
        )
        return run

    @classmethod
    def open(cls, path: str | os.PathLike) -> "RunDir":
        """An existing run directory (to resume, evaluate, report or compare)."""
        path = Path(path)
        if not path.is_dir():
            raise NotARunDirectoryError(
                f"{str(path)!r} is not a reinforge run directory: it does not exist or is not a "
                "directory"
            )
        if not (path / CONFIG_FILE).is_file():
            raise NotARunDirectoryError(
                f"{str(path)!r} is not a reinforge run directory: it has no {CONFIG_FILE}"
            )
        return cls(path)

    # -- the writer lock (tracking/lock.py)

    def acquire_writer(self) -> None:
        """Take the run's writer lock (again, if this process holds it). RunLockedError names
        the pid and host of the process that holds it."""
        _lock.acquire(self.path)
        self._writer_holds += 1

    def release_writer(self) -> None:
        """Give back one acquisition made through this object (no-op when it made none)."""
        if self._writer_holds:
            self._writer_holds -= 1
            _lock.release(self.path)

    def writer(self) -> dict[str, Any] | None:
        """The process writing this run (pid, hostname, since, argv), or None when none is."""
        return _lock.lock_holder(self.path)

    def _require_writer(self) -> None:
        # The run's records change only under the writer lock: two writers are what duplicated
        # steps and renamed checkpoints away under each other before the lock existed.
        if not _lock.holds_lock(self.path):
            raise RuntimeError(
                f"this process does not hold the writer lock of {str(self.path)!r}: take it with "
                "RunDir.acquire_writer() before writing the run"
            )

    # -- config / status

    def load_config(self) -> dict[str, Any]:
        """The resolved config as saved, a raw dict. Garbage raises DamagedRunError naming the
        file, the line and the fix."""
        path = self.path / CONFIG_FILE
        fix = ("repair it, or restore it from a copy" + (
            f" (the last segment in {SEGMENTS_FILE} holds the config in force at the last resume)"
            if (self.path / SEGMENTS_FILE).is_file() else ""))
        try:
            raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise DamagedRunError(path, f"not UTF-8 text (byte {err.start})", fix) from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            what = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise DamagedRunError(path, f"not valid YAML ({what}{where})", fix) from None
        if not isinstance(raw, dict):
            raise DamagedRunError(path, "does not hold a mapping of config sections", fix)
        return raw

    def load_run_config(self) -> "RunConfig":
        """The saved config validated back into a RunConfig."""
        from reinforge.config import RunConfig

        return RunConfig.model_validate(self.load_config())

    def load_environment(self) -> dict[str, Any]:
        return read_json(self.path / ENVIRONMENT_FILE, kind=dict, fix=(
            "it records the run's machine and package versions only: restore it from a copy, or delete it "
            "(comparisons of environments then skip this run)"))

    def status(self) -> dict[str, Any]:
        """status.json ({} when there is none). Garbage raises DamagedRunError naming the fix."""
        return read_json(self.path / STATUS_FILE, kind=dict, default={}, fix=(
            "it only records how the run last ended: restore it from a copy, or delete it (a resume "
            "writes a new one)"))

    def set_status(self, state: str, **extra: Any) -> None:
        """Set the run state (running / finished / failed / interrupted) plus any extra fields
        (e.g. step=, error=); earlier fields such as ``started`` and ``pid`` are kept, but not those
        of an earlier ending (reason, signal, resume): each call says all there is to say of it."""
        if state not in RUN_STATES:
            raise ValueError(f"unknown run state {state!r}; accepted: {', '.join(RUN_STATES)}")
        self._require_writer()
        status = self.status()
        for stale in ("reason", "signal", "resume"):
            status.pop(stale, None)
        status.update(extra)
        status["state"] = state
        status["updated"] = _now_iso()
        if state == "running":
            status.pop("ended", None)
            status["pid"] = os.getpid()
        else:
            status["ended"] = status["updated"]
        atomic_write_json(self.path / STATUS_FILE, status)
        if state != "running" and self._exporters is not None:
            self._exporters.finish(state)
            self._exporters = None

    @property
    def kind(self) -> str:
        """"train" for a training run, "eval" for a directory of evaluations of a bare model."""
        return self.status().get("kind", "train")

    # -- exporters

    def _export(self, metrics: dict[str, Any], step: int) -> None:
        if self._exporters is None:
            from reinforge.tracking.exporters import ExporterSet, build_exporters

            try:
                config = self.load_config()
            except (OSError, ValueError) as err:  # unreadable config: log to the files only
                log.warning("%s: cannot read the tracking config (%s); no exporters", self.path, err)
                self._exporters = ExporterSet([])
            else:
                self._exporters = build_exporters(self.path, config, purge_step=self._purge_step)
        if self._exporters:
            self._exporters.log(metrics, step)

    # -- logging

    @staticmethod
    def _check_reserved(d: dict, reserved: tuple[str, ...], what: str) -> None:
        clash = [k for k in reserved if k in d]
        if clash:
            raise ValueError(f"{what} may not contain the reserved key(s) {clash}")

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """Append ``{"step", "time", **metrics}`` to metrics.jsonl."""
        self._check_reserved(metrics, ("step", "time"), "metrics")
        self._require_writer()
        append_jsonl(self.path / METRICS_FILE, {"step": int(step), "time": time.time(), **metrics})
        self._export(metrics, step)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """Append sampled completions (one line per row, each with ``"step"``) to samples.jsonl."""
        for row in rows:
            self._check_reserved(row, ("step",), "sample rows")
        self._require_writer()
        append_jsonl_many(self.path / SAMPLES_FILE, ({"step": int(step), **row} for row in rows))

    def log_eval(self, step: int, summary: dict, per_prompt: list[dict]) -> None:
        """Write the per-prompt details to evals/step_NNNNNN.json (atomically), then append
        ``{"step", "time", **summary}`` to evals.jsonl, so a summary line always has details."""
        self._check_reserved(summary, ("step", "time"), "eval summary")
        self._require_writer()
        atomic_write_json(
            self.path / EVAL_DETAILS_DIR / _eval_detail_name(step), list(per_prompt), indent=None
        )
        append_jsonl(self.path / EVALS_FILE, {"step": int(step), "time": time.time(), **summary})
        self._export({f"eval/{k}": v for k, v in summary.items()}, step)

    # -- reading

    def read_metrics(self) -> list[dict]:
        return read_jsonl(self.path / METRICS_FILE)

    def read_samples(self) -> list[dict]:
        return read_jsonl(self.path / SAMPLES_FILE)

    def read_evals(self) -> list[dict]:
        return read_jsonl(self.path / EVALS_FILE)

    def eval_steps(self) -> list[int]:
        """Steps with per-prompt eval details on disk, sorted."""
        d = self.path / EVAL_DETAILS_DIR
        if not d.is_dir():
            return []
        steps = [int(m.group(1)) for p in d.iterdir() if (m := _DETAIL_RE.match(p.name))]
        return sorted(steps)

    def read_eval_details(self, step: int) -> list[dict]:
        p = self.path / EVAL_DETAILS_DIR / _eval_detail_name(step)
        try:
            rows = read_json(p, kind=list, fix=EVAL_DETAILS_FIX)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"run {str(self.path)!r} has no eval details for step {step} "
                f"(steps with details: {self.eval_steps()})"
            ) from None
        if not all(isinstance(r, dict) for r in rows):
            raise DamagedRunError(p, "holds a list whose items are not all per-prompt objects", EVAL_DETAILS_FIX)
        return rows

    # -- resume

    def truncate_after(self, step: int) -> None:
        """Drop everything logged after ``step`` (records with ``"step" > step`` in metrics,
        samples and evals, and eval detail files), so a run resumed from the checkpoint of
        ``step`` never has duplicate or orphan steps. Records without a step are kept."""
        step = int(step)
        self._require_writer()
        self._purge_step = step + 1  # exporters that can (TensorBoard) drop the later steps too
        for fname in (METRICS_FILE, SAMPLES_FILE, EVALS_FILE):
            p = self.path / fname
            if not p.exists():
                continue
            records = read_jsonl(p)
            kept = [
                r for r in records
                if not (isinstance(r, dict) and isinstance(r.get("step"), (int, float))
                        and r["step"] > step)
            ]
            # Rewrite also when nothing was dropped but the file has a torn tail to clean.
            if len(kept) != len(records) or not p.read_bytes().endswith(b"\n"):
                rewrite_jsonl(p, kept)
        for s in self.eval_steps():
            if s > step:
                (self.path / EVAL_DETAILS_DIR / _eval_detail_name(s)).unlink(missing_ok=True)
        # An agent run's trajectory files of dropped steps, so none outlives its step's records.
        traj = self.path / TRAJECTORIES_DIR
        for p in traj.glob("step_*.jsonl") if traj.is_dir() else ():
            m = re.fullmatch(r"step_(\d+)\.jsonl", p.name)
            if m and int(m.group(1)) > step:
                p.unlink(missing_ok=True)

    # -- models

    @property
    def final_model_dir(self) -> Path:
        return self.path / FINAL_MODEL_DIR

    def warm_start_model(self) -> Path | None:
        """The final model of this run's SFT stage (``sft/final_model``), which its RL started
        from instead of ``model.path``; None when the run had no (finished) SFT stage."""
        final = self.path / WARM_START_DIR / FINAL_MODEL_DIR
        return final if (final / "config.json").is_file() else None

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints as (step, path), oldest first (tracking/checkpoints.py)."""
        return list_checkpoints(self.path)

    def checkpoint(self, which: str | int) -> tuple[int, Path]:
        """The checkpoint named ``step_000010``, ``10`` or ``latest``; FileNotFoundError lists
        the ones that exist."""
        return find_checkpoint(self.path, which)

    # -- outputs

    def write_summary(self, summary: dict, markdown: str) -> None:
        self._require_writer()
        atomic_write_json(self.path / SUMMARY_JSON, summary)
        atomic_write_text(self.path / SUMMARY_MD, markdown if markdown.endswith("\n") else markdown + "\n")
