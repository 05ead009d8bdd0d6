"""What each recipe costs: the same RL step configuration under every recipe, side by side.

Every recipe adds or removes work: a reference forward pass (KL), a critic forward and backward
(PPO), greedy samples (ReMax), extra generation rounds (DAPO's dynamic sampling), an old-policy
forward and several optimiser steps (mini-batches). This script runs a few steps of each recipe on
the same model, task, prompts and sizes, each in a fresh subprocess (so peak RSS is its own), and
reports seconds per step, its generation share, peak RSS and the ratio to `grpo`.

    python benchmarks/bench_recipes.py                       # SmolLM2-135M, 4 prompts x 4 x 32, 3 steps
    python benchmarks/bench_recipes.py --model tiny --steps 2   # quick check

The first step of each run is a warm-up and is not measured. Results are appended to
benchmarks/results/recipes.json and printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GB = 1024**3


def _worker(args: argparse.Namespace) -> None:
    import resource

    import torch

    from reinforge.config import build_config
    from reinforge.tracking import RunDir
    from reinforge.trainer import Trainer

    overrides = [
        f"recipe={args.worker}", f"model.path={args.model_path}", f"model.dtype={args.dtype}",
        "task.name=count_bits", "task.options={min_n: 1, max_n: 1023}", "task.eval_size=20",
        "reward.verifiers=[{name: exact_match}]",
        f"trainer.prompts_per_step={args.prompts}", f"rollout.num_samples={args.samples}",
        f"rollout.max_new_tokens={args.max_new_tokens}", f"trainer.steps={args.steps}",
        "trainer.eval_every=0", "trainer.eval_at_start=false", "trainer.checkpoint_every=0",
        "trainer.seed=0", f"tracking.output_dir={args.out_dir}", "tracking.progress=false",
    ]
    if args.worker == "gspo" and args.prompts < 4:
        overrides.append(f"algorithm.mini_batches={args.prompts}")
    torch.set_num_threads(os.cpu_count() or 1)
    result = Trainer(build_config({}, overrides)).run()
    metrics = RunDir.open(result.run_dir).read_metrics()[1:]  # the first step is a warm-up
    out = {
        "recipe": args.worker,
        "step_s": sum(m["time_step"] for m in metrics) / len(metrics),
        "generate_s": sum(m["time_collect"] for m in metrics) / len(metrics),
        "tokens": sum(m["generated_tokens"] for m in metrics) / len(metrics),
        "sampling_rounds": sum(m.get("sampling_rounds", 1.0) for m in metrics) / len(metrics),
        "ru_maxrss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB,
    }
    print("RESULT " + json.dumps(out), flush=True)


def _model_path(name: str, tmp: Path) -> str:
    if name != "tiny":
        return name
    code = (
        "import sys; sys.path.insert(0, 'tests'); from conftest import make_model, make_tokenizer; "
        f"t = make_tokenizer(); make_model(t).save_pretrained('{tmp}/tiny'); t.save_pretrained('{tmp}/tiny')"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    return str(tmp / "tiny")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="'tiny', the default model, or a path")
    ap.add_argument("--recipes", default=None, help="comma-separated (default: all)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3, help="steps per recipe; the first is not measured")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model-path", help=argparse.SUPPRESS)
    ap.add_argument("--out-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args)
        return

    from reinforge.recipes import RECIPES

    names = args.recipes.split(",") if args.recipes else ["grpo"] + sorted(set(RECIPES) - {"grpo"})
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model_path = _model_path(args.model, Path(tmp))
        for name in names:
            cmd = [sys.executable, __file__, "--worker", name, "--model-path", model_path, "--out-dir", f"{tmp}/runs",
                   "--prompts", str(args.prompts), "--samples", str(args.samples),
                   "--max-new-tokens", str(args.max_new_tokens), "--steps", str(args.steps), "--dtype", args.dtype]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if line is None:
                rows.append({"recipe": name, "error": (proc.stderr or proc.stdout)[-500:]})
                print(f"{name}: failed\n{rows[-1]['error']}", file=sys.stderr)
                continue
            rows.append(json.loads(line[len("RESULT "):]))
            print(f"{name}: {rows[-1]['step_s']:.1f} s/step", file=sys.stderr)
    base = next((r for r in rows if r["recipe"] == "grpo" and "error" not in r), None)
    print(f"\n{args.prompts} prompts x {args.samples} samples x {args.max_new_tokens} new tokens, "
          f"{args.dtype}, model {args.model}, mean of {args.steps - 1} measured steps\n")
    print("| recipe | s/step | vs grpo | generation share | tokens/step | sampling rounds | peak RSS GB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['recipe']} | failed | | | | | |")
            continue
        ratio = f"{r['step_s'] / base['step_s']:.2f}x" if base else "-"
        print(f"| {r['recipe']} | {r['step_s']:.1f} | {ratio} | {r['generate_s'] / r['step_s']:.0%} | "
              f"{r['tokens']:.0f} | {r['sampling_rounds']:.1f} | {r['ru_maxrss_gb']:.2f} |")
    record = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "machine": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "args": {k: v for k, v in vars(args).items() if v is not None}, "rows": rows}
    out = HERE / "results" / "recipes.json"
    out.parent.mkdir(exist_ok=True)
    history = json.loads(out.read_text()) if out.exists() else []
    out.write_text(json.dumps(history + [record], indent=1))


if __name__ == "__main__":
    main()
