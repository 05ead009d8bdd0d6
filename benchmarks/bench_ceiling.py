"""How close the main job's update comes to what this machine's matmuls can do.

Measures, in one process, alternating A B A B:

- **A, the ceiling**: fp32 GEMMs of the shapes the model's linear layers have on the update's
  token count (SmolLM2-135M: [T, 576] x [576, 576/192/1536] and the MLP's down projection), timed
  forward, backward-input and backward-weight, as GFLOP/s. This is what the update could reach if
  it were nothing but these matmuls.
- **B, the update**: ``Learner.step`` on a batch shaped like the main job's (8 prompts x 8 samples
  of needle_haystack, the main job's prompt with its few-shot turn, 12 completion tokens, every
  row with a non-zero advantage so none is skipped), its useful FLOPs counted as
  2 x (decoder-body parameters) x (tokens through the body) + 2 x (LM-head parameters) x
  (completion tokens) for the forward, twice that for the backward (attention's score matmuls
  are left out: small at these lengths, so the ratio is a slight underestimate).

and reports update GFLOP/s / ceiling GFLOP/s per pair, median and range. With ``--dtype`` both
sides run in that dtype (the ceiling's GEMMs under autocast too).

    python benchmarks/bench_ceiling.py                    # fp32, all cores, 3 pairs
    python benchmarks/bench_ceiling.py --threads 2 --pairs 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _ceiling(tokens: int, dtype, repeats: int = 3) -> float:
    import torch

    shapes = [(576, 576), (576, 192), (576, 1536), (1536, 576)]  # q/o, k/v, gate/up, down
    weights = {s: torch.randn(s[1], s[0]) * 0.02 for s in shapes}
    xs = {s: torch.randn(tokens, s[0]) for s in shapes}
    flops = sum(3 * 2 * tokens * i * o for i, o in shapes)

    def once() -> float:
        t0 = time.perf_counter()
        for s in shapes:
            w = weights[s].requires_grad_(True)
            x = xs[s].requires_grad_(True)
            with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
                y = torch.nn.functional.linear(x, w)
            y.float().sum().backward()
            w.grad = x.grad = None
        return time.perf_counter() - t0

    once()
    return flops / min(once() for _ in range(repeats)) / 1e9


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--out", default=str(HERE / "results" / "ceiling.json"))
    args = p.parse_args(argv)

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from reinforge.batch import TrainBatch
    from reinforge.config import load_config
    from reinforge.learner import Learner
    from reinforge.models import load_model, load_tokenizer, resolve_model_path
    from reinforge.precision import describe_cpu, hardware_info
    from reinforge.rollout import HFGenerator, SamplingParams
    from reinforge.tasks import build_task, encode_prompt

    dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    cfg = load_config(str(HERE.parent / "configs" / "main.yaml"), [f"model.dtype={args.dtype}"])
    path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(path)
    model = load_model(cfg.model, path=path)
    task = build_task(cfg.task)
    prompts = [encode_prompt(tokenizer, e) for e in task.train_examples()[:8]]
    torch.manual_seed(0)
    gen = HFGenerator(model, tokenizer, autocast_dtype=dtype)
    rollout = gen.generate(prompts, SamplingParams(num_samples=8, temperature=0.7, max_new_tokens=12))
    adv = torch.linspace(-1.0, 1.0, len(rollout))  # no row has advantage 0: the whole batch runs
    learner = Learner(model, cfg.learner, cfg.algorithm, temperature=0.7, max_new_tokens=12, autocast_dtype=dtype)

    body_params = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)
    head_params = model.get_output_embeddings().weight.numel()
    prompt_tokens = int(rollout.prompt_mask[::8].sum())  # each group's prompt runs once (shared prefix)
    completion_tokens = int(rollout.completion_mask.sum())
    body_tokens = prompt_tokens + completion_tokens
    flops = 3 * (2 * body_params * body_tokens + 2 * head_params * completion_tokens)

    def update() -> float:
        t0 = time.perf_counter()
        learner.step(TrainBatch(rollout=rollout, advantages=adv, old_logprobs=None))
        return time.perf_counter() - t0

    update()  # warm-up
    pairs = []
    for i in range(args.pairs):
        ceiling = _ceiling(body_tokens, dtype)
        seconds = update()
        achieved = flops / seconds / 1e9
        pairs.append({"ceiling_gflops": ceiling, "update_s": seconds, "update_gflops": achieved,
                      "ratio": achieved / ceiling})
        print(f"pair {i + 1}: ceiling {ceiling:.1f} GFLOP/s, update {seconds:.2f} s = {achieved:.1f} GFLOP/s, "
              f"{achieved / ceiling:.2f} of the ceiling", flush=True)
    ratios = [r["ratio"] for r in pairs]
    info = hardware_info()
    record = {"date": time.strftime("%Y-%m-%d %H:%M"), "cpu": describe_cpu(info), "hardware": info,
              "threads": torch.get_num_threads(), "dtype": args.dtype, "body_tokens": body_tokens,
              "prompt_tokens_per_group": prompt_tokens / 8, "completion_tokens": completion_tokens,
              "update_gflop": flops / 1e9, "pairs": pairs, "ratio_median": statistics.median(ratios),
              "ratio_range": [min(ratios), max(ratios)], "argv": sys.argv}
    print(f"\n{describe_cpu(info)}, {torch.get_num_threads()} threads, {args.dtype}: the update "
          f"({body_tokens} tokens through the body, {flops / 1e9:.0f} GFLOP) reaches "
          f"{statistics.median(ratios):.2f} of the matmul ceiling (range {min(ratios):.2f}-{max(ratios):.2f}, "
          f"{args.pairs} pairs)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runs = json.loads(out.read_text()) if out.is_file() else []
    out.write_text(json.dumps(runs + [record], indent=1))


if __name__ == "__main__":
    main()
