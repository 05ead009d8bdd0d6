"""How reinforge's RL step time grows: with samples per prompt, with new tokens, with model size.

Each model runs in a fresh subprocess (``--worker MODEL``) that sets the trainer up once, runs one
small warm-up step, then one RL step per point of the sweep (generation, reward, advantages,
update: ``Trainer.train_step``), changing only the swept setting between steps. The parent
prints Markdown tables, appends the results to ``benchmarks/results/scaling.json`` and draws
``docs/img/scaling.png``.

    python benchmarks/bench_scaling.py               # the published sweep (~10 minutes on 2 cores)
    python benchmarks/bench_scaling.py --quick       # a smoke test: tiny model, two points per sweep

Models: ``tiny`` (a random 2-layer Llama, hidden 64, with the SmolLM2 tokenizer), ``smollm2``
(SmolLM2-135M-Instruct, the default model) and ``llama-0.5b`` (a randomly initialised Llama of
about 0.5B parameters built in code: hidden 1024, 28 layers, MLP 4096, 16 heads / 4 KV heads,
SmolLM2's vocabulary; nothing is downloaded). A random model never emits its stop token, so its
completions always run to ``max_new_tokens``; SmolLM2's stop when it answers: the tables give the
real mean completion length next to each limit.

Single measurements (one step per point): read trends, not third digits.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_OUT = HERE / "results" / "scaling.json"
DEFAULT_PLOT = ROOT / "docs" / "img" / "scaling.png"
GB = 1024**3

# (sweep name, model, prompts, samples, new tokens)
FULL = (
    [("samples", "smollm2", 4, g, 64) for g in (2, 4, 8, 16)]
    + [("new_tokens", "smollm2", 4, 8, t) for t in (32, 64, 128, 256)]
    + [("model", m, 2, 8, 64) for m in ("tiny", "smollm2", "llama-0.5b")]
)
QUICK = (
    [("samples", "tiny", 2, g, 16) for g in (2, 4)]
    + [("new_tokens", "tiny", 2, 4, t) for t in (8, 16)]
    + [("model", "tiny", 2, 4, 16)]
)


def _random_llama(workdir: Path, name: str, **shape) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from reinforge.models import default_model_path

    tok = AutoTokenizer.from_pretrained(default_model_path(), local_files_only=True)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok), max_position_embeddings=2048, tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id, **shape,
    )
    model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = cfg.pad_token_id
    path = workdir / name
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def model_path(name: str, workdir: Path) -> str:
    if name == "smollm2":
        return "smollm2-135m-instruct"
    if name == "tiny":
        return str(_random_llama(workdir, "tiny", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2))
    if name == "llama-0.5b":
        return str(_random_llama(workdir, "llama-0.5b", hidden_size=1024, intermediate_size=4096,
                                 num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=4))
    raise ValueError(name)


def worker(spec: dict, result_path: str) -> None:
    import torch

    from reinforge.config import build_config
    from reinforge.trainer import Trainer

    torch.set_num_threads(spec["threads"])
    workdir = Path(spec["workdir"])
    path = model_path(spec["model"], workdir)
    cfg = build_config({}, [
        f"model.path={path}", f"model.dtype={spec['dtype']}", f"task.name={spec['task']}",
        "algorithm.kl_coef=0.0", "learner.lr=1e-6", "trainer.seed=0", "task.seed=0",
        "trainer.steps=1000", f"trainer.num_threads={spec['threads']}", "trainer.samples_to_log=0",
        f"tracking.output_dir={workdir / 'runs'}", f"tracking.run_name=scaling-{spec['model']}",
        "tracking.progress=false",
    ])
    trainer = Trainer(cfg)
    t0 = time.perf_counter()
    trainer._setup()
    setup_s = time.perf_counter() - t0
    params = sum(p.numel() for p in trainer.model.parameters())

    def run(prompts: int, samples: int, new_tokens: int, step: int) -> dict:
        cfg.trainer.prompts_per_step = prompts
        cfg.rollout.num_samples = samples
        cfg.rollout.max_new_tokens = new_tokens
        trainer.generator.batch_size = prompts * samples  # one generate call per step
        trainer.learner.max_new_tokens = new_tokens
        return trainer.train_step(step)

    # Warm-up at the first point's size: thread pools, allocator, lazy imports, and the one-off
    # cost of the learner's first full-size forward/backward (measured: 12.3 s against 6.7 s for
    # the next one at 4 x 2 x 64), which otherwise lands on the first point.
    _, _, prompts0, samples0, tokens0 = spec["points"][0]
    run(prompts0, samples0, tokens0, 1)
    points = []
    for i, (sweep, _, prompts, samples, new_tokens) in enumerate(spec["points"]):
        m = run(prompts, samples, new_tokens, i + 2)
        points.append({
            "sweep": sweep, "model": spec["model"], "params": params, "prompts": prompts, "samples": samples,
            "max_new_tokens": new_tokens, "rows": prompts * samples,
            "time_step": m["time_step"], "time_generate": m["time_collect"],
            "time_update": m["time_step"] - m["time_collect"], "generated_tokens": m["generated_tokens"],
            "completion_length": m["completion_length"], "tokens_per_s": m["tokens_per_s"],
        })
        print(f"[scaling] {points[-1]}", file=sys.stderr, flush=True)
    out = {"model": spec["model"], "params": params, "setup_s": setup_s, "points": points,
           "ru_maxrss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GB,
           "threads": torch.get_num_threads()}
    Path(result_path).write_text(json.dumps(out))


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "reinforge"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = None
    return out


def markdown(points: list[dict], maxrss: dict[str, float]) -> str:
    out = []
    titles = {"samples": "Samples per prompt (SmolLM2-135M, 4 prompts, up to 64 new tokens)",
              "new_tokens": "New tokens (SmolLM2-135M, 4 prompts x 8 samples)",
              "model": "Model size (2 prompts x 8 samples, up to 64 new tokens)"}
    for sweep in ("samples", "new_tokens", "model"):
        pts = [p for p in points if p["sweep"] == sweep]
        if not pts:
            continue
        out += [f"**{titles[sweep] if len(set(p['model'] for p in points)) > 1 else sweep}**", "",
                "| model | params | prompts x samples | max new tokens | mean completion | step (s) | generate (s) "
                "| update etc. (s) | generate share | tokens/s |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for p in pts:
            out.append(
                f"| {p['model']} | {p['params'] / 1e6:.0f}M | {p['prompts']} x {p['samples']} | {p['max_new_tokens']} "
                f"| {p['completion_length']:.1f} | {p['time_step']:.1f} | {p['time_generate']:.1f} "
                f"| {p['time_update']:.1f} | {p['time_generate'] / p['time_step']:.2f} | {p['tokens_per_s']:.1f} |")
        out.append("")
    out.append("Peak RSS per model process (ru_maxrss): "
               + ", ".join(f"{m} {v:.2f} GB" for m, v in maxrss.items()))
    return "\n".join(out)


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = [s for s in ("samples", "new_tokens", "model") if any(p["sweep"] == s for p in points)]
    fig, axes = plt.subplots(1, len(sweeps), figsize=(5 * len(sweeps), 4), squeeze=False)
    for ax, sweep in zip(axes[0], sweeps):
        pts = [p for p in points if p["sweep"] == sweep]
        if sweep == "samples":
            x, label = [p["samples"] for p in pts], "samples per prompt (G)"
        elif sweep == "new_tokens":
            x, label = [p["max_new_tokens"] for p in pts], "max new tokens"
        else:
            x, label = [p["params"] / 1e6 for p in pts], "parameters (millions)"
        ax.plot(x, [p["time_step"] for p in pts], "o-", label="whole step")
        ax.plot(x, [p["time_generate"] for p in pts], "s--", label="generate")
        ax.plot(x, [p["time_update"] for p in pts], "^--", label="update (+ reward, advantages)")
        if sweep == "model":
            ax.set_xscale("log")
            for p, xi in zip(pts, x):
                ax.annotate(p["model"], (xi, p["time_step"]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        else:
            ax.set_xscale("log", base=2)
            ax.set_xticks(x)
            ax.set_xticklabels([str(v) for v in x])
        ax.set_xlabel(label)
        ax.set_ylabel("seconds per RL step")
        ax.set_title(f"step time vs {label.split(' (')[0]}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("reinforge RL step time on CPU (one step per point)", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny model, two points per sweep (a smoke test)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    p.add_argument("--task", default="leg_counting")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--plot", default=str(DEFAULT_PLOT))
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(json.loads(Path(args.spec).read_text()), args.result)
        return
    threads = args.threads or len(os.sched_getaffinity(0))
    plan = QUICK if args.quick else FULL
    models = list(dict.fromkeys(m for _, m, *_ in plan))
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        for model in models:
            spec = {"model": model, "points": [pt for pt in plan if pt[1] == model], "dtype": args.dtype,
                    "task": args.task, "threads": threads, "workdir": tmp}
            spec_path, result_path = Path(tmp) / f"spec-{model}.json", Path(tmp) / f"result-{model}.json"
            spec_path.write_text(json.dumps(spec))
            print(f"[scaling] {model}: {len(spec['points'])} points", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, __file__, "--worker", model, "--spec", str(spec_path),
                                   "--result", str(result_path)], cwd=str(ROOT),
                                  env=dict(os.environ, TOKENIZERS_PARALLELISM="false"))
            if proc.returncode != 0:
                raise SystemExit(f"[scaling] the {model} worker failed (exit {proc.returncode})")
            results[model] = json.loads(result_path.read_text())
            print(f"[scaling] {model} done in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    order = {pt: i for i, pt in enumerate(plan)}
    points = sorted((pt for r in results.values() for pt in r["points"]),
                    key=lambda q: order[(q["sweep"], q["model"], q["prompts"], q["samples"], q["max_new_tokens"])])
    maxrss = {m: r["ru_maxrss_gb"] for m, r in results.items()}
    record = {"benchmark": "scaling", "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
              "host": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": threads},
              "versions": _versions(), "dtype": args.dtype, "task": args.task, "points": points, "maxrss_gb": maxrss}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    records = json.loads(out.read_text()) if out.is_file() else []
    out.write_text(json.dumps(records + [record], indent=2) + "\n")
    plot(points, Path(args.plot))
    print(f"\n### reinforge step time scaling ({args.dtype}, task `{args.task}`, {threads} threads)\n")
    print(markdown(points, maxrss))
    print(f"\nresults appended to {out}; plot {args.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
