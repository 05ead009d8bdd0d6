"""A discrete-event model of the rollout/learner pipeline: N rollout workers x M learners,
synchronous (max_staleness=0) or asynchronous with bounded staleness K, fed with measured phase
times, predicting steps/s and the async speedup.

The model is the scheduling rule of reinforge/scale/ray_source.py:

- a step needs P prompt groups; a request is ceil(P / N) prompts; a worker runs its requests one
  at a time, each taking ``gen_s * (size / P) ** gen_exponent`` times a lognormal factor of sigma
  ``gen_sigma`` (the long tail: a batch ends with its longest completion) plus ``load_s`` after a
  new weight version;
- requests are issued while in flight + waiting < (v + 1 + K - s) * P groups (v: versions
  published, s: steps gathered), so no sample is more than K versions old;
- the learner takes P groups (oldest first), trains for ``train_s / M + allreduce_s * 2(M-1)/M``,
  then publishes (``sync_s``); K = 0 is the synchronous loop with its barrier.

    python benchmarks/sim_async.py --gen-s 9.1 --train-s 5.2 --sync-s 0.4 --check benchmarks/results/async.json

With ``--check`` the phase times are read from bench_async.py's results (sync run: the worker's
busy seconds per step, the learner's prepare+update, the weight sync) and the predicted step times
for N = M = 1 are printed beside the measured ones; async runs on this 2-core machine share the
cores, so their own phase times (measured in the async runs) are used for their prediction.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
from dataclasses import dataclass


@dataclass
class Phases:
    gen_s: float            # one worker generating + scoring one step's P prompts
    train_s: float          # one learner: prepare + update for one step
    sync_s: float = 0.0     # learner side: state dict + object store put, per version
    load_s: float = 0.0     # worker side: loading a new version
    gen_sigma: float = 0.0  # lognormal sigma of a request's time (long tail)
    gen_exponent: float = 1.0  # request time ~ size**exponent (1: CPU-like; < 1: a GPU batching)
    allreduce_s: float = 0.0   # gradient all-reduce of the whole model across learners


def simulate(ph: Phases, *, workers: int, learners: int, staleness: int, prompts: int = 8,
             steps: int = 200, seed: int = 0) -> dict[str, float]:
    """Steps/s, mean staleness and busy fractions over ``steps`` steps (the first 10% left out)."""
    rng = random.Random(seed)
    size = math.ceil(prompts / workers)
    train = ph.train_s / learners + ph.allreduce_s * 2 * (learners - 1) / learners

    def gen_time() -> float:
        t = ph.gen_s * (size / prompts) ** ph.gen_exponent
        return t * (rng.lognormvariate(-ph.gen_sigma ** 2 / 2, ph.gen_sigma) if ph.gen_sigma else 1.0)

    now = 0.0
    version = 0         # versions published
    gathered = 0        # steps gathered
    queue: list[tuple[int, int, int]] = []  # (issue version, seq, groups) waiting for the learner
    free_at = [0.0] * workers              # when each worker finishes what it has
    worker_version = [0] * workers
    pending: list[tuple[float, int, int, int]] = []  # (finish time, seq, groups, issue version)
    started: dict[int, float] = {}          # request seq -> start time
    publish_times: list[float] = []
    seq = itertools.count()
    busy = [0.0] * workers
    learner_busy = 0.0
    step_ends: list[float] = []
    stale: list[int] = []

    def outstanding() -> int:
        return sum(g for _, _, g, _ in pending) + sum(g for _, _, g in queue)

    def top_up(t: float) -> None:
        while outstanding() < (version + 1 + staleness - gathered) * prompts:
            w = min(range(workers), key=lambda i: free_at[i])
            start = max(free_at[w], t)
            d = gen_time() + (ph.load_s if worker_version[w] < version else 0.0)
            worker_version[w] = version
            free_at[w] = start + d
            busy[w] += d
            k = next(seq)
            started[k] = start
            heapq.heappush(pending, (start + d, k, size, version))

    for step in range(1, steps + 1):
        gathered = step - 1
        top_up(now)
        got = 0
        while got < prompts:
            queue.sort()
            while queue and got < prompts:
                v, k, g = queue.pop(0)
                if step - 1 - v > staleness:
                    continue  # dropped, as the source does (judged on the issue version: cautious)
                take = min(g, prompts - got)
                if g > take:
                    queue.insert(0, (v, k, g - take))
                got += take
                stale.extend([(step - 1, k)] * take)
            if got >= prompts:
                break
            t, k, g, v = heapq.heappop(pending)
            now = max(now, t)
            queue.append((v, k, g))
        gathered = step
        top_up(now)
        now += train + ph.sync_s
        learner_busy += train + ph.sync_s
        version = step
        publish_times.append(now)
        top_up(now)
        step_ends.append(now)
    # A sample's version is the one its worker had when it started the request (weights reach a
    # worker between requests): the publishes up to that time.
    staleness_of = [learner - sum(1 for p in publish_times if p <= started[k]) for learner, k in stale]
    skip = steps // 10
    span = step_ends[-1] - step_ends[skip - 1] if skip else step_ends[-1]
    return {
        "steps_per_s": (steps - skip) / span,
        "step_s": span / (steps - skip),
        "staleness_mean": sum(staleness_of) / len(staleness_of),
        "worker_busy_frac": min(1.0, sum(busy) / workers / step_ends[-1]),
        "learner_busy_frac": learner_busy / step_ends[-1],
    }


def _from_bench(path: str) -> dict:
    data = json.load(open(path))
    res = data["results"]
    out = {}
    for name, r in res.items():
        out[name] = {
            "measured_step_s": r["step_s"],
            "phases": Phases(gen_s=r["worker_busy_s_per_step"], train_s=r["train_s"],
                             sync_s=r["weight_sync_s"]),
            "staleness": {"sync": 0, "sync1": 0, "async1": 1, "async2": 2}[name],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gen-s", type=float, default=None)
    ap.add_argument("--train-s", type=float, default=None)
    ap.add_argument("--sync-s", type=float, default=0.0)
    ap.add_argument("--load-s", type=float, default=0.0)
    ap.add_argument("--gen-sigma", type=float, default=0.0)
    ap.add_argument("--gen-exponent", type=float, default=1.0)
    ap.add_argument("--allreduce-s", type=float, default=0.0)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--check", default=None, help="bench_async.py results JSON to calibrate and check against")
    ap.add_argument("--workers", type=int, nargs="*", default=[1, 2, 4, 8, 16])
    ap.add_argument("--learners", type=int, nargs="*", default=[1, 2, 4])
    args = ap.parse_args()
    base = None
    if args.check:
        runs = _from_bench(args.check)
        print("check against bench_async.py (N = M = 1):")
        print(f"{'variant':8} {'measured step s':>16} {'predicted step s':>17} {'pred/meas':>10}")
        for name, r in runs.items():
            pred = simulate(r["phases"], workers=1, learners=1, staleness=r["staleness"], prompts=args.prompts)
            print(f"{name:8} {r['measured_step_s']:16.2f} {pred['step_s']:17.2f} "
                  f"{pred['step_s'] / r['measured_step_s']:10.2f}")
        base = runs["sync" if "sync" in runs else "sync1"]["phases"]
    if args.gen_s is not None:
        base = Phases(args.gen_s, args.train_s, args.sync_s, args.load_s, args.gen_sigma, args.gen_exponent,
                      args.allreduce_s)
    if base is None:
        ap.error("give --gen-s/--train-s or --check")
    base.gen_sigma, base.gen_exponent, base.allreduce_s = args.gen_sigma, args.gen_exponent, args.allreduce_s
    base.load_s = args.load_s or base.load_s
    print(f"\nphases: gen {base.gen_s:.2f} s/step on one worker, train {base.train_s:.2f} s/step on one "
          f"learner, sync {base.sync_s:.2f} s, tail sigma {base.gen_sigma}, exponent {base.gen_exponent}")
    print(f"{'N workers':>9} {'M learners':>10} {'sync steps/s':>13} {'K=1 speedup':>12} {'K=2 speedup':>12} "
          f"{'K=2 staleness':>14}")
    for n in args.workers:
        for m in args.learners:
            s0 = simulate(base, workers=n, learners=m, staleness=0, prompts=args.prompts)
            s1 = simulate(base, workers=n, learners=m, staleness=1, prompts=args.prompts)
            s2 = simulate(base, workers=n, learners=m, staleness=2, prompts=args.prompts)
            print(f"{n:9d} {m:10d} {s0['steps_per_s']:13.3f} {s1['steps_per_s'] / s0['steps_per_s']:12.2f} "
                  f"{s2['steps_per_s'] / s0['steps_per_s']:12.2f} {s2['staleness_mean']:14.2f}")


if __name__ == "__main__":
    main()
