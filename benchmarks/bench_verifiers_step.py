"""The rollout of one training step of a ``verifiers`` environment (configs/agent_verifiers.yaml's
shape: 8 tasks x 8 episodes, up to 12 tokens a reply, temperature 0.7, 8 episodes in flight)
through the loopback endpoint served one request at a time (``batching: false``, the path before
issue 29) and with the continuous-batching engine (``batching: true``), next to reinforge's own
single-turn generation of the same prompts and samples (``HFGenerator.generate``, the same token
budget): the ratio the issue's goal is about (within 1.5x).

Runs alternate (serial, batched, single-turn, serial, ...) so drift in the machine's speed hits
every mode alike; each pair uses its own 8 tasks and seed, the same for every mode. Reported: each
mode's seconds per step (median and range) and the per-pair ratios.

    python benchmarks/bench_verifiers_step.py --pairs 3

Results are appended to ``benchmarks/results/verifiers_step.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

from _machine import cpu_line

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("serial", "batched", "single_turn")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "agent_verifiers.yaml"))
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--model", default=None, help="default: the config's model.path")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="float32 is what the config's dtype: auto resolves to on a CPU without native bf16")
    ap.add_argument("--max-concurrent", type=int, default=None, help="default: the config's env.options value")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from reinforge.agents.verifiers_source import VerifiersGenerator, VerifiersTask
    from reinforge.config import ModelConfig
    from reinforge.models import load_model, load_tokenizer, resolve_model_path
    from reinforge.rollout import HFGenerator, SamplingParams

    cfg = yaml.safe_load(Path(args.config).read_text())
    options = dict(cfg["env"]["options"])
    if args.max_concurrent:
        options["max_concurrent"] = args.max_concurrent
    prompts_per_step = cfg["trainer"]["prompts_per_step"]
    rollout = cfg["rollout"]
    params = SamplingParams(num_samples=rollout["num_samples"], temperature=rollout["temperature"],
                            max_new_tokens=rollout["max_new_tokens"])
    model_name = args.model or cfg["model"]["path"]
    path = resolve_model_path(model_name)
    tok = load_tokenizer(path)
    model = load_model(ModelConfig(path=model_name, dtype=args.dtype), path=path)
    copy = torch.bfloat16 if args.dtype == "bfloat16" else None
    base = HFGenerator(model, tok, copy_dtype=copy)
    task = VerifiersTask(options, eval_size=0, seed=cfg["task"].get("seed", 0))
    train = list(task.train_examples())
    max_tokens = cfg["env"].get("max_tokens_per_turn") or params.max_new_tokens
    agents = {mode: VerifiersGenerator(base, {**options, "batching": mode == "batched"}, max_tokens=max_tokens,
                                       max_turns=cfg["env"].get("max_turns"))
              for mode in ("serial", "batched")}
    machine = cpu_line(threads=torch.get_num_threads())
    print(f"machine: {machine}; model {model_name} in {args.dtype}; {prompts_per_step} tasks x "
          f"{params.num_samples} episodes, {options.get('max_concurrent', 1)} in flight", flush=True)

    def run(mode: str, examples, seed: int) -> dict:
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        if mode == "single_turn":
            prompts = [tok.apply_chat_template(e.messages, add_generation_prompt=True, tokenize=True,
                                               return_dict=False) for e in examples]
            batch = base.generate(prompts, params)
            sampled = int(batch.completion_mask.sum())
        else:
            agent = agents[mode]
            engine = agent.server.batcher
            calls = engine.forward_calls if engine else None
            busy = engine.busy_s if engine else None
            batch = agent.generate_examples(examples, params)
            sampled = int(batch.action_mask.sum())
        wall = time.perf_counter() - t0
        out = {"wall_s": wall, "sampled_tokens": sampled, "rows": len(batch)}
        if mode == "batched":
            out["forward_calls"] = engine.forward_calls - calls
            out["engine_busy_s"] = engine.busy_s - busy
        return out

    try:
        warm = train[:1]
        for mode in MODES:  # untimed: first-call costs (verifiers' renderer pool, allocations)
            print(f"warm-up {mode}: {run(mode, warm, 0)['wall_s']:.2f} s", flush=True)
        runs: dict[str, list[dict]] = {m: [] for m in MODES}
        for pair in range(args.pairs):
            examples = train[(pair + 1) * prompts_per_step:(pair + 2) * prompts_per_step]
            for mode in MODES:
                r = run(mode, examples, 1000 + pair)
                runs[mode].append(r)
                print(f"pair {pair} {mode}: {r['wall_s']:.2f} s, {r['sampled_tokens']} sampled tokens, "
                      f"{r['rows']} rows" + (f", {r['forward_calls']} forwards, engine busy {r['engine_busy_s']:.2f} s"
                                             if "forward_calls" in r else ""),
                      flush=True)
    finally:
        for agent in agents.values():
            agent.close(base=False)

    def summary(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    walls = {m: summary([r["wall_s"] for r in runs[m]]) for m in MODES}
    ratios = {
        "serial_over_batched": summary([a["wall_s"] / b["wall_s"] for a, b in zip(runs["serial"], runs["batched"])]),
        "batched_over_single_turn": summary([a["wall_s"] / b["wall_s"]
                                             for a, b in zip(runs["batched"], runs["single_turn"])]),
        "serial_over_single_turn": summary([a["wall_s"] / b["wall_s"]
                                            for a, b in zip(runs["serial"], runs["single_turn"])]),
    }
    for m in MODES:
        w = walls[m]
        print(f"{m}: {w['median']:.2f} s a step [{w['min']:.2f}, {w['max']:.2f}]")
    for name, r in ratios.items():
        print(f"{name}: {r['median']:.2f}x [{r['min']:.2f}, {r['max']:.2f}]")
    out = ROOT / "benchmarks" / "results" / "verifiers_step.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(out.read_text()) if out.exists() else []
    history.append({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine,
                    "python": platform.python_version(), "torch": torch.__version__, "args": vars(args),
                    "max_concurrent": options.get("max_concurrent", 1), "runs": runs, "step_s": walls,
                    "ratios": ratios})
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(history, indent=1))
    tmp.replace(out)


if __name__ == "__main__":
    main()
