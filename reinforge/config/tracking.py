"""The ``tracking`` section: where run directories go, and the optional metric exporters (their
names and pip extras live here, so that validation names a missing package before any model
loads)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from .base import _Section

# Exporter name -> (module it imports, pip extra that installs it). The config validates
# tracking.exporters against it; reinforge.tracking.exporters builds the exporters from it.
EXPORTERS: dict[str, tuple[str, str]] = {
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
    "tensorboard": ("tensorboard", "tensorboard"),
    "trackio": ("trackio", "trackio"),
}


def missing_exporter_message(name: str) -> str:
    module, extra = EXPORTERS[name]
    return (
        f"tracking.exporters includes {name!r} but the package {module!r} is not installed. "
        f"Install it with `pip install 'reinforge[{extra}]'`, or remove {name!r} from "
        "tracking.exporters (e.g. tracking.exporters=[])."
    )


def missing_exporter(names: list[str]) -> str | None:
    """The error message for the first exporter in ``names`` that is unknown or whose package
    cannot be imported, or None. ``importlib.util.find_spec`` does not import the package, so
    this is cheap enough for config validation."""
    import importlib.util

    for name in names:
        if name not in EXPORTERS:
            return f"unknown exporter {name!r}; accepted: {', '.join(EXPORTERS)}"
        if importlib.util.find_spec(EXPORTERS[name][0]) is None:
            return missing_exporter_message(name)
    return None


class WandbOptions(_Section):
    """Weights & Biases exporter (`pip install 'reinforge[wandb]'`)."""

    mode: Literal["offline", "online", "disabled"] = Field(
        "offline",
        description="'offline' writes <dir>/wandb/offline-run-* with no network or login (upload "
        "later with `wandb sync`); 'online' needs `wandb login`.",
    )
    project: str = Field("reinforge", description="W&B project.")
    entity: str | None = Field(None, description="W&B team or user (None: your default).")
    group: str | None = Field(None, description="W&B run group (e.g. a sweep's name).")
    tags: list[str] = Field(default_factory=list, description="W&B run tags.")
    dir: str | None = Field(None, description="Where wandb writes its files (None: the run directory).")


class MlflowOptions(_Section):
    """MLflow exporter (`pip install 'reinforge[mlflow]'`)."""

    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI (None: a local file store `<output_dir>/mlruns`, shared by "
        "the runs of one output folder; view it with `mlflow ui --backend-store-uri <it>`).",
    )
    experiment: str = Field("reinforge", description="MLflow experiment name.")


class TensorboardOptions(_Section):
    """TensorBoard exporter (`pip install 'reinforge[tensorboard]'`)."""

    log_dir: str | None = Field(None, description="Event file folder (None: <run dir>/tensorboard).")


class TrackioOptions(_Section):
    """trackio exporter (`pip install 'reinforge[trackio]'`)."""

    project: str = Field("reinforge", description="trackio project.")
    dir: str | None = Field(
        None, description="TRACKIO_DIR, where trackio keeps its database (None: trackio's default)."
    )


class TrackingConfig(_Section):
    output_dir: str = Field("runs", description="Folder under which run directories are created.")
    run_name: str | None = Field(None, description="Run directory name (None: time + recipe + task).")
    progress: bool = Field(True, description="Show a live progress bar.")
    exporters: list[Literal[tuple(EXPORTERS)]] = Field(
        default_factory=list,
        description="Also send every metric (same names and steps) to these trackers; the run "
        "directory stays the record. Each needs its extra: `pip install 'reinforge[wandb]'`, "
        "`[mlflow]`, `[tensorboard]`, `[trackio]`, or `[tracking]` for all.",
    )
    wandb: WandbOptions = Field(default_factory=WandbOptions)
    mlflow: MlflowOptions = Field(default_factory=MlflowOptions)
    tensorboard: TensorboardOptions = Field(default_factory=TensorboardOptions)
    trackio: TrackioOptions = Field(default_factory=TrackioOptions)
    sweep: str | None = Field(
        None, description="Name of the sweep this run belongs to (set by `reinforge sweep`)."
    )

    @field_validator("run_name")
    @classmethod
    def _plain_name(cls, v: str | None) -> str | None:
        if v is not None and (v in ("", ".", "..") or "/" in v or "\\" in v):
            raise ValueError(f"tracking.run_name={v!r} must be a plain folder name (no '/', not '.' or '..'); "
                             "the folder it goes in is tracking.output_dir")
        return v

    @field_validator("exporters")
    @classmethod
    def _exporters_installed(cls, v: list[str]) -> list[str]:
        # Checked here so a missing package fails before any model loads.
        dupes = sorted({n for n in v if v.count(n) > 1})
        if dupes:
            raise ValueError(f"exporter(s) listed more than once: {', '.join(dupes)}")
        missing = missing_exporter(list(v))
        if missing is not None:
            raise ValueError(missing)
        return v
