"""reinforge vs TRL's GRPOTrainer: the same RL step configuration, side by side, on CPU.

Measures, for each framework, generated completion tokens per second end to end (generation,
reward, update: the whole RL step) and peak resident memory, then their ratios.

Each framework runs in a fresh subprocess of this script (``--worker reinforge|trl``), so the
peak RSS of one is not polluted by the other, or by the parent (the parent imports neither torch
nor transformers; preparing the model also happens in a subprocess of its own).

Same configuration for both: model, prompts (same reasoning-gym task, options and seed, in the same
order: the order reinforge's seeded EpochSampler draws them), G samples per prompt, max new
tokens, temperature 1.0, top_p 1.0 (no top-k), lr 1e-6, AdamW betas (0.9, 0.99), constant lr,
grad-norm clip 1.0, no KL term, one optimisation pass per batch, fp32, no gradient checkpointing,
the same reward function (reinforge's reward built from the task: the reasoning-gym score of the
answer in the completion text), token-mean loss aggregation (TRL loss_type="dapo"), group-std
scaled advantages.

    python benchmarks/bench_vs_trl.py --model tiny --steps 1 --warmup 1 --max-new-tokens 16  # quick check
    python benchmarks/bench_vs_trl.py                                                       # SmolLM2-135M

Tokens/s = real (unpadded, up to and including the stop token) completion tokens summed over the
measured steps / summed wall time of the measured steps. Warm-up steps are run but not measured.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "vs_trl.json"
FRAMEWORKS = ("reinforge", "trl")
GB = 1024**3


# ------------------------------------------------------------------------------------------------
# memory measurement (children)
# ------------------------------------------------------------------------------------------------
def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _write_partial(result_path: str, record: dict) -> None:
    """Progress of a worker after each step (``<result>.partial``), read by the parent when the
    worker dies (OOM kill) or runs past ``--timeout``: the steps it finished are still a result."""
    tmp = result_path + ".partial.tmp"
    Path(tmp).write_text(json.dumps(record))
    os.replace(tmp, result_path + ".partial")


def _ru_maxrss_bytes() -> int:
    import resource

    # Linux reports kilobytes (macOS bytes; this benchmark reads /proc, so it is Linux only).
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RssSampler:
    """Samples VmRSS every ``interval`` seconds in a daemon thread. ``peak`` is the whole process;
    ``peak_window`` only while a window (a measured step) is open. Windows also sample at their
    edges, so a step shorter than the interval is still seen."""

    def __init__(self, interval: float = 0.2):
        self.interval = interval
        self.peak = 0
        self.peak_window = 0
        self.samples = 0
        self._in_window = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="rss-sampler")

    def start(self) -> "RssSampler":
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sample()

    def _sample(self) -> None:
        rss = _rss_bytes()
        with self._lock:
            self.samples += 1
            self.peak = max(self.peak, rss)
            if self._in_window:
                self.peak_window = max(self.peak_window, rss)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def open_window(self) -> None:
        with self._lock:
            self._in_window = True
        self._sample()

    def close_window(self) -> None:
        self._sample()
        with self._lock:
            self._in_window = False


# ------------------------------------------------------------------------------------------------
# the shared configuration
# ------------------------------------------------------------------------------------------------
def reinforge_overrides(spec: dict, output_dir: str) -> list[str]:
    """The reinforge config of the benchmark; the TRL worker builds its task, prompt order and
    reward function from the same config, so both see the same prompts and rewards."""
    total = spec["warmup"] + spec["steps"]
    return [
        f"model.path={spec['reinforge_model_path']}",
        f"model.dtype={spec.get('dtype', 'float32')}",
        f"model.device={spec.get('device', 'cpu')}",
        "model.gradient_checkpointing=false",
        f"task.name={spec['task']}",
        f"task.options={json.dumps(spec['task_options'])}",
        f"trainer.seed={spec['seed']}",
        f"task.seed={spec['seed']}",
        f"rollout.num_samples={spec['samples']}",
        f"rollout.max_new_tokens={spec['max_new_tokens']}",
        "rollout.temperature=1.0",
        "rollout.top_p=1.0",
        f"rollout.generation_batch_size={spec['prompts'] * spec['samples']}",  # one generate call per step
        "algorithm.kl_coef=0.0",
        "algorithm.epochs=1",
        f"learner.lr={spec['lr']}",
        f"trainer.prompts_per_step={spec['prompts']}",
        f"trainer.steps={total}",
        "trainer.eval_every=0",
        "trainer.eval_at_start=false",
        "trainer.eval_max_prompts=1",  # the trainer always evaluates after the last step; keep it small
        "trainer.checkpoint_every=0",
        f"trainer.num_threads={spec['threads']}",
        f"tracking.output_dir={output_dir}",
        "tracking.run_name=bench",
        "tracking.progress=false",
        *spec.get("reinforge_overrides", []),
    ]


def _versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "trl", "accelerate", "datasets", "reasoning_gym", "reinforge"):
        try:
            out[pkg] = version(pkg.replace("_", "-"))
        except PackageNotFoundError:
            out[pkg] = None
    return out


# ------------------------------------------------------------------------------------------------
# workers (each in a fresh process)
# ------------------------------------------------------------------------------------------------
def worker_prepare(spec: dict, result_path: str) -> None:
    """Resolve (or build) the model both frameworks load; run in its own process so the parent
    stays small (a forked child starts with its parent's RSS as its ru_maxrss floor)."""
    from reinforge.models import default_model_path

    smol = default_model_path()  # converts the shipped GGUF once and caches it
    if spec["model"] == "smollm2":
        out = {"model_path": str(smol), "reinforge_model_path": "smollm2-135m-instruct"}
    else:
        import torch
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        tok = AutoTokenizer.from_pretrained(smol, local_files_only=True)
        torch.manual_seed(0)
        cfg = LlamaConfig(
            vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
            tie_word_embeddings=True, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
            pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
        )
        model = LlamaForCausalLM(cfg)
        model.generation_config.eos_token_id = tok.eos_token_id
        model.generation_config.pad_token_id = cfg.pad_token_id
        path = Path(spec["workdir"]) / "tiny-llama"
        model.save_pretrained(path)
        tok.save_pretrained(path)
        out = {"model_path": str(path), "reinforge_model_path": str(path)}
    Path(result_path).write_text(json.dumps(out))


def _peak_gpu_gb() -> float | None:
    """Peak memory torch allocated on the GPU in this worker (None on a CPU run)."""
    import torch

    return torch.cuda.max_memory_allocated() / GB if torch.cuda.is_available() else None


def worker_reinforge(spec: dict, result_path: str) -> None:
    import torch

    torch.set_num_threads(spec["threads"])
    sampler = RssSampler().start()
    from reinforge.config import build_config
    from reinforge.trainer import Trainer

    warmup = spec["warmup"]
    out_dir = tempfile.mkdtemp(prefix="reinforge-", dir=spec["workdir"])
    cfg = build_config({}, reinforge_overrides(spec, out_dir))
    step_prompts: dict[int, list[str]] = {}
    windows: list[tuple[float, float]] = []
    partial: list[dict] = []

    class BenchTrainer(Trainer):
        """Opens the RSS window around measured steps and records which prompts each step drew."""

        def train_step(self, step: int):
            # Peek at the prompts this step will draw, without moving the real sampler.
            # The task is shared, not copied: it may hold locks (and sampling never changes it).
            cur = self.curriculum
            peek = copy.deepcopy(cur, memo={id(cur.task): cur.task} if cur.task is not None else None)
            step_prompts[step] = [self.train_examples[i].id for i in peek.sample(self.cfg.trainer.prompts_per_step)]
            measured = step > warmup
            if measured:
                sampler.open_window()
            t0 = time.perf_counter()
            try:
                metrics = super().train_step(step)
            finally:
                if measured:
                    windows.append((t0, time.perf_counter()))
                    sampler.close_window()
            partial.append({"step": step, "measured": measured, "time_step": metrics["time_step"],
                            "time_generate": metrics["time_collect"],
                            "generated_tokens": metrics["generated_tokens"]})
            _write_partial(result_path, {"steps": partial, "peak_rss_sampled_gb": sampler.peak / GB,
                                         "peak_rss_steps_gb": sampler.peak_window / GB})
            return metrics

    result = BenchTrainer(cfg).run()
    sampler.stop()
    metrics = [json.loads(line) for line in (Path(result.run_dir) / "metrics.jsonl").read_text().splitlines() if line]
    measured = [m for m in metrics if m["step"] > warmup]
    tokens = sum(m["generated_tokens"] for m in measured)
    wall = sum(m["time_step"] for m in measured)
    out = {
        "framework": "reinforge",
        "steps_measured": len(measured),
        "generated_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "step_times_s": [m["time_step"] for m in measured],
        "generate_times_s": [m["time_collect"] for m in measured],
        "generate_share": sum(m["time_collect"] for m in measured) / wall if wall > 0 else None,
        "step_tokens": [m["generated_tokens"] for m in measured],
        "completion_length_mean": [m["completion_length"] for m in measured],
        "reward_mean": [m["reward_mean"] for m in measured],
        "outer_step_times_s": [b - a for a, b in windows],
        "prompt_ids": [step_prompts[s] for s in sorted(step_prompts)],
        "peak_rss_steps_gb": sampler.peak_window / GB,
        "peak_rss_sampled_gb": sampler.peak / GB,
        "ru_maxrss_gb": _ru_maxrss_bytes() / GB,
        "rss_samples": sampler.samples,
        "threads": torch.get_num_threads(),
        "peak_gpu_allocated_gb": _peak_gpu_gb(),
        "settings": {"micro_batch_tokens": cfg.learner.micro_batch_tokens, "loss_agg": cfg.algorithm.loss_agg,
                     "logits_chunk_tokens": cfg.learner.logits_chunk_tokens, "dtype": cfg.model.dtype,
                     "share_prompt_prefix": cfg.learner.share_prompt_prefix,
                     "generation_batch_size": cfg.rollout.generation_batch_size, "betas": list(cfg.learner.betas),
                     "grad_clip": cfg.learner.grad_clip},
        "versions": _versions(),
    }
    Path(result_path).write_text(json.dumps(out))


def trl_args(spec: dict, output_dir: str) -> dict:
    """GRPOConfig arguments matching reinforge's configuration (checked against TRL 1.16)."""
    P, G = spec["prompts"], spec["samples"]
    return dict(
        output_dir=output_dir,
        # One optimizer step = one generation round over P prompts x G samples, no accumulation.
        per_device_train_batch_size=P * G,
        gradient_accumulation_steps=1,
        steps_per_generation=1,  # generation_batch_size = P*G then
        num_generations=G,
        num_iterations=1,  # one optimisation pass per batch (so TRL skips the old-logprob forward)
        shuffle_dataset=False,  # rows are already in reinforge's prompt order
        max_completion_length=spec["max_new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,  # off, as in reinforge
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",  # reinforge: no warm-up, constant lr
        adam_beta1=0.9,
        adam_beta2=0.99,  # reinforge's default betas
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,  # no KL term, no reference model
        loss_type="dapo",  # token mean over the batch = reinforge loss_agg=token_mean
        scale_rewards="group",
        epsilon=0.2,
        bf16=spec.get("dtype", "float32") == "bfloat16",  # mixed precision (autocast), fp32 master weights
        fp16=False,
        gradient_checkpointing=False,  # TRL defaults it ON; reinforge defaults it off
        use_cpu=spec.get("device", "cpu") == "cpu",
        max_steps=spec["warmup"] + spec["steps"],
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        seed=spec["seed"],
        dataloader_num_workers=0,
        remove_unused_columns=False,  # the reward function needs the example_index column
    )


def train_logs_of(log_records: list[dict]) -> list[dict]:
    """TRL's per-step training logs (not the end-of-training summary)."""
    return [entry for entry in log_records if "completions/mean_length" in entry]


def worker_trl(spec: dict, result_path: str) -> None:
    import torch

    torch.set_num_threads(spec["threads"])
    sampler = RssSampler().start()
    import datasets
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from reinforge.config import build_config
    from reinforge.rewards import build_reward
    from reinforge.tasks import build_task, encode_prompt
    from reinforge.curriculum import EpochSampler

    warmup, steps = spec["warmup"], spec["steps"]
    total = warmup + steps
    workdir = tempfile.mkdtemp(prefix="trl-", dir=spec["workdir"])
    cfg = build_config({}, reinforge_overrides(spec, workdir))
    task = build_task(cfg.task)
    train = task.train_examples()
    reward_fn = build_reward(cfg.reward, task)
    order = EpochSampler(len(train), cfg.trainer.seed)
    rows = [{"prompt": train[i].messages, "example_index": i}
            for _ in range(total) for i in order.next(cfg.trainer.prompts_per_step)]
    dataset = datasets.Dataset.from_list(rows)

    tokenizer = AutoTokenizer.from_pretrained(spec["model_path"], local_files_only=True)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(spec["model_path"], dtype=torch.float32, local_files_only=True)

    state = {"step": 0}
    step_tokens: dict[int, int] = {}
    step_prompts: dict[int, list[str]] = {}
    step_rewards: dict[int, float] = {}
    gen_time: dict[int, float] = {}

    def reasoning_gym_score(prompts, completions, completion_ids, example_index, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        outcomes = reward_fn(texts, [train[i] for i in example_index])
        s = state["step"]
        step_tokens[s] = step_tokens.get(s, 0) + sum(len(ids) for ids in completion_ids)
        step_prompts.setdefault(s, [])
        for i in example_index:  # rows of one prompt are contiguous; keep each prompt once
            if not step_prompts[s] or step_prompts[s][-1] != train[i].id:
                step_prompts[s].append(train[i].id)
        rewards = [o.reward for o in outcomes]
        step_rewards[s] = sum(rewards) / len(rewards)
        return rewards

    # Generation time, for the breakdown: TRL calls the model's own generate (no DeepSpeed on CPU).
    original_generate = model.generate

    def timed_generate(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original_generate(*args, **kwargs)
        finally:
            gen_time[state["step"]] = gen_time.get(state["step"], 0.0) + time.perf_counter() - t0

    model.generate = timed_generate

    step_time: dict[int, float] = {}
    log_records: list[dict] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, st, control, **kw):
            state["step"] = st.global_step  # steps completed so far: 0 for the first
            if state["step"] >= warmup:
                sampler.open_window()
            state["t0"] = time.perf_counter()

        def on_step_end(self, args, st, control, **kw):
            s = state["step"]
            step_time[s] = time.perf_counter() - state["t0"]
            if s >= warmup:
                sampler.close_window()
            _write_partial(result_path, {
                "steps": [{"step": k + 1, "measured": k >= warmup, "time_step": step_time[k],
                           "time_generate": gen_time.get(k), "generated_tokens": step_tokens.get(k, 0)}
                          for k in sorted(step_time)],
                "peak_rss_sampled_gb": sampler.peak / GB, "peak_rss_steps_gb": sampler.peak_window / GB})

        def on_log(self, args, st, control, logs=None, **kw):
            if logs:
                log_records.append({k: v for k, v in logs.items() if isinstance(v, (int, float))})

    args = trl_args(spec, workdir)
    accepted = {f.name for f in dataclasses.fields(GRPOConfig)}
    if "activation_checkpointing" in accepted:  # transformers >= 5.x renamed gradient_checkpointing
        args["activation_checkpointing"] = False
    dropped = sorted(k for k in args if k not in accepted)  # fields an older/newer TRL lacks
    args = {k: v for k, v in args.items() if k in accepted}
    grpo_args = GRPOConfig(**args)
    trainer = GRPOTrainer(
        model=model, reward_funcs=[reasoning_gym_score], args=grpo_args, train_dataset=dataset,
        processing_class=tokenizer, callbacks=[StepTimer()],
    )
    # What the model actually does, not what the args say (the flag was renamed in transformers 5).
    checkpointing = any(getattr(mod, "gradient_checkpointing", False) is True for mod in trainer.model.modules())
    trainer.train()
    sampler.stop()

    # Prompt tokens as TRL tokenised them (its cumulative num_tokens minus completions) against
    # reinforge's encoding of the same examples: a check that both fed the model the same prompts.
    P, G = spec["prompts"], spec["samples"]
    cumulative = [entry["num_tokens"] for entry in train_logs_of(log_records)]
    trl_prompt_tokens = [int(c - (cumulative[s - 1] if s else 0) - step_tokens.get(s, 0))
                         for s, c in enumerate(cumulative)]
    by_id = {train[i].id: train[i] for i in {row["example_index"] for row in rows}}
    reinforge_prompt_tokens = [sum(len(encode_prompt(tokenizer, by_id[e])) for e in step_prompts[s]) * G
                               for s in sorted(step_prompts)]

    measured = [s for s in sorted(step_time) if s >= warmup]
    tokens = sum(step_tokens.get(s, 0) for s in measured)
    wall = sum(step_time[s] for s in measured)
    train_logs = train_logs_of(log_records)
    out = {
        "framework": "trl",
        "steps_measured": len(measured),
        "generated_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "step_times_s": [step_time[s] for s in measured],
        "generate_times_s": [gen_time.get(s) for s in measured],
        "generate_share": sum(gen_time.get(s, 0.0) for s in measured) / wall if wall > 0 else None,
        "step_tokens": [step_tokens.get(s, 0) for s in measured],
        # Cross-check of the token count: TRL's own logged mean length x batch size.
        "logged_tokens": [entry["completions/mean_length"] * spec["prompts"] * spec["samples"]
                          for entry in train_logs[warmup:]],
        "completion_length_mean": [step_tokens.get(s, 0) / (spec["prompts"] * spec["samples"]) for s in measured],
        "reward_mean": [step_rewards.get(s) for s in measured],
        "prompt_ids": [step_prompts[s] for s in sorted(step_prompts)],
        "peak_rss_steps_gb": sampler.peak_window / GB,
        "peak_rss_sampled_gb": sampler.peak / GB,
        "ru_maxrss_gb": _ru_maxrss_bytes() / GB,
        "rss_samples": sampler.samples,
        "threads": torch.get_num_threads(),
        "peak_gpu_allocated_gb": _peak_gpu_gb(),
        "prompt_tokens": trl_prompt_tokens,
        "prompt_tokens_reinforge_encoding": reinforge_prompt_tokens,
        "gradient_checkpointing_on": checkpointing,
        "dropped_args": dropped,
        "settings": {k: v for k, v in args.items() if k != "output_dir"}
        | {"optim": str(grpo_args.optim), "generation_batch_size": grpo_args.generation_batch_size,
           "trl_version": trl.__version__},
        "versions": _versions(),
    }
    Path(result_path).write_text(json.dumps(out))


# ------------------------------------------------------------------------------------------------
# parent
# ------------------------------------------------------------------------------------------------
def _run_child(kind: str, spec: dict, workdir: Path, verbose: bool, name: str | None = None) -> dict:
    name = name or kind
    spec_path = workdir / f"spec-{name}.json"
    result_path = workdir / f"result-{name}.json"
    log_path = workdir / f"log-{name}.txt"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--spec", str(spec_path),
           "--result", str(result_path)]
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", str(spec["threads"]))
    print(f"[bench] running {kind} worker ...", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    timeout = spec.get("timeout") or None
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=None if verbose else log, stderr=None if verbose else subprocess.STDOUT,
                                env=env, cwd=str(HERE.parent))
        try:
            proc.wait(timeout=timeout if kind != "prepare" else None)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            proc.wait()
    took = time.perf_counter() - t0
    if proc.returncode != 0 or not result_path.is_file():
        tail = "" if verbose else "\n".join(log_path.read_text().splitlines()[-40:])
        print(f"[bench] {kind} worker failed (exit {proc.returncode}); log {log_path}:\n{tail}",
              file=sys.stderr, flush=True)
        if kind == "prepare":
            raise SystemExit(1)
        # A framework that dies (TRL was killed by the OOM killer on a 24 GB machine) is a result:
        # keep it, and the other framework's numbers.
        killed = proc.returncode == -9
        if timed_out:
            reason = f"timed out after {timeout:.0f} s (--timeout)"
        elif killed:
            reason = "killed by SIGKILL (out of memory?)"
        else:
            reason = f"exit code {proc.returncode}"
        out = {"failed": True, "exit_code": proc.returncode, "process_wall_s": took, "reason": reason,
               "log_tail": tail[-4000:]}
        partial_path = Path(str(result_path) + ".partial")
        if partial_path.is_file():  # the steps it finished before dying
            part = json.loads(partial_path.read_text())
            out["partial"] = part
            steps = part["steps"]
            out["steps_completed"] = len(steps)
            out["peak_rss_sampled_gb"] = part.get("peak_rss_sampled_gb")
            done = [st for st in steps if st["measured"]] or steps  # warm-up steps only if nothing else
            wall = sum(st["time_step"] for st in done)
            out["partial_tokens_per_s"] = sum(st["generated_tokens"] for st in done) / wall if wall else None
            out["partial_from_warmup"] = not any(st["measured"] for st in steps)
        return out
    print(f"[bench] {kind} worker done in {took:.1f}s", file=sys.stderr, flush=True)
    out = json.loads(result_path.read_text())
    out["process_wall_s"] = took
    return out


def _fmt(x, nd=2):
    return "n/a" if x is None else f"{x:.{nd}f}"


def _failed_cell(r: dict, key: str, nd: int) -> str:
    """A framework that died: its reason, and what it measured before (from its partial file)."""
    if key == "tokens_per_s" and r.get("partial_tokens_per_s") is not None:
        src = "its warm-up step" if r.get("partial_from_warmup") else "its finished measured steps"
        return f"~{r['partial_tokens_per_s']:.1f} ({src}; then {r['reason']})"
    if key == "peak_rss_sampled_gb" and r.get("peak_rss_sampled_gb") is not None:
        return f">= {r['peak_rss_sampled_gb']:.2f} (before it died)"
    return f"failed: {r['reason']}"


def markdown_table(record: dict) -> str:
    res = record["results"]
    names = [n for n in FRAMEWORKS if n in res]
    rows = [
        ("tokens/s (end to end)", "tokens_per_s", 1),
        ("generated tokens (measured)", "generated_tokens", 0),
        ("wall time of measured steps (s)", "wall_s", 2),
        ("generation share of step time", "generate_share", 2),
        ("peak RSS during steps (GB)", "peak_rss_steps_gb", 3),
        ("peak RSS whole process, sampled (GB)", "peak_rss_sampled_gb", 3),
        ("peak GPU memory allocated by torch (GB)", "peak_gpu_allocated_gb", 3),
        ("ru_maxrss whole process (GB)", "ru_maxrss_gb", 3),
    ]
    ratio_keys = {"tokens_per_s": "tokens_per_s", "peak_rss_steps_gb": "peak_rss_steps", "ru_maxrss_gb": "ru_maxrss",
                  "peak_gpu_allocated_gb": "peak_gpu"}
    head = "| metric | " + " | ".join(names) + (" | reinforge / TRL |" if len(names) == 2 else " |")
    lines = [head, "|" + "---|" * (len(names) + 1 + (len(names) == 2))]
    for label, key, nd in rows:
        cells = [_failed_cell(res[n], key, nd) if res[n].get("failed") else _fmt(res[n].get(key), nd) for n in names]
        if len(names) == 2:
            r = record["ratios"].get(ratio_keys.get(key, ""))
            cells.append(_fmt(r, 2) if r is not None else "")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _append_result(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    records = []
    if path.is_file():
        try:
            old = json.loads(path.read_text())
            records = old if isinstance(old, list) else [old]
        except json.JSONDecodeError:
            print(f"[bench] {path} is not valid JSON; starting a new list", file=sys.stderr)
    records.append(record)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(records, indent=2) + "\n")
    os.replace(tmp, path)


def parent(args: argparse.Namespace) -> None:
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    for f in frameworks:
        if f not in FRAMEWORKS:
            raise SystemExit(f"--frameworks: unknown {f!r}; accepted: {', '.join(FRAMEWORKS)}")
    variants: dict[str, list[str]] = {}
    for v in args.variant or []:
        name, sep, opts = v.partition(":")
        if not sep or not name or not opts:
            raise SystemExit(f"--variant {v!r}: expected NAME:KEY=VALUE[,KEY=VALUE...]")
        variants[name] = [o.strip() for o in opts.split(",") if o.strip()]
    try:
        threads = args.threads or len(os.sched_getaffinity(0))
    except AttributeError:
        threads = args.threads or os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="bench-vs-trl-") as tmp:
        workdir = Path(tmp)
        spec = {
            "model": args.model, "task": args.task, "task_options": json.loads(args.task_options),
            "prompts": args.prompts, "samples": args.samples, "max_new_tokens": args.max_new_tokens,
            "steps": args.steps, "warmup": args.warmup, "threads": threads, "seed": args.seed,
            "lr": 1e-6, "workdir": str(workdir), "dtype": args.dtype, "timeout": args.timeout,
            "device": args.device,
            "reinforge_overrides": list(args.reinforge_option or []),
        }
        spec.update(_run_child("prepare", spec, workdir, args.verbose))
        results = {f: _run_child(f, spec, workdir, args.verbose) for f in frameworks}
        for name, overrides in variants.items():
            vspec = dict(spec, reinforge_overrides=spec["reinforge_overrides"] + overrides)
            results[f"reinforge[{name}]"] = _run_child("reinforge", vspec, workdir, args.verbose, name=f"variant-{name}")
        if args.keep_logs:
            keep = Path(args.keep_logs)
            keep.mkdir(parents=True, exist_ok=True)
            for p in workdir.glob("log-*.txt"):
                (keep / p.name).write_text(p.read_text())

    ratios = {}
    ok = {f: r for f, r in results.items() if not r.get("failed")}
    if "reinforge" in ok and results.get("trl", {}).get("failed") and results["trl"].get("partial_tokens_per_s"):
        # TRL died: compare with what it measured before (approximate, marked as such).
        r, t = results["reinforge"], results["trl"]
        ratios = {"tokens_per_s_vs_trl_partial": r["tokens_per_s"] / t["partial_tokens_per_s"],
                  "peak_rss_vs_trl_at_death_at_most": r["peak_rss_steps_gb"] / t["peak_rss_sampled_gb"]
                  if t.get("peak_rss_sampled_gb") else None}
    if all(f in ok for f in FRAMEWORKS):
        r, t = results["reinforge"], results["trl"]

        def ratio(a, b):
            return a / b if a is not None and b else None

        ratios = {
            "tokens_per_s": ratio(r["tokens_per_s"], t["tokens_per_s"]),
            "peak_rss_steps": ratio(r["peak_rss_steps_gb"], t["peak_rss_steps_gb"]),
            "ru_maxrss": ratio(r["ru_maxrss_gb"], t["ru_maxrss_gb"]),
            "peak_gpu": ratio(r.get("peak_gpu_allocated_gb"), t.get("peak_gpu_allocated_gb")),
        }
        ratios["prompts_match"] = r["prompt_ids"] == t["prompt_ids"]
    if "trl" in ok:
        t = ok["trl"]
        for name in variants:
            r = ok.get(f"reinforge[{name}]")
            if r is not None:
                ratios[f"variant:{name}"] = {
                    "tokens_per_s": r["tokens_per_s"] / t["tokens_per_s"],
                    "peak_rss_steps": r["peak_rss_steps_gb"] / t["peak_rss_steps_gb"],
                    "ru_maxrss": r["ru_maxrss_gb"] / t["ru_maxrss_gb"],
                }
        ratios["trl_prompt_tokens_match_reinforge_encoding"] = t["prompt_tokens"] == t["prompt_tokens_reinforge_encoding"]
    versions = next(iter(ok.values()))["versions"] if ok else _versions()  # metadata only: no torch import
    spec_out = {k: v for k, v in spec.items() if k != "workdir"}
    record = {
        "benchmark": "vs_trl",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "host": {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
                 "processor": platform.processor()},
        "versions": versions,
        "config": spec_out,
        "results": results,
        "ratios": ratios,
        "note": "ratios are reinforge / TRL: tokens_per_s > 1 means reinforge is faster; "
                "memory < 1 means reinforge uses less.",
    }
    table = markdown_table(record)
    print()
    print(f"### reinforge vs TRL {versions.get('trl')} GRPOTrainer: model `{args.model}`, task `{args.task}`, "
          f"{args.prompts} prompts x {args.samples} samples, {args.max_new_tokens} new tokens, "
          f"{args.steps} measured steps after {args.warmup} warm-up, {threads} threads, {args.dtype}"
          + (f", reinforge {' '.join(args.reinforge_option)}" if args.reinforge_option else ""))
    print()
    print(table)
    if variants:
        print("\n| reinforge variant | overrides | tokens/s | peak RSS during steps (GB) | tokens/s / TRL | peak RSS / TRL |")
        print("|---|---|---|---|---|---|")
        for name, overrides in variants.items():
            r, q = results[f"reinforge[{name}]"], ratios.get(f"variant:{name}", {})
            if r.get("failed"):
                print(f"| {name} | {' '.join(overrides)} | failed: {r['reason']} | | | |")
                continue
            print(f"| {name} | {' '.join(overrides)} | {_fmt(r['tokens_per_s'], 1)} | {_fmt(r['peak_rss_steps_gb'], 3)} "
                  f"| {_fmt(q.get('tokens_per_s'))} | {_fmt(q.get('peak_rss_steps'))} |")
    if "tokens_per_s_vs_trl_partial" in ratios:
        print(f"\nTRL did not finish; reinforge / TRL from TRL's finished steps: tokens/s "
              f"{_fmt(ratios['tokens_per_s_vs_trl_partial'])}, peak RSS at most "
              f"{_fmt(ratios['peak_rss_vs_trl_at_death_at_most'])} (TRL's RSS when it died is a lower bound)")
    if "prompts_match" in ratios:
        print(f"\nsame prompts in the same order in both: {ratios['prompts_match']}")
    if "trl_prompt_tokens_match_reinforge_encoding" in ratios:
        print(f"TRL's prompt token counts equal reinforge's encoding of the same prompts: "
              f"{ratios['trl_prompt_tokens_match_reinforge_encoding']}")
    if results.get("trl", {}).get("gradient_checkpointing_on"):
        print("WARNING: gradient checkpointing was ON in TRL despite the args", file=sys.stderr)
    out = Path(args.out)
    _append_result(out, record)
    print(f"results appended to {out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2",
                   help="smollm2: SmolLM2-135M-Instruct (the default reinforge model); tiny: a 2-layer "
                        "random Llama with the SmolLM2 tokenizer (a quick check only)")
    p.add_argument("--task", default="leg_counting", help="reasoning-gym task name")
    p.add_argument("--task-options", default="{}", help="JSON dict of reasoning-gym options")
    p.add_argument("--prompts", type=int, default=8, help="prompts per step (P)")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt (G)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=2, help="measured steps")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps before them")
    p.add_argument("--threads", type=int, default=0, help="torch threads per worker (0: all cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="both frameworks: reinforge model.device, TRL use_cpu (TRL generates with "
                        "transformers' generate on the GPU; its vLLM mode needs vLLM installed)")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="both frameworks: fp32, or bf16 mixed precision (autocast over fp32 master weights: "
                        "reinforge model.dtype=bfloat16, TRL bf16=True)")
    p.add_argument("--timeout", type=float, default=0,
                   help="seconds a framework's worker may run before it is killed and reported as timed out "
                        "with the steps it finished (0: no limit)")
    p.add_argument("--reinforge-option", action="append", metavar="KEY=VALUE",
                   help="extra reinforge config override, e.g. learner.logits_chunk_tokens=0 (repeatable)")
    p.add_argument("--frameworks", default="reinforge,trl", help="comma list, run in this order")
    p.add_argument("--variant", action="append", metavar="NAME:KEY=VALUE[,KEY=VALUE...]",
                   help="an extra reinforge run with these config overrides on top of the shared ones, "
                        "after the frameworks, compared with the same TRL run (repeatable)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results JSON (a list; this run is appended)")
    p.add_argument("--keep-logs", default=None, help="copy the workers' logs into this folder")
    p.add_argument("--verbose", action="store_true", help="show the workers' output instead of logging it")
    # internal: one worker process
    p.add_argument("--worker", choices=["prepare", *FRAMEWORKS], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        spec = json.loads(Path(args.spec).read_text())
        {"prepare": worker_prepare, "reinforge": worker_reinforge, "trl": worker_trl}[args.worker](spec, args.result)
        return
    if args.steps < 1 or args.warmup < 0 or args.samples < 2 or args.prompts < 1:
        p.error("need --steps >= 1, --warmup >= 0, --samples >= 2 (GRPO groups), --prompts >= 1")
    parent(args)


if __name__ == "__main__":
    main()
