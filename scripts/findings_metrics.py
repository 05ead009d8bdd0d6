"""Training-side measurements of a findings sweep (configs/sweep_findings.yaml): what `reinforge
compare` does not show because it reads held-out evaluations only.

Per run, from metrics.jsonl:
- entropy: the policy's mean token entropy on its samples, early (first third of the steps) and
  late (last third) (DAPO's clip-higher claim, Cui et al. 2025's entropy collapse);
- length of wrong completions, early and late, and its change (Dr. GRPO's length-bias claim);
- the share of groups whose rewards all agree, as rolled out (curriculum/zero_variance_frac) and as
  reaching the update (uniform_group_frac), and samples generated per step (DAPO's dynamic sampling);
- compute (configs/sweep_curriculum.yaml): prompts a curriculum skipped per step, generated tokens,
  tokens that reached the update and wall time summed over the steps, and generated tokens per point of held-out accuracy gained
  (evals.jsonl: last evaluation minus the step-0 one; n/a when nothing was gained).

Per arm (runs named <arm>-seed<k>): the mean over seeds, each seed's value, and the difference to
the baseline arm with a 95% bootstrap interval over seeds (unpaired: arms resample their own seeds;
with three seeds per arm the interval is wide, which is the point of printing it). Writes
findings_metrics.md and findings_curves.png into <sweep dir>/compare/.

    python scripts/findings_metrics.py runs/sweeps/findings [--baseline grpo]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CURVES = (("entropy", "token entropy"), ("completion_length_incorrect", "length of wrong completions (tokens)"),
          ("curriculum/zero_variance_frac", "groups with all-equal rewards, rolled out"),
          ("accuracy", "training accuracy"))


def _read(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _window(rows: list[dict], key: str, part: str) -> float:
    vals = [r[key] for r in rows if key in r]
    if not vals:
        return float("nan")
    k = max(1, len(vals) // 3)
    return float(np.mean(vals[:k] if part == "early" else vals[-k:]))


def _gain(run: Path) -> float:
    path = run / "evals.jsonl"
    evals = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    evals = [e for e in evals if "accuracy" in e]
    return float(evals[-1]["accuracy"] - evals[0]["accuracy"]) if len(evals) >= 2 else float("nan")


def run_measures(rows: list[dict], run: Path) -> dict[str, float]:
    m = {
        "entropy_early": _window(rows, "entropy", "early"),
        "entropy_late": _window(rows, "entropy", "late"),
        "wrong_len_early": _window(rows, "completion_length_incorrect", "early"),
        "wrong_len_late": _window(rows, "completion_length_incorrect", "late"),
        "zero_var_rolled_out": float(np.mean([r.get("curriculum/zero_variance_frac", r["uniform_group_frac"]) for r in rows])),
        "zero_var_in_update": float(np.mean([r["uniform_group_frac"] for r in rows])),
        "samples_per_step": float(np.mean([r.get("curriculum/samples_spent", np.nan) for r in rows])),
        "prompts_skipped_per_step": float(np.mean([r.get("curriculum/prompts_skipped", 0.0) for r in rows])),
        "generated_tokens": float(sum(r.get("sampled_tokens", r.get("generated_tokens", 0.0)) for r in rows)),
        # the tokens of the rows that reached the update (a curriculum drops all-equal groups)
        "trained_tokens": float(sum(r.get("generated_tokens", 0.0) for r in rows)),
        "wall_time_s": float(sum(r.get("time_step", 0.0) for r in rows)),
        "heldout_gain": _gain(run),
    }
    gain = m["heldout_gain"]
    # per point (0.01) of held-out accuracy; undefined when the run gained nothing
    m["tokens_per_point_gained"] = m["generated_tokens"] / (100 * gain) if gain > 0 else float("nan")
    m["wrong_len_change"] = m["wrong_len_late"] - m["wrong_len_early"]
    m["entropy_change"] = m["entropy_late"] - m["entropy_early"]
    return m


def diff_interval(a: list[float], b: list[float], n: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """mean(a) - mean(b) and a 95% percentile bootstrap interval, each arm resampling its own runs."""
    a_, b_ = np.asarray(a, float), np.asarray(b, float)
    rng = np.random.default_rng(seed)
    da = a_[rng.integers(0, len(a_), (n, len(a_)))].mean(axis=1)
    db = b_[rng.integers(0, len(b_), (n, len(b_)))].mean(axis=1)
    d = da - db
    return float(a_.mean() - b_.mean()), float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("--baseline", default="grpo")
    ap.add_argument("--include-unfinished", action="store_true", help="also use runs that did not finish")
    args = ap.parse_args()
    arms: dict[str, dict[str, list]] = defaultdict(lambda: {"seeds": [], "rows": [], "runs": []})
    for run in sorted(p for p in args.sweep_dir.iterdir() if (p / "metrics.jsonl").is_file()):
        match = re.fullmatch(r"(.+)-seed(\d+)", run.name)
        if not match:
            continue
        state = json.loads((run / "status.json").read_text()).get("state") if (run / "status.json").is_file() else None
        if state != "finished" and not args.include_unfinished:
            print(f"skipping {run.name}: {state or 'no status'} (--include-unfinished uses it)", file=sys.stderr)
            continue
        arms[match[1]]["seeds"].append(int(match[2]))
        arms[match[1]]["rows"].append(_read(run))
        arms[match[1]]["runs"].append(run)
    if args.baseline not in arms:
        raise SystemExit(f"no runs of the baseline arm {args.baseline!r} in {args.sweep_dir} (arms: {sorted(arms)})")
    measures = {arm: [run_measures(rows, run) for rows, run in zip(d["rows"], d["runs"])] for arm, d in arms.items()}
    keys = list(next(iter(measures.values()))[0])
    lines = [f"# Training-side measures of `{args.sweep_dir}`", "",
             f"Per arm: mean over seeds (each seed's value); difference to `{args.baseline}` with a 95% "
             "bootstrap interval over seeds. Early/late: the mean over the first/last third of the steps.", ""]
    for key in keys:
        lines += [f"## {key}", "", "| arm | seeds | mean (per seed) | minus baseline [95% interval] |", "|---|---|---|---|"]
        base = [m[key] for m in measures[args.baseline]]
        for arm, ms in measures.items():
            vals = [m[key] for m in ms]
            per_seed = ", ".join(f"{v:.3f}" for v in vals)
            if arm == args.baseline or not all(np.isfinite(vals + base)):
                diff = "" if arm == args.baseline else "n/a"
            else:
                d, lo, hi = diff_interval(vals, base)
                diff = f"{d:+.3f} [{lo:+.3f}, {hi:+.3f}]"
            lines.append(f"| {arm} | {len(vals)} | {np.mean(vals):.3f} ({per_seed}) | {diff} |")
        lines.append("")
    out = args.sweep_dir / "compare"
    out.mkdir(exist_ok=True)
    (out / "findings_metrics.md").write_text("\n".join(lines))
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(4.2 * len(CURVES), 3.4))
    for ax, (key, title) in zip(axes, CURVES):
        for i, (arm, d) in enumerate(sorted(arms.items())):
            color = f"C{i}"
            curves = []
            for rows in d["rows"]:
                xs = [r["step"] for r in rows if key in r]
                ys = [r[key] for r in rows if key in r]
                ax.plot(xs, ys, color=color, alpha=0.25, lw=0.8)
                curves.append(dict(zip(xs, ys)))
            steps = sorted(set().union(*curves))
            ax.plot(steps, [np.mean([c[s] for c in curves if s in c]) for s in steps], color=color, lw=2, label=arm)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "findings_curves.png", dpi=110)
    print(f"written to {out / 'findings_metrics.md'} and {out / 'findings_curves.png'}")


if __name__ == "__main__":
    main()
