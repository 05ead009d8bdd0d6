"""Sweeps: a grid of config overrides times several seeds, each a normal run directory, run one
after another and resumable (``reinforge sweep sweep.yaml``).

A sweep file::

    name: scale_rewards            # optional; default: the file's name
    base: main.yaml                # config the grid overrides (relative to the sweep file)
    output_dir: runs/sweeps/scale_rewards   # optional; default runs/sweeps/<name>
    seeds: [0, 1, 2]               # one run per seed per grid point
    seed_keys: [trainer.seed]      # optional: the keys each seed is written to
    overrides:                     # optional, applied to every run (a mapping or "key=value" list)
      trainer.steps: 12
    grid:                          # every combination of these values
      algorithm.scale_rewards: [group, none]

``grid`` may instead be a list of points, each a mapping of keys to values (and an optional
``name`` used for the run directories), when the factors do not cross::

    grid:
      - {name: grpo, recipe: grpo}
      - {name: dr_grpo, recipe: dr_grpo, algorithm.scale_rewards: none}

Each run is ``<output_dir>/<grid point>-seed<seed>/`` (e.g. ``scale_rewards=false-seed1``) with
``tracking.sweep: <name>`` in its config; ``<output_dir>/sweep.json`` lists the plan. Running the
sweep again skips finished runs, resumes interrupted, killed or failed ones from their last
checkpoint, and starts the rest; a run whose saved config differs from the plan (the sweep file was
edited) stops the sweep with the differing keys named. Each run is trained under its writer lock
(tracking/lock.py), taken before its state is read: a run another process is writing (a second
sweep over the same folder, a ``reinforge train --resume``) stops the sweep with that process
named, and is never trained twice.
"""

from __future__ import annotations

import copy
import gc
import itertools
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from reinforge.tracking.index import effective_state, pid_alive, run_state
from reinforge.tracking.io import atomic_write_json
from reinforge.tracking.lock import LOCK_FILE, RunLockedError, describe_holder
from reinforge.tracking.run_dir import CONFIG_FILE, RunDir

if TYPE_CHECKING:
    from reinforge.config import RunConfig

log = logging.getLogger(__name__)

__all__ = ["SweepError", "SweepSpec", "SweepRun", "load_sweep", "plan_sweep", "run_config", "run_sweep",
           "SweepOutcome", "SWEEP_FILE"]

SWEEP_FILE = "sweep.json"
_KEYS = ("name", "base", "output_dir", "seeds", "seed_keys", "overrides", "grid")


class SweepError(ValueError):
    """A sweep file or sweep directory that cannot be run; the message says what to fix."""


@dataclass
class SweepSpec:
    name: str
    path: Path | None
    base: Path | None
    output_dir: Path
    seeds: list[int]
    seed_keys: list[str]
    overrides: dict[str, Any]
    grid: dict[str, list[Any]] | list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "sweep_file": str(self.path) if self.path else None,
                "base": str(self.base) if self.base else None, "output_dir": str(self.output_dir),
                "seeds": self.seeds, "seed_keys": self.seed_keys, "overrides": self.overrides, "grid": self.grid}


@dataclass
class SweepRun:
    name: str
    point: dict[str, Any]
    seed: int


def _overrides_mapping(raw: Any, where: str) -> dict[str, Any]:
    from reinforge.config import parse_override

    if raw is None:
        return {}
    if isinstance(raw, dict):
        return {str(k): v for k, v in raw.items()}
    if isinstance(raw, list):
        out = {}
        for item in raw:
            if not isinstance(item, str) or "=" not in item:
                raise SweepError(f"{where}: override {item!r} is not of the form key=value")
            k, v = parse_override(item)
            out[k] = v
        return out
    raise SweepError(f"{where}: 'overrides' must be a mapping or a list of key=value strings")


