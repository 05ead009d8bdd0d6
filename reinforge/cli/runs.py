"""`reinforge sweep / compare / runs / reproduce`: thin wrappers over reinforge.tracking and
reinforge.evaluation (docs/experiments.md).

Only the standard library at module level: the package imports this module before its signal
handlers are installed, so the config, the trainer and torch are imported inside the functions
(reinforge/cli/__init__.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .common import _split_items
from .exits import stopped_code


def _sweep(args: argparse.Namespace) -> int:
    from ..config import ConfigError
    from ..tracking import RunDir
    from ..tracking.index import run_state
    from ..tracking.sweep import load_sweep, plan_sweep, run_sweep

    targets, overrides = _split_items(args.items)
    if len(targets) != 1 or overrides:
        raise ConfigError("usage: reinforge sweep SWEEP.yaml [--output-dir DIR] [--plan] (overrides go in the "
                          "sweep file's 'overrides')")
    spec = load_sweep(targets[0], output_dir=args.output_dir)
    runs = plan_sweep(spec)
    if args.plan:
        for r in runs:
            path = spec.output_dir / r.name
            state = run_state(RunDir.open(path)) if (path / "config.yaml").is_file() else "not started"
            print(f"{path}  {state}")
        return 0

    def train(cfg, run_dir):
        from ..trainer import Trainer

        Trainer(cfg, run_dir=run_dir, resume=run_dir is not None).run()

    print(f"sweep {spec.name}: {len(runs)} runs in {spec.output_dir}", file=sys.stderr)
    outcome = run_sweep(spec, train, echo=lambda m: print(m, file=sys.stderr))
    print(f"sweep {spec.name}: {len(outcome.finished)} trained, {len(outcome.skipped)} already finished, "
          f"{len(outcome.failed)} failed" + (", stopped by Ctrl-C" if outcome.interrupted else ""))
    for name, why in outcome.failed:
        print(f"  failed: {name}: {why}")
    if outcome.interrupted or outcome.failed:
        print(f"run `reinforge sweep {targets[0]}` again to resume")
        if outcome.interrupted:  # the exit status of the signal that stopped it (cli/exits.py)
            return stopped_code(RunDir.open(spec.output_dir / outcome.interrupted).status().get("signal"))
        return 1
    print(f"compare them with: reinforge compare {spec.output_dir}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from ..config import ConfigError
    import time

    from ..evaluation.compare import compare_runs

    paths, overrides = _split_items(args.items)
    if not paths or overrides:
        raise ConfigError("usage: reinforge compare RUN_OR_SWEEP [RUN_OR_SWEEP ...] [--out DIR]")
    out = args.out
    if out is None:
        one = Path(paths[0])
        out = (one / "compare") if len(paths) == 1 and not (one / "config.yaml").is_file() else Path(
            f"compare-{time.strftime('%Y%m%d-%H%M%S')}")
    result = compare_runs(paths, out, metric=args.metric, include_unfinished=args.include_unfinished,
                          ignore=args.ignore or (), split_tasks=args.split_tasks, n_resamples=args.resamples,
                          seed=args.seed)
    print((Path(out) / "report.md").read_text())
    print(f"report, CSV and figures in {out}")
    for p, why in result.skipped:
        print(f"left out {p}: {why}", file=sys.stderr)
    return 0


def _runs(args: argparse.Namespace) -> int:
    from ..tracking.index import find_runs, format_runs_table, run_info

    targets, _ = _split_items(args.items)
    root = Path(targets[0] if targets else "runs")
    runs = find_runs(root)
    if not runs:
        print(f"no runs under {root}")
        return 0
    print(format_runs_table([run_info(r, args.metric) for r in runs], root, args.metric))
    return 0


def _reproduce(args: argparse.Namespace) -> int:
    from ..config import ConfigError, build_config
    from ..tracking import RunDir, atomic_write_json, atomic_write_text
    from ..tracking.reproduce import compare_run_dirs, format_repro_report
    from ..tracking.segments import read_segments
    from ..trainer import Trainer

    targets, overrides = _split_items(args.items)
    if len(targets) != 1:
        raise ConfigError("usage: reinforge reproduce RUN_DIR [key=value ...]")
    original = RunDir.open(targets[0])
    if original.kind != "train":
        raise ConfigError(f"{targets[0]!r} is an eval directory; reproduce re-runs training runs")
    if original.status().get("stage") == "sft" and not (original.path / "sft").is_dir():
        raise ConfigError(f"{targets[0]!r} is a `reinforge sft` run; reproduce re-runs RL runs (run `reinforge sft "
                          f"{original.path / 'config.yaml'}` and compare the two with `reinforge compare`)")
    out_dir = Path(args.output_dir) if args.output_dir else original.path.parent / "reproductions"
    name = args.name
    if name is None:
        name, i = f"{original.name}-repro", 2
        while (out_dir / name).exists():
            name, i = f"{original.name}-repro{i}", i + 1
    # A run resumed under a changed config is replayed segment by segment: each segment's config
    # from its first step to the checkpoint the next one resumed from (segments.json).
    segments = read_segments(original)
    # Exporters off and no sweep tag: a reproduction is a check, not another seed of the experiment.
    pinned = ["tracking.exporters=[]", "tracking.sweep=null", f"tracking.output_dir={out_dir}",
              f"tracking.run_name={name}"]
    configs = [build_config(seg.config, overrides + pinned) for seg in segments]
    print(f"reproducing {original.path} as {out_dir / name}"
          + (f", replaying {len(segments)} config segments" if len(segments) > 1 else ""), file=sys.stderr)
    repro = RunDir.create(configs[0])
    repro.set_status("running", reproduces=str(original.path))  # compare leaves reproductions out
    for i, cfg in enumerate(configs):
        trainer = Trainer(cfg, run_dir=repro, resume=i > 0, new_segment=True)
        stop = segments[i + 1].from_step - 1 if i + 1 < len(segments) else None
        trainer.stop_after_step = stop
        result = trainer.run()
        if result.stopped_by:  # a signal: the run said how to resume it
            return stopped_code(result.stopped_by)
        if stop is not None and result.steps_done != stop:
            raise RuntimeError(f"replaying segment {i + 1} of {original.path} ended at step {result.steps_done}, "
                               f"not at step {stop} where the next segment resumed")
    report = compare_run_dirs(original, repro)
    md = format_repro_report(report, original, repro)
    atomic_write_text(repro.path / "reproduction.md", md)
    atomic_write_json(repro.path / "reproduction.json", {
        "original": str(original.path), "matched": report.matched, "steps_compared": report.steps_compared,
        "first_mismatch_step": report.first_mismatch_step, "ignored_keys": report.ignored_keys,
        "mismatches": [m.__dict__ for m in report.mismatches], "missing_steps": report.missing_steps,
        "extra_steps": report.extra_steps, "environment": report.environment,
        "segments_replayed": [s.from_step for s in segments], "segment_differences": report.segments,
    })
    repro.release_writer()
    print(md)
    return 0 if report.matched else 1
