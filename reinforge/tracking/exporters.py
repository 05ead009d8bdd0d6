"""Optional exporters: the run directory stays the record, and every metric it logs is also sent,
under the same name and step, to Weights & Biases (offline by default), MLflow (a local file store
by default), TensorBoard and trackio.

Names: training metrics keep their ``metrics.jsonl`` names (``reward_mean``, ``loss``, ...);
held-out evaluation summaries get an ``eval/`` prefix (``eval/accuracy``, ``eval/reward_mean``,
...). Only numbers are exported.

Each exporter's package is an optional extra (``pip install 'reinforge[wandb]'`` etc.) imported
only when a run names it in ``tracking.exporters``. :func:`check_exporters_available` fails at
config validation, before any model loads, naming the extra to install. An exporter that raises
while the run is logging is switched off with one warning: the run directory already holds the
metrics, so a tracking server's hiccup never stops training.

On resume each exporter continues its own run: the ids are kept in ``<run>/exporters.json``
(wandb run id, MLflow run id, trackio run name) and TensorBoard purges the steps after the
checkpoint the trainer resumed from.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from reinforge.config import EXPORTERS, missing_exporter, missing_exporter_message
from reinforge.tracking.history import flatten_dotted
from reinforge.tracking.io import DamagedRunError, read_json

log = logging.getLogger(__name__)

__all__ = [
    "EXPORTERS",
    "MissingExporterError",
    "check_exporters_available",
    "Exporter",
    "ExporterSet",
    "build_exporters",
    "numeric_metrics",
]

STATE_FILE = "exporters.json"


class MissingExporterError(ImportError):
    """An exporter's package is not installed; the message names the pip extra."""


def check_exporters_available(names: list[str]) -> None:
    """Raise MissingExporterError for the first exporter whose package cannot be imported (the
    same check the config runs on tracking.exporters, see :func:`reinforge.config.missing_exporter`)."""
    for name in names:
        if name not in EXPORTERS:
            raise ValueError(f"unknown exporter {name!r}; accepted: {', '.join(EXPORTERS)}")
    problem = missing_exporter(names)
    if problem is not None:
        raise MissingExporterError(problem)


def _import(name: str):
    module = EXPORTERS[name][0]
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExporterError(missing_exporter_message(name)) from err


def numeric_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics dict as floats (bools as 0/1); others are dropped."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, (int, float)):
            out[k] = float(v)
        elif hasattr(v, "item") and getattr(v, "ndim", 1) == 0:  # numpy / torch scalars
            try:
                out[k] = float(v.item())
            except (TypeError, ValueError):
                pass
    return out


class Exporter:
    """One tracking backend. ``start`` returns what must be remembered to resume its run."""

    name = "exporter"

    def __init__(self, run_path: Path, run_name: str, config: dict[str, Any], options: dict[str, Any]):
        self.run_path = run_path
        self.run_name = run_name
        self.config = config
        self.options = options

    def start(self, saved: dict[str, Any] | None, purge_step: int | None) -> dict[str, Any]:
        raise NotImplementedError

    def log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def finish(self, state: str) -> None:
        raise NotImplementedError


class WandbExporter(Exporter):
    """Weights & Biases. ``mode: offline`` (the default) writes ``<dir>/wandb/offline-run-*``
    without network or login; upload later with ``wandb sync``."""

    name = "wandb"

    def start(self, saved, purge_step):
        wandb = _import("wandb")
        o = self.options
        run_id = (saved or {}).get("id") or secrets.token_hex(4)  # kept to resume the same W&B run
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True)
        self.run = wandb.init(
            id=run_id,
            resume="allow",
            mode=o.get("mode", "offline"),
            project=o.get("project") or "reinforge",
            entity=o.get("entity"),
            group=o.get("group"),
            tags=o.get("tags") or None,
            name=self.run_name,
            dir=str(Path(o["dir"]) if o.get("dir") else self.run_path),
            config=self.config,
            settings=settings,
        )
        return {"id": run_id}

    def log(self, metrics, step):
        self.run.log(metrics, step=step)

    def finish(self, state):
        self.run.finish(exit_code=0 if state == "finished" else 1)


class MlflowExporter(Exporter):
    """MLflow through ``MlflowClient``. Default store: ``file:<output_dir>/mlruns`` shared by the
    runs of one output folder (view with ``mlflow ui --backend-store-uri <that folder>``)."""

    name = "mlflow"
    _STATUS = {"finished": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}

    def start(self, saved, purge_step):
        uri = self.options.get("tracking_uri") or (self.run_path.parent / "mlruns").resolve().as_uri()
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 refuses its file store unless asked; a local file store is what we want here.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        _import("mlflow")
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self._Metric = Metric
        self.client = MlflowClient(tracking_uri=uri)
        run_id = (saved or {}).get("run_id")
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
        else:
            exp_name = self.options.get("experiment") or "reinforge"
            exp = self.client.get_experiment_by_name(exp_name)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(exp_name)
            run = self.client.create_run(
                exp_id, run_name=self.run_name, tags={"reinforge.run_dir": str(self.run_path)}
            )
            run_id = run.info.run_id
            # Params are immutable in MLflow: logged once, at creation. 500 chars is the
            # smallest value limit across MLflow versions.
            params = [Param(k, str(v)[:500]) for k, v in sorted(flatten_dotted(self.config).items())]
            for i in range(0, len(params), 100):
                self.client.log_batch(run_id, params=params[i : i + 100])
        self.run_id = run_id
        return {"run_id": run_id, "tracking_uri": uri}

    def log(self, metrics, step):
        ts = int(time.time() * 1000)
        batch = [self._Metric(k, v, ts, int(step)) for k, v in metrics.items()]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def finish(self, state):
        self.client.set_terminated(self.run_id, status=self._STATUS.get(state, "FINISHED"))


