"""Multi-turn decoding: the agent loop extending its KV cache turn by turn against re-prefilling
the whole conversation at every new turn (``AgentGenerator(kv_reuse=False)``), side by side.

Both modes draw from the same random stream per trajectory (same seed). In float32 they sample the
same tokens (the test suite checks it for greedy decoding); with the bf16 generation copy the two
paths round differently and sampled trajectories can diverge, so the comparison is of sampled
tokens per second (``same_tokens`` in the results says whether the work was identical). An environment answers every turn with a fixed observation (about 40 tokens,
a tool result's size) until the trajectory has T turns; runs alternate (extend, re-prefill, extend,
...) so drift in the machine's speed hits both alike, and the result is the median of the
per-pair ratios of sampled tokens per second, with their range.

    flock /tmp/reinforge-cpu.lock python benchmarks/bench_agent.py --turns 2 4 8 --pairs 3

Results are appended to ``benchmarks/results/agent.json``.
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

from _machine import cpu_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

OBSERVATION = ("Result: 48213 * 7719 = 372156147. The calculator also reports: no overflow, exact integer "
               "arithmetic. Continue.")


class FixedTurnsEnv:
    tools: list = []
    max_turns = None

    def __init__(self, turns: int):
        self.turns = turns

    def reset(self, example):
        self.n = 0
        return [dict(m) for m in example.messages]

    def step(self, message):
        from reinforge.agents import StepResult

        self.n += 1
        if self.n >= self.turns:
            return StepResult([], 0.0, True, {})
        return StepResult([{"role": "tool", "content": OBSERVATION}], 0.0, False, {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--rows", type=int, default=16, help="trajectories decoded together")
    ap.add_argument("--tokens-per-turn", type=int, default=48)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from reinforge.agents import AgentBudgets, AgentGenerator
    from reinforge.config import ModelConfig
    from reinforge.models import load_model, load_tokenizer, resolve_model_path
    from reinforge.rollout import HFGenerator, SamplingParams
    from reinforge.tasks.base import Example

    path = resolve_model_path(args.model)
    tok = load_tokenizer(path)
    model = load_model(ModelConfig(path=args.model, dtype=args.dtype), path=path)
    copy = torch.bfloat16 if args.dtype == "bfloat16" else None
    base = HFGenerator(model, tok, batch_size=args.rows, autocast_dtype=None, copy_dtype=copy)
    examples = [Example(f"q{i}", [{"role": "system", "content": "Answer in one short sentence."},
                                  {"role": "user", "content": f"Name a fact about the number {17 * i + 3}."}], None)
                for i in range(args.rows)]
    params = SamplingParams(num_samples=1, temperature=0.7)
    results = []
    for turns in args.turns:
        budgets = AgentBudgets(max_turns=turns, max_tokens_per_turn=args.tokens_per_turn,
                               max_tokens=turns * (args.tokens_per_turn + 64))
        runs = {True: [], False: []}
        for pair in range(args.pairs):
            for kv in (True, False):
                agent = AgentGenerator(base, lambda t=turns: FixedTurnsEnv(t), budgets, kv_reuse=kv)
                torch.manual_seed(pair)
                t0 = time.perf_counter()
                batch = agent.generate_examples(examples, params)
                wall = time.perf_counter() - t0
                agent.pool.shutdown()
                sampled = int(batch.action_mask.sum())
                runs[kv].append({"wall_s": wall, "sampled_tokens": sampled, "tokens_per_s": sampled / wall,
                                 "turns_mean": sum(len(e.turns) for e in batch.episodes) / len(batch.episodes),
                                 "context_tokens": int(batch.completion_mask.sum()),
                                 "ids": [e.token_ids for e in batch.episodes]})
                print(f"turns={turns} pair={pair} {'extend' if kv else 'reprefill'}: {sampled} tokens in {wall:.1f} s "
                      f"({sampled / wall:.1f}/s), {runs[kv][-1]['turns_mean']:.2f} turns", flush=True)
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs[True], runs[False])]
        same = all(a["ids"] == b["ids"] for a, b in zip(runs[True], runs[False]))
        for r in (*runs[True], *runs[False]):
            r.pop("ids")
        results.append({"turns": turns, "extend": runs[True], "reprefill": runs[False],
                        "ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                        "ratio_max": max(ratios), "same_tokens": same})
        print(f"turns={turns}: extend/reprefill tokens/s median {statistics.median(ratios):.2f} "
              f"[{min(ratios):.2f}, {max(ratios):.2f}], same tokens: {same}", flush=True)
    out = ROOT / "benchmarks" / "results" / "agent.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(out.read_text()) if out.exists() else []
    history.append({"time": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": cpu_model(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "args": vars(args), "results": results})
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(history, indent=1))
    tmp.replace(out)


if __name__ == "__main__":
    main()
