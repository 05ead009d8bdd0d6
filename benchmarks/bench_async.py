"""Synchronous vs asynchronous RL (bounded staleness) with one Ray rollout worker and one learner,
side by side on this machine: end-to-end tokens/s, busy fraction of each actor, and the held-out
accuracy reached.

The variants alternate (sync, async K=1, async K=2, sync, ...) in fresh `reinforge train`
subprocesses, so drift in the machine's speed hits all alike; each async variant's tokens/s is
reported as its ratio to the sync run of the same round (median and range over rounds).

    python benchmarks/bench_async.py configs/count_bits.yaml trainer.steps=6 --repeats 3

Sync runs the worker and the learner with all cores each (they take turns); async gives each one
core (`--async-threads`), since they run at the same time; `sync1` is sync with async's threads, so
its ratio is the pipeline's overlap alone (`--only sync1 async1 async2 --baseline sync1`). The first ``--warmup`` steps are left
out of the rates (they include filling the pipeline). Results: benchmarks/results/async.json;
the phase times it prints feed benchmarks/sim_async.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import cpu_model

ROOT = Path(__file__).resolve().parents[1]


def _variants(async_threads: int) -> dict[str, list[str]]:
    ray = ["scale.mode=ray", "scale.rollout_workers=1"]
    par = [f"scale.worker_threads={async_threads}", f"trainer.num_threads={async_threads}"]
    return {
        "sync": [*ray, "algorithm.max_staleness=0"],
        # The same threads as async: separates the pipeline's overlap from the thread count.
        "sync1": [*ray, "algorithm.max_staleness=0", *par],
        "async1": [*ray, "algorithm.max_staleness=1", *par],
        "async2": [*ray, "algorithm.max_staleness=2", *par],
        # PipelineRL's in-flight weight updates on top of K=1
        "async1p": [*ray, "algorithm.max_staleness=1", "rollout.partial=true", *par],
    }


def _run(config: str, overrides: list[str], out: Path, name: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "reinforge.cli", "train", str(ROOT / config), *overrides,
           f"tracking.output_dir={out}", f"tracking.run_name={name}", "tracking.progress=false"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    run = out / name
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    evals = [json.loads(x) for x in (run / "evals.jsonl").read_text().splitlines() if x.strip()]
    scale = json.loads((run / "scale.json").read_text())
    print(f"  {name}: {len(metrics)} steps, {wall:.0f} s", flush=True)
    return {"metrics": metrics, "evals": evals, "scale": scale, "wall_s": wall}


def _summary(res: dict, warmup: int) -> dict:
    m = res["metrics"][warmup:]
    step_s = sum(x["time_step"] for x in m)
    tokens = sum(x["generated_tokens"] for x in m)
    last_eval = res["evals"][-1] if res["evals"] else {}
    return {
        "tokens_per_s": tokens / step_s,
        "step_s": step_s / len(m),
        "learner_wait_s": statistics.mean(x.get("time_collect", 0.0) for x in m),
        "train_s": statistics.mean(x.get("time_prepare", 0.0) + x.get("time_update", 0.0) for x in m),
        "weight_sync_s": statistics.mean(x.get("weight_sync_s", 0.0) for x in m),
        "staleness_mean": statistics.mean(x.get("staleness_mean", 0.0) for x in m),
        "logprob_diff_mean": statistics.mean(x.get("logprob_diff_mean", float("nan")) for x in m),
        "worker_busy_frac": res["scale"]["workers"][0]["busy_frac"],
        "worker_busy_s_per_step": res["scale"]["workers"][0]["busy_s"] / len(res["metrics"]),
        "learner_busy_frac": res["scale"]["learner_busy_frac"],
        "heldout_accuracy": last_eval.get("accuracy"),
        # (step, accuracy, seconds of training so far): learning per sample and per second.
        "heldout_curve": [(e["step"], e.get("accuracy"),
                           sum(x["time_step"] for x in res["metrics"] if x["step"] <= e["step"]))
                          for e in res["evals"]],
        "train_wall_s": sum(x["time_step"] for x in res["metrics"]),
        "staleness_histogram": res["scale"]["staleness_histogram"],
        "stale_dropped_groups": res["scale"]["stale_dropped_groups"],
        # rollout.partial: rows with tokens from weights loaded mid-generation, and those loads
        "partial_rows_frac": statistics.mean(x.get("partial_rows_frac", 0.0) for x in m),
        "inflight_weight_loads": sum(x.get("inflight_weight_loads", 0.0) for x in res["metrics"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--async-threads", type=int, default=1)
    ap.add_argument("--only", nargs="*", default=None, help="variants to run (default: all)")
    ap.add_argument("--out", default=None, help="file name under benchmarks/results (default async.json)")
    ap.add_argument("--baseline", default="sync", help="the variant the others' tokens/s are divided by")
    args = ap.parse_args()
    variants = _variants(args.async_threads)
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only}
    overrides = ["trainer.eval_at_start=false", "trainer.checkpoint_every=0", *args.overrides]
    rounds: list[dict[str, dict]] = []
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        for r in range(args.repeats):
            print(f"round {r + 1}/{args.repeats}", flush=True)
            rounds.append({name: _summary(_run(args.config, [*overrides, *extra], Path(tmp), f"{name}-{r}"),
                                          args.warmup) for name, extra in variants.items()})
    table = {}
    for name in variants:
        rows = [rd[name] for rd in rounds]
        entry = {k: statistics.median(x[k] for x in rows) for k in rows[0]
                 if isinstance(rows[0][k], (int, float)) and rows[0][k] is not None}
        if name != args.baseline and args.baseline in variants:
            ratios = [rd[name]["tokens_per_s"] / rd[args.baseline]["tokens_per_s"] for rd in rounds]
            entry[f"tokens_per_s_ratio_to_{args.baseline}"] = {"median": statistics.median(ratios), "min": min(ratios),
                                                   "max": max(ratios)}
        entry["heldout_accuracy_each"] = [x["heldout_accuracy"] for x in rows]
        entry["staleness_histogram_first"] = rows[0]["staleness_histogram"]
        table[name] = entry
    record = {"machine": cpu_model(), "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "results": table, "rounds": rounds}
    out = ROOT / "benchmarks" / "results" / (args.out or "async.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(record, indent=1))
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