class TensorBoardExporter(Exporter):
    """TensorBoard event files in ``<run>/tensorboard`` (``tensorboard --logdir runs``)."""

    name = "tensorboard"

    def start(self, saved, purge_step):
        _import("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        log_dir = Path(self.options["log_dir"]) if self.options.get("log_dir") else self.run_path / "tensorboard"
        # purge_step drops events the resumed run will log again (after its checkpoint).
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)
        if not saved:
            text = json.dumps(self.config, indent=2, default=str)
            self.writer.add_text("config", "```\n" + text + "\n```", 0)
        return {"log_dir": str(log_dir)}

    def log(self, metrics, step):
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, int(step))
        self.writer.flush()  # a crash loses no logged step

    def finish(self, state):
        self.writer.close()


class TrackioExporter(Exporter):
    """trackio (local SQLite database, dashboard with ``trackio show``). ``dir`` sets TRACKIO_DIR,
    which trackio reads once at import."""

    name = "trackio"

    def start(self, saved, purge_step):
        if self.options.get("dir"):
            wanted = str(Path(self.options["dir"]).resolve())
            already = "trackio" in sys.modules
            if already and os.environ.get("TRACKIO_DIR") != wanted:
                log.warning("trackio was imported before with another TRACKIO_DIR; it keeps logging there, "
                            "not to tracking.trackio.dir=%s", wanted)
            else:
                os.environ["TRACKIO_DIR"] = wanted
        trackio = _import("trackio")
        project = self.options.get("project") or "reinforge"
        self.run = trackio.init(
            project=project, name=self.run_name, config=self.config, resume="allow",
            auto_log_cpu=False, auto_log_gpu=False, embed=False,
        )
        return {"project": project, "name": self.run_name}

    def log(self, metrics, step):
        self.run.log(metrics, step=int(step))

    def finish(self, state):
        self.run.finish()


_CLASSES: dict[str, type[Exporter]] = {
    "wandb": WandbExporter,
    "mlflow": MlflowExporter,
    "tensorboard": TensorBoardExporter,
    "trackio": TrackioExporter,
}


class ExporterSet:
    """The exporters of one run; forwards each log call to all of them, disabling any that fails."""

    def __init__(self, exporters: list[Exporter]):
        self.exporters = list(exporters)

    def __bool__(self) -> bool:
        return bool(self.exporters)

    @property
    def names(self) -> list[str]:
        return [e.name for e in self.exporters]

    def _guard(self, exporter: Exporter, what: str, fn) -> bool:
        try:
            fn()
            return True
        except Exception as err:  # noqa: BLE001 - a tracking backend must never stop training
            log.warning("exporter %s failed to %s (%s: %s); it is switched off for this run, the run "
                        "directory keeps every metric", exporter.name, what, type(err).__name__, err)
            return False

    def log(self, metrics: dict[str, Any], step: int) -> None:
        values = numeric_metrics(metrics)
        if not values:
            return
        self.exporters = [e for e in self.exporters if self._guard(e, "log", lambda e=e: e.log(values, step))]

    def finish(self, state: str) -> None:
        for e in self.exporters:
            self._guard(e, "finish", lambda e=e: e.finish(state))
        self.exporters = []


def build_exporters(run_path: Path, config: dict[str, Any], *, purge_step: int | None = None) -> ExporterSet:
    """Start the exporters named in ``config["tracking"]["exporters"]`` for the run at
    ``run_path``, resuming the runs recorded in ``exporters.json``. An exporter that fails to
    start is left out with a warning (a missing package raises MissingExporterError instead:
    that is a setup error, caught at config validation)."""
    tracking = config.get("tracking") or {}
    names = list(tracking.get("exporters") or [])
    if not names:
        return ExporterSet([])
    check_exporters_available(names)
    state_path = run_path / STATE_FILE
    try:
        saved_all = read_json(state_path, kind=dict, default={}, fix="it is rewritten now")
    except DamagedRunError as err:  # only the exporters' run ids: the run goes on, in new exporter runs
        log.warning("%s; the exporters start new runs instead of continuing the earlier ones", err)
        saved_all = {}
    started: list[Exporter] = []
    for name in names:
        exporter = _CLASSES[name](run_path, run_path.name, config, dict(tracking.get(name) or {}))
        try:
            saved_all[name] = exporter.start(saved_all.get(name), purge_step)
        except MissingExporterError:
            raise
        except Exception as err:  # noqa: BLE001
            log.warning("exporter %s could not start (%s: %s); the run goes on without it",
                        name, type(err).__name__, err)
            continue
        started.append(exporter)
    from reinforge.tracking.io import atomic_write_json

    atomic_write_json(state_path, saved_all)
    return ExporterSet(started)
