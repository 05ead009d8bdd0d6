"""The rollout of one training step of a ``verifiers`` environment (configs/agent_verifiers.yaml's
shape: 8 tasks x 8 episodes, up to 12 tokens a reply, temperature 0.7, 8 episodes in flight)
through the loopback endpoint served one request at a time (``batching: false``, the path before
issue 29) and with the continuous-batching engine (``batching: true``), next to reinforge's own
single-turn generation of the same prompts and samples (``HFGenerator.generate``, the same token
budget): the ratio the issue's goal is about (within 1.5x).

Runs alternate (serial, batched, single-turn, serial, ...) so drift in the machine's speed hits
every mode alike; each pair uses its own 8 tasks and seed, the same for every mode. Reported: each
mode's seconds per step (median and range), the per-pair ratios, and what the engine did (forwards,
decode steps, prefill forwards, seconds in prefill / decode forwards / sampling).

    python benchmarks/bench_verifiers_step.py --pairs 3
    python benchmarks/bench_verifiers_step.py --modes batched,single_turn --engine-from 0c62275

``--engine-from COMMIT`` adds the mode ``batched_before``: the engine (reinforge/rollout/serving.py)
as it was at that git commit, behind the same endpoint, timed in the same process and alternated
with the others (a before/after comparison under the same conditions).

Results are appended to ``benchmarks/results/verifiers_step.json``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from _machine import cpu_line

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODES = ("serial", "batched_before", "batched", "single_turn")


def engine_at(commit: str):
    """The ``BatchingEngine`` class of reinforge/rollout/serving.py as of git ``commit``."""
    src = subprocess.check_output(["git", "show", f"{commit}:reinforge/rollout/serving.py"], cwd=ROOT)
    path = Path(tempfile.mkdtemp()) / "serving_before.py"
    path.write_bytes(src)
    spec = importlib.util.spec_from_file_location("reinforge.rollout._serving_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.BatchingEngine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "agent_verifiers.yaml"))
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--model", default=None, help="default: the config's model.path")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="float32 is what the config's dtype: auto resolves to on a CPU without native bf16")
    ap.add_argument("--max-concurrent", type=int, default=None, help="default: the config's env.options value")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--modes", default="serial,batched,single_turn",
                    help="comma-separated, of serial, batched, single_turn (run in that order)")
    ap.add_argument("--engine-from", default=None, metavar="COMMIT",
                    help="also time batched_before: the engine as of this git commit")
    args = ap.parse_args()
    modes = [m for m in MODES if m in args.modes.split(",") or (m == "batched_before" and args.engine_from)]
    if "single_turn" not in modes:
        ap.error("--modes must include single_turn (the ratios are to it)")
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
    agents = {mode: VerifiersGenerator(base, {**options, "batching": mode != "serial"}, max_tokens=max_tokens,
                                       max_turns=cfg["env"].get("max_turns"))
              for mode in modes if mode != "single_turn"}
    if "batched_before" in agents:
        server = agents["batched_before"].server
        new = server.batcher
        server.batcher = engine_at(args.engine_from)(base, max_batch=new.max_batch, cache_bytes=new.store.max_bytes)
        new.close()
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
            counters = ("forward_calls", "decode_steps", "prefill_calls", "busy_s")
            before = {c: getattr(engine, c, 0) for c in counters} if engine else {}
            split = dict(getattr(engine, "time_s", {}))
            batch = agent.generate_examples(examples, params)
            sampled = int(batch.action_mask.sum())
        wall = time.perf_counter() - t0
        out = {"wall_s": wall, "sampled_tokens": sampled, "rows": len(batch)}
        if mode.startswith("batched"):
            out.update({c: getattr(engine, c, 0) - v for c, v in before.items()})
            out.update({f"{k}_s": v - split[k] for k, v in getattr(engine, "time_s", {}).items()})
        return out

    try:
        warm = train[:1]
        for mode in modes:  # untimed: first-call costs (verifiers' renderer pool, allocations)
            print(f"warm-up {mode}: {run(mode, warm, 0)['wall_s']:.2f} s", flush=True)
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for pair in range(args.pairs):
            examples = train[(pair + 1) * prompts_per_step:(pair + 2) * prompts_per_step]
            for mode in modes:
                r = run(mode, examples, 1000 + pair)
                runs[mode].append(r)
                extra = ", ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                                  for k, v in r.items() if k not in ("wall_s", "sampled_tokens", "rows"))
                print(f"pair {pair} {mode}: {r['wall_s']:.2f} s, {r['sampled_tokens']} sampled tokens, "
                      f"{r['rows']} rows" + (f"; {extra}" if extra else ""), flush=True)
    finally:
        for agent in agents.values():
            agent.close(base=False)

    def summary(values):
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    walls = {m: summary([r["wall_s"] for r in runs[m]]) for m in modes}

    def ratio(a: str, b: str):
        return summary([x["wall_s"] / y["wall_s"] for x, y in zip(runs[a], runs[b])])

    ratios = {f"{a}_over_{b}": ratio(a, b)
              for a, b in (("serial", "batched"), ("batched_before", "batched"), ("serial", "single_turn"),
                           ("batched_before", "single_turn"), ("batched", "single_turn"))
              if a in runs and b in runs}
    for m in modes:
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
