"""What isolating scorers and per-test processes cost: scoring throughput and the trainer's step
time, this tree side by side with another checkout (e.g. the commit before the change), in one
script run.

    git worktree add /tmp/before f0928c7
    python benchmarks/bench_scoring.py --before /tmp/before [--rounds 2]

For each tree, a child process (PYTHONPATH = that tree) measures, through the public API both
trees share (build_reward, Trainer):
- task scoring: RewardFunction with the `task` verifier on reasoning-gym answers (half right,
  half wrong), samples/s, warm (the first call, which starts this tree's scoring workers, is not
  timed): `leg_counting` (a plain scorer) and `polynomial_multiplication` (sympy's parse_expr);
- code scoring: the `code` verifier on a 6-test function problem and a 4-test stdin/stdout
  problem, completions/s (distinct programs, so de-duplication does not help);
- a training step: a tiny random model (2 layers, 64 wide, built in code) for 4 steps of 8
  completions on the bundled code task and on leg_counting; the mean step time of steps 2-4 and
  the time spent in the reward function per step.
Trees run alternately for --rounds rounds; the table shows each tree's median.

Prints a Markdown table and appends the raw numbers to benchmarks/results/scoring.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import cpu_line, cpu_model, hardware_info

ROOT = Path(__file__).resolve().parents[1]

FUNCTION_PROBLEM = {
    "id": "sum_list", "entry_point": "sum_list",
    "tests": [{"args": [list(range(n))], "expected": n * (n - 1) // 2} for n in (0, 1, 5, 10, 100, 1000)]}
FUNCTION_SOLUTION = "```python\n# {i}\ndef sum_list(xs):\n    return sum(xs)\n```"
STDIO_PROBLEM = {"id": "shout", "tests": [{"stdin": f"line {k}\n", "stdout": f"LINE {k}\n"} for k in range(4)]}
STDIO_SOLUTION = "```python\n# {i}\nprint(input().upper())\n```"


def _child(args) -> dict:
    """Runs in a child whose PYTHONPATH is the tree under test."""
    import torch

    from reinforge.config import build_config
    from reinforge.rewards import build_reward
    from reinforge.tasks import Example, build_task

    torch.set_num_threads(1)
    out: dict = {}

    def rate(fn, n: int, repeats: int = 3) -> float:
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return n / statistics.median(times)

    for name in ("leg_counting", "polynomial_multiplication"):
        cfg = build_config({"task": {"name": name, "train_size": 64, "eval_size": 4},
                            "reward": {"verifiers": [{"name": "task"}]}})
        task = build_task(cfg.task)
        fn = build_reward(cfg.reward, task)
        examples = [task.train_examples()[i % 64] for i in range(args.samples)]
        completions = [f"<answer>{e.answer if i % 2 else 'wrong'}</answer>" for i, e in enumerate(examples)]
        fn(completions[:8], examples[:8])  # warm: workers started, datasets built
        out[f"task_{name}_per_s"] = rate(lambda: fn(completions, examples), len(completions))
        scores = [o.reward for o in fn(completions, examples)]
        assert sum(scores) >= args.samples // 2, name  # the right half scores

    for label, problem, solution, n in (("function6", FUNCTION_PROBLEM, FUNCTION_SOLUTION, args.completions),
                                        ("stdio4", STDIO_PROBLEM, STDIO_SOLUTION, args.completions)):
        cfg = build_config({"task": {"source": "code", "name": "basic", "eval_size": 5},
                            "reward": {"verifiers": [{"name": "code", "options": {"timeout_s": 5.0}}]}})
        fn = build_reward(cfg.reward, build_task(cfg.task))
        ex = Example("bench", [], None, problem)
        completions = [solution.format(i=i) for i in range(n)]
        fn(completions[:2], [ex] * 2)
        out[f"code_{label}_per_s"] = rate(lambda: fn(completions, [ex] * n), n, repeats=2)
        assert all(o.reward == 1.0 for o in fn(completions[:4], [ex] * 4)), label

    import reinforge.trainer.trainer as trainer_module
    from reinforge.trainer import Trainer

    real_build_reward = trainer_module.build_reward

    for label, overrides in (("code", ["task.source=code", "task.name=basic", "task.eval_size=2",
                                       "task.train_size=40",
                                       "reward.verifiers=[{name: code, options: {timeout_s: 2.0, partial_credit: true}}]"]),
                             ("leg_counting", ["task.name=leg_counting", "task.train_size=64", "task.eval_size=4"])):
        with tempfile.TemporaryDirectory() as runs:
            cfg = build_config({}, [
                f"model.path={args.model}", *overrides,
                "rollout.num_samples=4", "rollout.max_new_tokens=48", "trainer.prompts_per_step=2",
                f"trainer.steps={args.steps}", "trainer.eval_every=0", "trainer.eval_at_start=false",
                "trainer.checkpoint_every=0", f"tracking.output_dir={runs}", "tracking.progress=false",
                "trainer.seed=0",
            ])
            spent: list[float] = []

            def timed_build_reward(*a, **k):  # the trainer's reward function, timed (both trees)
                reward_fn = real_build_reward(*a, **k)

                class Timed:
                    def __getattr__(self, name):
                        return getattr(reward_fn, name)

                    def __call__(self, *a, **k):
                        return self._timed(reward_fn, *a, **k)

                    def score(self, *a, **k):  # what the experience source calls
                        return self._timed(reward_fn.score, *a, **k)

                    def _timed(self, fn, *a, **k):
                        t = time.perf_counter()
                        try:
                            return fn(*a, **k)
                        finally:
                            spent.append(time.perf_counter() - t)

                return Timed()

            trainer_module.build_reward = timed_build_reward
            trainer = Trainer(cfg)
            result = trainer.run()
            from reinforge.tracking import RunDir

            metrics = RunDir.open(result.run_dir).read_metrics()
            steps = [m["time_step"] for m in metrics][1:]
            out[f"step_{label}_s"] = statistics.fmean(steps)
            out[f"step_{label}_reward_s"] = statistics.fmean(spent[1:])
            out[f"step_{label}_errors"] = sum(m["reward_errors"] for m in metrics)
    return out


def _make_model(path: Path) -> None:
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import save_tiny_model

    save_tiny_model(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=False, help="a checkout to compare with (e.g. a worktree of the previous commit)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per tree")
    ap.add_argument("--samples", type=int, default=256, help="answers per task-scoring batch")
    ap.add_argument("--completions", type=int, default=32, help="programs per code-scoring batch")
    ap.add_argument("--steps", type=int, default=4, help="training steps per run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(_child(args)))
        return
    trees = {"before": Path(args.before).resolve()} if args.before else {}
    trees["after"] = ROOT
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny-model"
        _make_model(model)
        raw: dict[str, list[dict]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                env = {**os.environ, "PYTHONPATH": str(tree)}
                cmd = [sys.executable, str(Path(__file__).resolve()), "--child", f"--model={model}",
                       f"--samples={args.samples}", f"--completions={args.completions}",
                       f"--steps={args.steps}"]
                proc = subprocess.run(cmd, env=env, cwd=tmp, capture_output=True, text=True)
                line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
                if proc.returncode != 0 or line is None:
                    sys.exit(f"{name} ({tree}) failed:\n{proc.stderr[-3000:]}")
                raw[name].append(json.loads(line[len("RESULT "):]))
    med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]} for name, runs in raw.items()}
    # Each round ran before then after back to back: the ratio within a round cancels the
    # machine's drift between rounds.
    ratios = {}
    if "before" in raw:
        for k in raw["after"][0]:
            pairs = [a[k] / b[k] for a, b in zip(raw["after"], raw["before"]) if b[k]]
            if pairs:
                ratios[k] = (statistics.median(pairs), min(pairs), max(pairs))
    hw = hardware_info()
    record = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpu": cpu_model(), "cpus": os.cpu_count(), "kernel": platform.release(),
                    "python": platform.python_version(), "euid": os.geteuid(), "describe": cpu_line(hw),
                    "capability": hw.get("capability")},
        "ratios_after_over_before": ratios,
        "trees": {k: str(v) for k, v in trees.items()}, "args": vars(args), "raw": raw, "median": med,
    }
    out = ROOT / "benchmarks" / "results" / "scoring.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(out.read_text()) if out.exists() else []
    history.append(record)
    tmp_out = out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(history, indent=2))
    tmp_out.replace(out)

    rows = [  # label, key, format, scale
        ("task verifier, leg_counting, samples/s", "task_leg_counting_per_s", "{:.0f}", 1),
        ("task verifier, polynomial_multiplication (sympy), samples/s", "task_polynomial_multiplication_per_s", "{:.0f}", 1),
        ("code verifier, 6-test function problem, completions/s", "code_function6_per_s", "{:.1f}", 1),
        ("code verifier, 4-test stdin/stdout problem, completions/s", "code_stdio4_per_s", "{:.1f}", 1),
        ("training step, code task (8 completions), s", "step_code_s", "{:.2f}", 1),
        ("  of which scoring, ms", "step_code_reward_s", "{:.0f}", 1000),
        ("training step, leg_counting (8 completions), s", "step_leg_counting_s", "{:.2f}", 1),
        ("  of which scoring, ms", "step_leg_counting_reward_s", "{:.2f}", 1000),
    ]
    names = list(trees)
    print(f"machine: {cpu_line(hw)}, {os.cpu_count()} CPUs, kernel {platform.release()}, "
          f"Python {platform.python_version()}; {args.rounds} alternating rounds, medians\n")
    print("| | " + " | ".join(names) + (" | after / before, median of rounds (range) |" if ratios else " |"))
    print("|---" * (len(names) + 1 + ("before" in med)) + "|")
    for label, key, fmt, scale in rows:
        cells = [fmt.format(scale * med[n][key]) for n in names]
        ratio = ""
        if key in ratios:
            mid, lo, hi = ratios[key]
            ratio = f" | {mid:.2f}x ({lo:.2f}-{hi:.2f})"
        print(f"| {label} | " + " | ".join(cells) + ratio + " |")
    print(f"\nreward errors in the training runs: " + ", ".join(
        f"{n}: {med[n]['step_code_errors']:.0f} (code), {med[n]['step_leg_counting_errors']:.0f} (leg_counting)"
        for n in names))
    print(f"raw numbers appended to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
