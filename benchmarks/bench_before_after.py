"""The same training job at two commits, side by side in one script run: step time and whether
the two runs logged the same numbers.

Each commit is checked out into a temporary git worktree; the runs alternate between the two
(before, after, before, after, ...) in fresh subprocesses of the same venv, so drift in the
machine's speed hits both alike. For each run it reads ``metrics.jsonl`` and reports the mean step
time over the measured steps (the first ``--warmup`` steps are left out: they pay for one-off
allocation), the ratio of the two commits' median step times for each neighbouring pair of runs
(reported as the median ratio and its range), tokens/s, and whether every step's rewards, losses and generated-token counts equal
the other commit's (the same seed should give the same numbers when a change keeps behaviour).

    python benchmarks/bench_before_after.py --before f0928c7 --after HEAD configs/count_bits.yaml \\
        trainer.steps=7 --repeats 3

Overrides after the config are passed to ``reinforge train`` for both commits; evaluation and
checkpoints are switched off unless given. Results are appended to
``benchmarks/results/before_after.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import cpu_line, cpu_model, hardware_info

ROOT = Path(__file__).resolve().parents[1]
COMPARED = ("reward_mean", "reward_std", "accuracy", "loss", "pg_loss", "grad_norm", "generated_tokens",
            "completion_length", "entropy")


def _worktree(rev: str, base: Path) -> Path:
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                         text=True).stdout.strip()
    path = base / sha
    subprocess.run(["git", "worktree", "add", "--detach", "-q", str(path), sha], cwd=ROOT, check=True)
    return path


def _evals(run: Path) -> list[dict]:
    """Each held-out evaluation's step and summary numbers (empty when the run made none)."""
    path = run / "evals.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in r.items() if k not in ("time", "wall_time", "eval_time_s")} for r in rows]


def _run(tree: Path, config: str, overrides: list[str], out: Path, name: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, "-m", "reinforge.cli", "train", str(ROOT / config), *overrides,
           f"tracking.output_dir={out}", f"tracking.run_name={name}", "tracking.progress=false"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    print(f"  {name}: {len(metrics)} steps in {time.perf_counter() - t0:.0f} s", flush=True)
    EVALS[name] = _evals(out / name)
    return metrics


EVALS: dict[str, list[dict]] = {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=1)
    args = ap.parse_args()
    overrides = ["trainer.eval_every=0", "trainer.eval_at_start=false", "trainer.checkpoint_every=0", *args.overrides]
    base = Path(tempfile.mkdtemp(prefix="reinforge-before-after-"))
    trees = {}
    try:
        trees = {"before": _worktree(args.before, base), "after": _worktree(args.after, base)}
        runs: dict[str, list[list[dict]]] = {"before": [], "after": []}
        for r in range(args.repeats):
            for side in ("before", "after"):
                runs[side].append(_run(trees[side], args.config, overrides, base / "runs", f"{side}-{r}"))
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
        shutil.rmtree(base, ignore_errors=True)

    def measured(ms: list[dict]) -> list[dict]:
        return ms[args.warmup:]

    summary = {}
    for side, rs in runs.items():
        steps = [m["time_step"] for ms in rs for m in measured(ms)]
        tokens = sum(m["generated_tokens"] for ms in rs for m in measured(ms))
        summary[side] = {"step_s_mean": statistics.mean(steps), "step_s_median": statistics.median(steps),
                         "tokens_per_s": tokens / sum(steps), "runs": len(rs)}
    same = all(
        [{k: m.get(k) for k in COMPARED} for m in a] == [{k: m.get(k) for k in COMPARED} for m in b]
        for a, b in zip(runs["before"], runs["after"])
    )
    # held-out evaluations (when the overrides turn them on): every number but the timings
    same_evals = all(EVALS[f"before-{r}"] == EVALS[f"after-{r}"] for r in range(args.repeats))
    evals_made = sum(len(EVALS[f"after-{r}"]) for r in range(args.repeats))
    # One ratio per (before, after) pair of neighbouring runs: machine drift hits both alike.
    pair_ratios = [
        statistics.median(m["time_step"] for m in measured(a)) / statistics.median(m["time_step"] for m in measured(b))
        for a, b in zip(runs["after"], runs["before"])
    ]
    ratio = statistics.median(pair_ratios)
    shas = {side: tree.name for side, tree in trees.items()}  # worktrees are named by their commit
    result = {"date": time.strftime("%Y-%m-%d %H:%M"), "before": shas["before"], "after": shas["after"],
              "config": args.config, "overrides": overrides, "repeats": args.repeats, "warmup": args.warmup,
              "summary": summary, "pair_ratios_after_over_before": pair_ratios,
              "step_time_ratio_after_over_before": ratio, "identical_metrics": same,
              "identical_evals": same_evals, "evals_compared": evals_made,
              "cpu": cpu_model(), "machine": cpu_line(hardware_info()), "cores": os.cpu_count()}
    print(f"\n| commit | mean step (s) | median step (s) | tokens/s |\n|---|---|---|---|")
    for side in ("before", "after"):
        s = summary[side]
        print(f"| {side} `{shas[side]}` | {s['step_s_mean']:.2f} | {s['step_s_median']:.2f} | {s['tokens_per_s']:.1f} |")
    print(f"\nstep time after / before (median step of each pair of runs): median {ratio:.3f}, range "
          f"{min(pair_ratios):.3f}-{max(pair_ratios):.3f} over {len(pair_ratios)} pairs; "
          f"same logged numbers step by step: {same}; same held-out evaluations ({evals_made} compared): "
          f"{same_evals}; {result['machine']}")
    out = ROOT / "benchmarks" / "results" / "before_after.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps(history + [result], indent=1))


if __name__ == "__main__":
    main()