def load_sweep(path: str | os.PathLike, *, output_dir: str | os.PathLike | None = None) -> SweepSpec:
    """Read and check a sweep file; errors name the key and what is accepted."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"sweep file {str(path)!r} does not exist")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise SweepError(f"sweep file {str(path)!r} is not valid YAML: {err}") from None
    if not isinstance(raw, dict):
        raise SweepError(f"sweep file {str(path)!r} must hold a mapping with keys {', '.join(_KEYS)}")
    unknown = sorted(set(raw) - set(_KEYS))
    if unknown:
        raise SweepError(f"{path}: unknown key(s) {unknown}; accepted: {', '.join(_KEYS)}")
    name = str(raw.get("name") or path.stem)
    if not re.fullmatch(r"[A-Za-z0-9._=+-]+", name):
        raise SweepError(f"{path}: sweep name {name!r} must be a plain name (letters, digits, . _ - = +)")
    base = raw.get("base")
    base_path = None
    if base is not None:
        base_path = Path(base)
        if not base_path.is_absolute():
            # Relative to the sweep file first, then to the working directory.
            candidate = path.parent / base_path
            base_path = candidate if candidate.is_file() else base_path
        if not base_path.is_file():
            raise SweepError(f"{path}: base config {str(base)!r} not found (relative paths are looked up next "
                             "to the sweep file, then in the working directory)")
    seeds = raw.get("seeds", [0])
    if isinstance(seeds, int):
        seeds = [seeds]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise SweepError(f"{path}: 'seeds' must be a non-empty list of integers, e.g. [0, 1, 2]")
    if len(set(seeds)) != len(seeds):
        raise SweepError(f"{path}: 'seeds' has duplicates: {seeds}")
    seed_keys = raw.get("seed_keys", ["trainer.seed"])
    if isinstance(seed_keys, str):
        seed_keys = [seed_keys]
    if not isinstance(seed_keys, list) or not seed_keys:
        raise SweepError(f"{path}: 'seed_keys' must be a list of config keys, e.g. [trainer.seed]")
    grid = raw.get("grid") or {}
    grid_out: dict[str, list[Any]] | list[dict[str, Any]]
    if isinstance(grid, dict):
        grid_out = {}
        for k, vals in grid.items():
            if not isinstance(vals, list) or not vals:
                raise SweepError(f"{path}: grid key {k!r} needs a non-empty list of values, got {vals!r}")
            grid_out[str(k)] = vals
        keys = list(grid_out)
    elif isinstance(grid, list) and grid and all(isinstance(p, dict) and p for p in grid):
        grid_out = [{str(k): v for k, v in p.items()} for p in grid]
        keys = sorted({k for p in grid_out for k in p if k != "name"})
        names = [p.get("name") for p in grid_out]
        if any(n is not None for n in names) and (None in names or len(set(names)) != len(names)):
            raise SweepError(f"{path}: give every grid point a distinct 'name', or none of them")
    else:
        raise SweepError(f"{path}: 'grid' must map config keys to lists of values, or be a list of points "
                         "(mappings of config keys to values)")
    for k in keys:
        if k in seed_keys or k.startswith("tracking."):
            raise SweepError(f"{path}: grid key {k!r} is set by the sweep itself (seeds go in 'seeds')")
    out = Path(output_dir) if output_dir is not None else Path(raw.get("output_dir") or Path("runs") / "sweeps" / name)
    return SweepSpec(name=name, path=path, base=base_path, output_dir=out, seeds=list(seeds),
                     seed_keys=[str(k) for k in seed_keys], overrides=_overrides_mapping(raw.get("overrides"), str(path)),
                     grid=grid_out)


def _value_text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float, str)):
        return str(v)
    return json.dumps(v, separators=(",", ":"), sort_keys=True)


def _dir_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9._=+,-]+", "_", text).strip("._")
    if len(name) > 120:  # keep paths short; the point is in sweep.json and the config anyway
        import hashlib

        name = name[:100] + "-" + hashlib.sha1(text.encode()).hexdigest()[:8]
    return name or "run"


def plan_sweep(spec: SweepSpec) -> list[SweepRun]:
    """Every grid point x seed, grid points in the file's order, seeds innermost."""
    if isinstance(spec.grid, list):
        points = [{k: v for k, v in p.items() if k != "name"} for p in spec.grid]
        given = [p.get("name") for p in spec.grid]
    else:
        keys = list(spec.grid)
        points = [dict(zip(keys, values)) for values in itertools.product(*(spec.grid[k] for k in keys))]
        given = [None] * len(points)
    all_keys = list(dict.fromkeys(k for p in points for k in p))
    leaves = [k.rsplit(".", 1)[-1] for k in all_keys]
    short = {k: (leaf if leaves.count(leaf) == 1 else k) for k, leaf in zip(all_keys, leaves)}
    runs: list[SweepRun] = []
    for point, given_name in zip(points, given):
        label = (str(given_name) if given_name is not None
                 else ",".join(f"{short[k]}={_value_text(v)}" for k, v in point.items()))
        for seed in spec.seeds:
            run_name = _dir_name(f"{label}-seed{seed}" if label else f"seed{seed}")
            runs.append(SweepRun(name=run_name, point=point, seed=seed))
    names = [r.name for r in runs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SweepError(f"two grid points map to the same run name {dupes[0]!r}; make the grid values distinct")
    return runs


def run_config(spec: SweepSpec, run: SweepRun) -> "RunConfig":
    """The run's config: base file <- fixed overrides <- grid point <- seed <- sweep tracking keys,
    then the recipe preset under it all and validation (as ``reinforge train`` does)."""
    from reinforge.config import ConfigError, build_config, set_dotted

    raw: dict[str, Any] = {}
    if spec.base is not None:
        try:
            raw = yaml.safe_load(spec.base.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as err:
            raise SweepError(f"base config {str(spec.base)!r} is not valid YAML: {err}") from None
        if not isinstance(raw, dict):
            raise SweepError(f"base config {str(spec.base)!r} must hold a mapping of config sections")
    try:
        for k, v in spec.overrides.items():
            set_dotted(raw, k, v)
        for k, v in run.point.items():
            set_dotted(raw, k, v)
        for k in spec.seed_keys:
            set_dotted(raw, k, run.seed)
        set_dotted(raw, "tracking.output_dir", str(spec.output_dir))
        set_dotted(raw, "tracking.run_name", run.name)
        set_dotted(raw, "tracking.sweep", spec.name)
        return build_config(raw)
    except ConfigError as err:
        raise SweepError(f"sweep run {run.name}: {err}") from None


# Keys whose change does not make a run a different experiment.
def _comparable(cfg: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    tracking = out.get("tracking") or {}
    out["tracking"] = {k: tracking.get(k) for k in ("output_dir", "run_name", "sweep")}
    (out.get("trainer") or {}).pop("num_threads", None)
    return out


def _diff_keys(a: Any, b: Any, prefix: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            out += _diff_keys(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]


@dataclass
class SweepOutcome:
    finished: list[str] = field(default_factory=list)   # trained to the end in this invocation
    skipped: list[str] = field(default_factory=list)    # already finished before
    failed: list[tuple[str, str]] = field(default_factory=list)
    interrupted: str | None = None                      # the run a Ctrl-C stopped (sweep stopped)


TrainFn = Callable[["RunConfig", "RunDir | None"], Any]


def write_sweep_file(spec: SweepSpec, runs: list[SweepRun]) -> Path:
    spec.output_dir.mkdir(parents=True, exist_ok=True)
    path = spec.output_dir / SWEEP_FILE
    atomic_write_json(path, {**spec.to_dict(),
                             "runs": [{"name": r.name, "grid": r.point, "seed": r.seed} for r in runs]})
    return path


def _held_error(path: Path, holder: dict[str, Any] | None) -> SweepError:
    return SweepError(f"run {str(path)!r} is being trained by {describe_holder(holder)}; "
                      "wait for it or stop it before running the sweep")


def run_sweep(spec: SweepSpec, train: TrainFn, *, echo: Callable[[str], None] = print) -> SweepOutcome:
    """Run every planned run not yet finished, one after another.

    ``train(config, run_dir)`` trains one run: ``run_dir`` is None for a new run (the trainer
    creates it, taking its writer lock), or the existing RunDir, whose writer lock the sweep holds,
    to resume from its latest checkpoint. A finished run is skipped. A run that raises is
    recorded as failed and the sweep goes on; a run left "interrupted" (Ctrl-C) stops the sweep,
    so the same command continues it. A run another process is writing stops the sweep.
    """
    runs = plan_sweep(spec)
    configs = [run_config(spec, r) for r in runs]  # validate every run before training any
    write_sweep_file(spec, runs)
    outcome = SweepOutcome()
    for i, (run, cfg) in enumerate(zip(runs, configs), start=1):
        path = spec.output_dir / run.name
        tag = f"[{i}/{len(runs)}] {run.name}"
        existing: RunDir | None = None
        if (path / CONFIG_FILE).is_file():
            existing = RunDir.open(path)
            had_lock = (path / LOCK_FILE).exists()
            try:
                existing.acquire_writer()  # held from before the state is read until training ends
            except RunLockedError as err:
                raise _held_error(path, err.holder) from None
            try:
                state = _check_existing(existing, cfg, legacy=not had_lock)
            except BaseException:
                existing.release_writer()
                raise
            if state == "finished":
                existing.release_writer()
                echo(f"{tag}: finished, skipped")
                outcome.skipped.append(run.name)
                continue
            echo(f"{tag}: {state}, resuming from its latest checkpoint")
        elif path.exists() and any(path.iterdir()):
            raise SweepError(f"{str(path)!r} exists but is not a run directory (no {CONFIG_FILE}); remove it")
        else:
            echo(f"{tag}: starting")
        try:
            train(cfg, existing)
        except KeyboardInterrupt:
            raise
        except (RunLockedError, FileExistsError) as err:
            if existing is None:  # another process created this run after the check above
                raise _held_error(path, RunDir(path).writer()) from err
            raise
        except Exception as err:  # noqa: BLE001 - one failing run must not stop the others
            log.exception("sweep run %s failed", run.name)
            outcome.failed.append((run.name, f"{type(err).__name__}: {err}"))
            echo(f"{tag}: failed ({type(err).__name__}: {err})")
            continue
        finally:
            if existing is not None:
                existing.release_writer()
            gc.collect()
        state = run_state(RunDir.open(path)) if (path / CONFIG_FILE).is_file() else "missing"
        if state == "interrupted":
            outcome.interrupted = run.name
            echo(f"{tag}: interrupted; run the same sweep command again to continue")
            break
        if state == "finished":
            outcome.finished.append(run.name)
        else:
            outcome.failed.append((run.name, f"ended in state {state}"))
    return outcome


def _check_existing(run: RunDir, cfg: "RunConfig", *, legacy: bool) -> str:
    """The state of a planned run found on disk, after checking it was made from the same plan.
    ``legacy``: the run predates writer locks, so a live pid in its status means a writer."""
    saved, planned = run.load_config(), cfg.to_dict()
    if (planned.get("model") or {}).get("dtype") == "auto":  # the run resolved it where it started
        planned["model"]["dtype"] = (saved.get("model") or {}).get("dtype", "auto")
    diff = _diff_keys(_comparable(saved), _comparable(planned))
    if diff:
        raise SweepError(
            f"run {str(run.path)!r} was made with a different config than the sweep now plans "
            f"(differing keys: {', '.join(diff[:8])}). Use another output_dir for the changed sweep, "
            "or delete that run to redo it."
        )
    status = run.status()
    if legacy:
        state = effective_state(status)
        if state == "running" and pid_alive(status.get("pid")) and status.get("pid") != os.getpid():
            raise _held_error(run.path, {"pid": status.get("pid"), "hostname": status.get("hostname")})
        return state
    # This process holds the lock now, so a "running" status was left by a writer that died.
    state = status.get("state", "unknown")
    return "stale" if state == "running" else state
