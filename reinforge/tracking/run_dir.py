"""A run is a directory.

Layout (every file written atomically or appended line by line, see :mod:`reinforge.tracking.io`)::

    <output_dir>/<run name>/
        config.yaml          the resolved config, whole (RunConfig.to_yaml())
        environment.json     python, platform, cpus, torch threads, every package version, git commit
        git_diff.patch       uncommitted changes to tracked files, when the repo was dirty
        status.json          {"state": running|finished|failed|interrupted, "started", "pid", ...}
        metrics.jsonl        one line per step: {"step", "time", <metric>: value, ...}
        samples.jsonl        logged completions: {"step", <row fields>...}
        evals.jsonl          one line per held-out evaluation: {"step", "time", <summary>...}
        evals/step_000010.json   per-prompt details of that evaluation
        checkpoints/         owned by the trainer
        final_model/         the trained model (save_pretrained), written by the trainer
        learning_curves.png  :meth:`RunDir.plot_curves`
        summary.json, summary.md  :meth:`RunDir.write_summary`
        exporters.json       ids of the wandb / MLflow / trackio runs this run also logs to
        tensorboard/         TensorBoard event files (when tracking.exporters has tensorboard)
        sampled_evals/<label>/   `reinforge eval`: N samples per held-out prompt, pass@k, maj@k
        boundary/<label>/    `reinforge eval --boundary`: base vs trained pass@k curves

``status.json`` has ``"kind": "eval"`` for a directory made by ``reinforge eval`` on a bare model
(no training); other directories are training runs. Training runs made by ``reinforge sweep``
carry ``tracking.sweep`` in their config.

Every report and comparison is computed from these files alone, so a run directory can be copied
to another machine and compared later.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import io as _io
import json
import logging
import math
import os
import platform
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from reinforge.tracking.io import (
    append_jsonl,
    append_jsonl_many,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_jsonl,
    rewrite_jsonl,
)

if TYPE_CHECKING:
    from reinforge.config import RunConfig

log = logging.getLogger(__name__)

__all__ = ["RunDir", "NotARunDirectoryError", "RUN_STATES", "RUN_KINDS", "collect_environment"]

CONFIG_FILE = "config.yaml"
ENVIRONMENT_FILE = "environment.json"
GIT_DIFF_FILE = "git_diff.patch"
STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
EVALS_FILE = "evals.jsonl"
EVAL_DETAILS_DIR = "evals"
CHECKPOINTS_DIR = "checkpoints"
CURVES_FILE = "learning_curves.png"
FINAL_MODEL_DIR = "final_model"
SAMPLED_EVALS_DIR = "sampled_evals"
BOUNDARY_DIR = "boundary"
RUN_KINDS = ("train", "eval")
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"

RUN_STATES = ("running", "finished", "failed", "interrupted")
_MAX_GIT_DIFF_BYTES = 5 * 1024 * 1024

# Metric names plot_curves looks for, first match wins. The trainer should log one of these.
TRAIN_REWARD_KEYS = ("reward_mean", "reward/mean", "train/reward_mean", "reward")
TRAIN_ACCURACY_KEYS = ("accuracy", "accuracy_mean", "train/accuracy")
LENGTH_KEYS = (
    "completion_length_mean",
    "completion_length",
    "completion_len_mean",
    "response_length_mean",
    "length_mean",
)
LOSS_KEYS = ("loss", "policy_loss", "loss/policy")
KL_KEYS = ("kl", "kl_mean", "loss/kl")


class NotARunDirectoryError(FileNotFoundError):
    """The path is not a reinforge run directory (no config.yaml)."""


def _now_iso() -> str:
    return _dt.datetime.now().astimezone().isoformat(timespec="seconds")


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._") or "run"


def task_label(task: dict[str, Any]) -> str:
    """A task's short name: the reasoning-gym dataset name, or the data file's stem."""
    if task.get("source", "reasoning_gym") == "file" and task.get("path"):
        return Path(str(task["path"])).stem
    return str(task.get("name", "task"))


def _eval_detail_name(step: int) -> str:
    return f"step_{int(step):06d}.json"


_DETAIL_RE = re.compile(r"^step_(-?\d+)\.json$")


# ----------------------------------------------------------------------------- environment


def _run_git(args: list[str], cwd: Path) -> str | None:
    """Output of a read-only git command, or None if git is missing / not a repo / fails."""
    try:
        out = subprocess.run(
            ["git", "--no-optional-locks", *args],  # never take the index lock
            cwd=cwd,
            capture_output=True,
            timeout=15,
            check=True,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return out.stdout.decode("utf-8", errors="replace")


def _git_info(cwd: Path) -> tuple[dict[str, Any], str | None]:
    """Commit and dirtiness of the repository containing ``cwd``; (info, diff or None)."""
    commit = _run_git(["rev-parse", "HEAD"], cwd)
    if commit is None:
        return {"available": False, "commit": None, "dirty": None}, None
    info: dict[str, Any] = {"available": True, "commit": commit.strip()}
    root = _run_git(["rev-parse", "--show-toplevel"], cwd)
    info["root"] = root.strip() if root else None
    status = _run_git(["status", "--porcelain", "--untracked-files=no"], cwd)
    info["dirty"] = None if status is None else bool(status.strip())
    diff = None
    if info["dirty"]:
        diff = _run_git(["diff", "HEAD"], cwd)
    return info, diff


def _installed_packages() -> dict[str, str]:
    packages: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        try:
            name = dist.metadata["Name"]
        except Exception:
            name = None
        if name:
            packages.setdefault(name, dist.version)
    return dict(sorted(packages.items(), key=lambda kv: kv[0].lower()))


def collect_environment(cwd: str | os.PathLike | None = None) -> tuple[dict[str, Any], str | None]:
    """What is needed to reproduce a run's software environment; returns (info, git diff or None).

    Never raises for a missing git or a directory that is not a repository.
    """
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    try:
        affinity = len(os.sched_getaffinity(0))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        affinity = None
    env: dict[str, Any] = {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "full_version": sys.version,
            "executable": sys.executable,
        },
        "platform": {
            "platform": platform.platform(),
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "processor": platform.processor(),
            "hostname": socket.gethostname(),
        },
        "cpu_count": os.cpu_count(),
        "cpu_affinity_count": affinity,
        "argv": list(sys.argv),
        "cwd": str(cwd),
    }
    try:
        import torch

        env["torch"] = {
            "version": torch.__version__,
            "num_threads": torch.get_num_threads(),
            "num_interop_threads": torch.get_num_interop_threads(),
            "cuda_available": torch.cuda.is_available(),
            "cuda_version": torch.version.cuda,
            "cuda_devices": [
                torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
            ]
            if torch.cuda.is_available()
            else [],
        }
    except Exception as err:  # torch missing or broken: record, do not fail the run
        env["torch"] = {"version": None, "error": repr(err)}
    env["packages"] = _installed_packages()
    git, diff = _git_info(cwd)
    env["git"] = git
    return env, diff


# ----------------------------------------------------------------------------- the run directory


class RunDir:
    """One run's directory: config, environment, status, metrics, samples, evals, plots."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        # Exporters (wandb, MLflow, ...) start on the first log call, so opening a run to read
        # it never contacts a tracking backend; a terminal set_status() finishes them.
        self._exporters = None
        self._purge_step: int | None = None

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
    def create(cls, config: "RunConfig", *, name: str | None = None, kind: str = "train") -> "RunDir":
        """Create ``<config.tracking.output_dir>/<name>`` and write config, environment, status.

        The name is ``name``, else ``config.tracking.run_name``, else
        ``<YYYYmmdd-HHMMSS>-<recipe>-<task>`` (``<YYYYmmdd-HHMMSS>-eval-<model>-<task>`` for
        ``kind="eval"``, a directory of evaluations of a model that was not trained here). An
        existing directory is never reused: a default name gets a ``-2``, ``-3``... suffix; an
        explicit name that exists and is not empty raises FileExistsError (resume an existing
        run with :meth:`open`).
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
                        "tracking.run_name, or resume it with RunDir.open()"
                    ) from None
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            what = config.recipe if kind == "train" else f"eval-{Path(config.model.path).name}"
            base = _safe_name(f"{stamp}-{what}-{task_label(config.task.model_dump())}")
            suffix = 1
            while True:
                path = output_dir / (base if suffix == 1 else f"{base}-{suffix}")
                try:
                    path.mkdir()  # atomic: two processes never get the same directory
                    break
                except FileExistsError:
                    suffix += 1

        run = cls(path)
        atomic_write_text(path / CONFIG_FILE, config.to_yaml())
        env, diff = collect_environment()
        env["seeds"] = {"trainer": config.trainer.seed, "task": config.task.seed}
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

    # -- config / status

    def load_config(self) -> dict[str, Any]:
        """The resolved config as saved, a raw dict."""
        with open(self.path / CONFIG_FILE, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
        if not isinstance(raw, dict):
            raise ValueError(f"{self.path / CONFIG_FILE}: expected a mapping of config sections")
        return raw

    def load_run_config(self) -> "RunConfig":
        """The saved config validated back into a RunConfig."""
        from reinforge.config import RunConfig

        return RunConfig.model_validate(self.load_config())

    def load_environment(self) -> dict[str, Any]:
        return json.loads((self.path / ENVIRONMENT_FILE).read_text(encoding="utf-8"))

    def status(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / STATUS_FILE).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}

    def set_status(self, state: str, **extra: Any) -> None:
        """Set the run state (running / finished / failed / interrupted) plus any extra fields
        (e.g. step=, error=); earlier fields such as ``started`` and ``pid`` are kept."""
        if state not in RUN_STATES:
            raise ValueError(f"unknown run state {state!r}; accepted: {', '.join(RUN_STATES)}")
        status = self.status()
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
        append_jsonl(self.path / METRICS_FILE, {"step": int(step), "time": time.time(), **metrics})
        self._export(metrics, step)

    def log_samples(self, step: int, rows: list[dict]) -> None:
        """Append sampled completions (one line per row, each with ``"step"``) to samples.jsonl."""
        for row in rows:
            self._check_reserved(row, ("step",), "sample rows")
        append_jsonl_many(self.path / SAMPLES_FILE, ({"step": int(step), **row} for row in rows))

    def log_eval(self, step: int, summary: dict, per_prompt: list[dict]) -> None:
        """Write the per-prompt details to evals/step_NNNNNN.json (atomically), then append
        ``{"step", "time", **summary}`` to evals.jsonl, so a summary line always has details."""
        self._check_reserved(summary, ("step", "time"), "eval summary")
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
            return json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(
                f"run {str(self.path)!r} has no eval details for step {step} "
                f"(steps with details: {self.eval_steps()})"
            ) from None

    # -- resume

    def truncate_after(self, step: int) -> None:
        """Drop everything logged after ``step`` (records with ``"step" > step`` in metrics,
        samples and evals, and eval detail files), so a run resumed from the checkpoint of
        ``step`` never has duplicate or orphan steps. Records without a step are kept."""
        step = int(step)
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

    # -- models

    @property
    def final_model_dir(self) -> Path:
        return self.path / FINAL_MODEL_DIR

    def checkpoints(self) -> list[tuple[int, Path]]:
        """Complete checkpoints (their state.json, written last, exists) as (step, path), sorted."""
        root = self.checkpoints_dir
        if not root.is_dir():
            return []
        out = []
        for p in root.iterdir():
            m = re.fullmatch(r"step_(\d+)", p.name)
            if m and p.is_dir() and (p / "state.json").is_file():
                out.append((int(m.group(1)), p))
        return sorted(out)

    def checkpoint(self, which: str | int) -> tuple[int, Path]:
        """The checkpoint named ``step_000010``, ``10`` or ``latest``; FileNotFoundError lists
        the ones that exist."""
        ckpts = self.checkpoints()
        if str(which) == "latest":
            if not ckpts:
                raise FileNotFoundError(f"run {str(self.path)!r} has no complete checkpoint")
            return ckpts[-1]
        m = re.fullmatch(r"(?:step_)?(\d+)", str(which))
        step = int(m.group(1)) if m else None
        for s, p in ckpts:
            if s == step:
                return s, p
        have = ", ".join(p.name for _, p in ckpts) or "none"
        raise FileNotFoundError(
            f"run {str(self.path)!r} has no checkpoint {which!r}; complete checkpoints: {have} "
            "(trainer.keep_checkpoints sets how many are kept)"
        )

    # -- sampled evaluations (reinforge eval)

    def sampled_eval_dir(self, label: str) -> Path:
        return self.path / SAMPLED_EVALS_DIR / _safe_name(label)

    def sampled_eval_labels(self) -> list[str]:
        d = self.path / SAMPLED_EVALS_DIR
        if not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir() if (p / SUMMARY_JSON).is_file())

    def write_sampled_eval(self, label: str, summary: dict, per_prompt: list[dict]) -> Path:
        """Write ``sampled_evals/<label>/samples.jsonl`` (every prompt's completions) and then
        ``summary.json`` (its presence marks the evaluation complete); returns the folder."""
        d = self.sampled_eval_dir(label)
        rewrite_jsonl(d / SAMPLES_FILE, per_prompt)
        atomic_write_json(d / SUMMARY_JSON, summary)
        return d

    def read_sampled_eval(self, label: str) -> tuple[dict, list[dict]]:
        d = self.sampled_eval_dir(label)
        try:
            summary = json.loads((d / SUMMARY_JSON).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(
                f"run {str(self.path)!r} has no sampled evaluation {label!r} "
                f"(it has: {', '.join(self.sampled_eval_labels()) or 'none'})"
            ) from None
        return summary, read_jsonl(d / SAMPLES_FILE)

    def boundary_dir(self, label: str) -> Path:
        return self.path / BOUNDARY_DIR / _safe_name(label)

    # -- outputs

    def write_summary(self, summary: dict, markdown: str) -> None:
        atomic_write_json(self.path / SUMMARY_JSON, summary)
        atomic_write_text(self.path / SUMMARY_MD, markdown if markdown.endswith("\n") else markdown + "\n")

    def plot_curves(self) -> Path:
        """learning_curves.png from metrics.jsonl and evals.jsonl; returns its path.

        Panels (each only when its data exists): train reward mean, held-out accuracy (with 95%
        CI error bars when evals carry accuracy_ci_low/high; train batch accuracy dashed),
        held-out mean reward (with CI when present), completion length, loss, KL. With no data at
        all, a single panel says so. Works with 0, 1 or many records.
        """
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        metrics = [r for r in self.read_metrics() if isinstance(r, dict) and "step" in r]
        evals = [r for r in self.read_evals() if isinstance(r, dict) and "step" in r]

        panels: list[dict[str, Any]] = []

        def num(v: Any) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        def series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
            xs, ys = [], []
            for r in records:
                v = r.get(key)
                if num(v):
                    xs.append(float(r["step"]))
                    ys.append(float(v))
            return xs, ys

        def first_key(records: list[dict], keys: tuple[str, ...]) -> str | None:
            for k in keys:
                if any(num(r.get(k)) for r in records):
                    return k
            return None

        def eval_line(key: str, ci_prefixes: tuple[str, ...], label: str) -> dict | None:
            xs, ys = series(evals, key)
            if not xs:
                return None
            line: dict[str, Any] = {"x": xs, "y": ys, "label": label}
            rows = [r for r in evals if num(r.get(key))]
            for prefix in ci_prefixes:
                lo_k, hi_k = f"{prefix}_ci_low", f"{prefix}_ci_high"
                if all(num(r.get(lo_k)) and num(r.get(hi_k)) for r in rows):
                    break
            else:
                return line
            lo = [max(0.0, y - float(r[lo_k])) for r, y in zip(rows, ys)]
            hi = [max(0.0, float(r[hi_k]) - y) for r, y in zip(rows, ys)]
            line["yerr"] = [lo, hi]
            line["label"] = f"{label} (CI)"
            return line

        k = first_key(metrics, TRAIN_REWARD_KEYS)
        if k:
            x, y = series(metrics, k)
            panels.append({"title": "train reward (mean)", "ylabel": k,
                           "lines": [{"x": x, "y": y, "label": "train"}]})

        acc_lines = []
        k = first_key(metrics, TRAIN_ACCURACY_KEYS)
        if k:
            x, y = series(metrics, k)
            acc_lines.append({"x": x, "y": y, "label": "train batch", "style": "--"})
        line = eval_line("accuracy", ("accuracy",), "held-out")
        if line:
            acc_lines.append(line)
        if acc_lines:
            panels.append({"title": "accuracy", "ylabel": "accuracy", "lines": acc_lines})

        line = eval_line("reward_mean", ("reward", "reward_mean"), "held-out")
        if line:
            panels.append({"title": "held-out reward (mean)", "ylabel": "reward_mean",
                           "lines": [line]})

        for keys, title in ((LENGTH_KEYS, "completion length"), (LOSS_KEYS, "loss"),
                            (KL_KEYS, "KL to reference")):
            k = first_key(metrics, keys)
            if k:
                x, y = series(metrics, k)
                panels.append({"title": title, "ylabel": k,
                               "lines": [{"x": x, "y": y, "label": k}]})

        n = max(1, len(panels))
        ncols = min(3, n)
        nrows = math.ceil(n / ncols)
        height = 3.2 * nrows + 0.4
        fig = Figure(figsize=(4.4 * ncols, height))
        FigureCanvasAgg(fig)
        # Fixed margins (inches -> fractions): constrained layout costs ~1 s per plot.
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        fig.subplots_adjust(left=0.9 / (4.4 * ncols), right=1 - 0.15 / (4.4 * ncols),
                            bottom=0.55 / height, top=1 - 0.75 / height, wspace=0.38, hspace=0.5)
        if not panels:
            ax = axes[0]
            ax.text(0.5, 0.5, "no metrics or evaluations logged yet", ha="center", va="center",
                    transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
        for ax, panel in zip(axes, panels):
            for ln in panel["lines"]:
                style = ln.get("style", "-")
                if "yerr" in ln:
                    ax.errorbar(ln["x"], ln["y"], yerr=ln["yerr"], fmt="o" + style, capsize=3,
                                markersize=4, label=ln["label"])
                else:
                    ax.plot(ln["x"], ln["y"], style, marker="o" if len(ln["x"]) < 30 else None,
                            markersize=3, label=ln["label"])
            ax.set_title(panel["title"])
            ax.set_xlabel("step")
            ax.set_ylabel(panel["ylabel"])
            ax.grid(alpha=0.3)
            if len(panel["lines"]) > 1 or any("yerr" in ln for ln in panel["lines"]):
                ax.legend(fontsize="small")
        for ax in axes[len(panels) if panels else 1:]:
            ax.set_visible(False)
        fig.suptitle(self.name)
        buf = _io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        out = self.path / CURVES_FILE
        atomic_write_bytes(out, buf.getvalue())
        return out
