"""One learner process vs ``scale.learners=N`` data-parallel ranks, alternated on this machine.

Each variant is a fresh `reinforge train` subprocess; the variants alternate (A B A B ...) so that
drift in the machine's speed hits both, and the learner's time per step (log-prob forwards plus
the update: ``time_prepare + time_update``) of each data-parallel run is reported as its ratio to
the single-process run of the same round (median and range). The runs' losses are compared too:
data parallelism must not change what is learned.

    python benchmarks/bench_dp.py configs/main.yaml trainer.steps=4 --repeats 3

Threads: the single process gets ``--threads`` (default: every core), each of the N ranks
``--threads // N``, so both use the same cores. Results: benchmarks/results/dp.json.
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


def _run(config: str, overrides: list[str], out: Path, name: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = ["/usr/bin/time", "-f", "%M", sys.executable, "-m", "reinforge.cli", "train", str(ROOT / config),
           *overrides, f"tracking.output_dir={out}", f"tracking.run_name={name}", "tracking.progress=false"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    metrics = [json.loads(x) for x in (out / name / "metrics.jsonl").read_text().splitlines() if x.strip()]
    print(f"  {name}: {len(metrics)} steps, {wall:.0f} s", flush=True)
    # /usr/bin/time measures the trainer (rank 0) only; the other ranks are its children
    return {"metrics": metrics, "wall_s": wall, "rank0_peak_rss_gb": int(proc.stderr.split()[-1]) / 2**20}


def _summary(res: dict, warmup: int) -> dict:
    m = res["metrics"][warmup:]
    return {
        "learner_s": statistics.mean(x["time_prepare"] + x["time_update"] for x in m),
        "update_s": statistics.mean(x["time_update"] for x in m),
        "step_s": statistics.mean(x["time_step"] for x in m),
        "rank0_peak_rss_gb": res["rank0_peak_rss_gb"],
        "loss": [x["loss"] for x in res["metrics"]],
        "reward_mean": [x["reward_mean"] for x in res["metrics"]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--learners", type=int, default=2)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    n = args.learners
    variants = {
        "one": ["scale.learners=1", f"trainer.num_threads={args.threads}"],
        f"dp{n}": [f"scale.learners={n}", f"trainer.num_threads={max(args.threads // n, 1)}"],
    }
    overrides = ["trainer.eval_at_start=false", "trainer.eval_every=0", "trainer.checkpoint_every=0",
                 *args.overrides]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-dp-") as tmp:
        for r in range(args.repeats):
            print(f"round {r + 1}/{args.repeats}", flush=True)
            rounds.append({name: _summary(_run(args.config, [*overrides, *extra], Path(tmp), f"{name}-{r}"),
                                          args.warmup) for name, extra in variants.items()})
    ratios = [rd[f"dp{n}"]["learner_s"] / rd["one"]["learner_s"] for rd in rounds]
    loss_diff = max(abs(a - b) for rd in rounds for a, b in zip(rd["one"]["loss"], rd[f"dp{n}"]["loss"]))
    table = {name: {k: statistics.median(rd[name][k] for rd in rounds)
                    for k in ("learner_s", "update_s", "step_s", "rank0_peak_rss_gb")} for name in variants}
    table[f"dp{n}"]["learner_time_ratio_to_one"] = {"median": statistics.median(ratios), "min": min(ratios),
                                                    "max": max(ratios)}
    table["max_abs_loss_difference"] = loss_diff
    record = {"machine": cpu_model(), "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "results": table, "rounds": rounds}
    out = ROOT / "benchmarks" / "results" / "dp.json"
    out.write_text(json.dumps(record, indent=1))
    print(json.dumps(table, indent=1))


if __name__ == "__main__":
    main()
