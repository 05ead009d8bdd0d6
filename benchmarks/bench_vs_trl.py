"""reinforge vs TRL's GRPOTrainer: the same RL step configuration, side by side, on CPU.

Measures, for each framework, generated completion tokens per second end to end (generation,
reward, update: the whole RL step) and peak resident memory, then their ratios.

Each framework runs in a fresh subprocess of this script (``--worker NAME``), so the peak RSS of
one is not polluted by the other, or by the parent (the parent imports neither torch nor
transformers; preparing the model, and reading the CPU's capabilities, happen in a subprocess of
their own).

Frameworks: ``reinforge``; ``trl`` (GRPOTrainer, the whole P*G batch in one forward/backward);
``trl_accum`` (GRPOTrainer, memory-matched: the same one generation of P*G completions and one
optimizer step per RL step, the update in ``--trl-accum`` micro-batches by gradient
accumulation). ``--pairs N`` runs every framework N times, alternating the order (odd rounds as
given, even rounds reversed), and reports each round, then the median and range.

Same configuration for all: model, prompts (same reasoning-gym task, options and seed, in the
same order: the order reinforge's seeded EpochSampler draws them), G samples per prompt, max new
tokens, temperature 1.0, top_p 1.0 (no top-k), lr 1e-6, AdamW betas (0.9, 0.99), constant lr,
grad-norm clip 1.0, no KL term, one optimisation pass per batch, the same explicit dtype
(``--dtype``: reinforge model.dtype, TRL bf16=True/False over fp32 weights), no gradient
checkpointing, the same reward function (reinforge's reward built from the task: the
reasoning-gym score of the answer in the completion text), token-mean loss aggregation (TRL
loss_type="dapo"), group-std scaled advantages.

    python benchmarks/bench_vs_trl.py --model tiny --steps 2 --warmup 1 --max-new-tokens 16 --pairs 1  # quick check
    python benchmarks/bench_vs_trl.py    # SmolLM2-135M, fp32, reinforge vs trl vs trl_accum, 3 pairs

Tokens/s = real (unpadded, up to and including the stop token) completion tokens summed over the
measured steps / summed wall time of the measured steps. A step is one RL step: one generation
round and one optimizer step (for trl_accum, all its micro-batches). Warm-up steps are run but
not measured.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime as _dt
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results" / "vs_trl.json"
FRAMEWORKS = ("reinforge", "trl", "trl_accum")
TRL_KINDS = ("trl", "trl_accum")
GB = 1024**3
RSS_LIMIT_EXIT = 75  # a worker's exit code when it stopped itself at --rss-limit-gb


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

    def __init__(self, interval: float = 0.2, limit_gb: float = 0.0, marker: str | None = None):
        self.interval = interval
        # A soft memory ceiling (--rss-limit-gb): past it the worker ends itself, before the
        # kernel's OOM killer picks a victim on a shared machine.
        self.limit = int(limit_gb * GB)
        self.marker = marker
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
        if self.limit and rss > self.limit:
            if self.marker:
                Path(self.marker).write_text(json.dumps({"rss_gb": rss / GB, "limit_gb": self.limit / GB}))
            os._exit(RSS_LIMIT_EXIT)

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
    """Resolve (or build) the model both frameworks load, and read the hardware (CPU model,
    instruction-set capability, native bf16 or not); run in its own process so the parent stays
    small (a forked child starts with its parent's RSS as its ru_maxrss floor)."""
    import torch

    from reinforge.models import default_model_path
    from reinforge.precision import describe_cpu, hardware_info

    torch.set_num_threads(spec["threads"])
    hardware = hardware_info(spec.get("device", "cpu"))
    hardware["describe"] = describe_cpu(hardware)

    smol = default_model_path()  # converts the shipped GGUF once and caches it
    if spec["model"] == "smollm2":
        out = {"model_path": str(smol), "reinforge_model_path": "smollm2-135m-instruct"}
    else:
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
    out["hardware"] = hardware
    Path(result_path).write_text(json.dumps(out))


def _peak_gpu_gb() -> float | None:
    """Peak memory torch allocated on the GPU in this worker (None on a CPU run)."""
    import torch

    return torch.cuda.max_memory_allocated() / GB if torch.cuda.is_available() else None


def worker_reinforge(spec: dict, result_path: str) -> None:
    import torch

    torch.set_num_threads(spec["threads"])
    sampler = RssSampler(limit_gb=spec.get("rss_limit_gb", 0), marker=result_path + ".rsslimit").start()
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

    trainer = BenchTrainer(cfg)
    result = trainer.run()
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
        # The dtype the run computed in (model.dtype as resolved by the trainer) and why.
        "precision": getattr(trainer, "precision", None),
        "settings": {"micro_batch_tokens": cfg.learner.micro_batch_tokens, "loss_agg": cfg.algorithm.loss_agg,
                     "logits_chunk_tokens": cfg.learner.logits_chunk_tokens, "dtype": trainer.cfg.model.dtype,
                     "share_prompt_prefix": cfg.learner.share_prompt_prefix,
                     "generation_batch_size": cfg.rollout.generation_batch_size, "betas": list(cfg.learner.betas),
                     "grad_clip": cfg.learner.grad_clip},
        "versions": _versions(),
    }
    Path(result_path).write_text(json.dumps(out))


def trl_args(spec: dict, output_dir: str, accum: int = 1) -> dict:
    """GRPOConfig arguments matching reinforge's configuration (checked against TRL 1.16).

    One optimizer step = one generation round over P prompts x G samples. ``accum`` > 1 splits
    its update into that many micro-batches (the memory-matched ``trl_accum``): TRL generates
    per_device_train_batch_size * steps_per_generation = P*G completions at the first micro-step
    and feeds the buffered slices to the others; since gradient_accumulation_steps is a multiple
    of steps_per_generation * num_iterations the samples are on-policy (no old-logprob forward),
    and the dapo loss is normalised by the whole generation batch's token count, so the gradient
    is the same token mean as with accum=1."""
    P, G = spec["prompts"], spec["samples"]
    if (P * G) % accum:
        raise ValueError(f"--trl-accum {accum} must divide prompts x samples = {P * G}")
    return dict(
        output_dir=output_dir,
        per_device_train_batch_size=P * G // accum,
        gradient_accumulation_steps=accum,
        steps_per_generation=accum,  # generation_batch_size = P*G then
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


def worker_trl(spec: dict, result_path: str, accum: int = 1) -> None:
    import torch

    torch.set_num_threads(spec["threads"])
    sampler = RssSampler(limit_gb=spec.get("rss_limit_gb", 0), marker=result_path + ".rsslimit").start()
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
        state["reward_calls"] = state.get("reward_calls", 0) + 1
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
    micro_batches: dict[int, int] = {}
    log_records: list[dict] = []

    # transformers calls on_step_begin before the first micro-batch of an optimizer step and
    # on_step_end after the optimizer step, so with gradient accumulation a timed step still
    # covers one generation and all its micro-batches (global_step counts optimizer steps).
    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, st, control, **kw):
            state["step"] = st.global_step  # steps completed so far: 0 for the first
            if state["step"] >= warmup:
                sampler.open_window()
            state["micro"] = 1
            state["t0"] = time.perf_counter()

        def on_substep_end(self, args, st, control, **kw):
            state["micro"] += 1  # a micro-batch that did not end in an optimizer step

        def on_step_end(self, args, st, control, **kw):
            s = state["step"]
            step_time[s] = time.perf_counter() - state["t0"]
            micro_batches[s] = state["micro"]
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

    args = trl_args(spec, workdir, accum)
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
    # What precision TRL actually trains in: accelerate's autocast mode and the weights' dtype.
    precision = {"mixed_precision": str(trainer.accelerator.mixed_precision),
                 "param_dtype": str(next(trainer.model.parameters()).dtype).removeprefix("torch."),
                 "bf16": grpo_args.bf16, "fp16": grpo_args.fp16}
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
    optimizer_steps = trainer.state.global_step
    out = {
        "framework": "trl_accum" if accum > 1 else "trl",
        "steps_measured": len(measured),
        "optimizer_steps": optimizer_steps,  # must equal warm-up + measured steps
        "reward_calls": state.get("reward_calls", 0),  # one per generation round: one per step
        "micro_batches_per_step": [micro_batches.get(s) for s in measured],  # inside each timed step
        "precision": precision,
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
           "steps_per_generation": grpo_args.steps_per_generation, "trl_version": trl.__version__},
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
    print(f"[bench] running {name} worker ...", file=sys.stderr, flush=True)
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
        print(f"[bench] {name} worker failed (exit {proc.returncode}); log {log_path}:\n{tail}",
              file=sys.stderr, flush=True)
        if kind == "prepare":
            raise SystemExit(1)
        # A framework that dies (TRL was killed by the OOM killer on a 24 GB machine) is a result:
        # keep it, and the other framework's numbers.
        killed = proc.returncode == -9
        marker = Path(str(result_path) + ".rsslimit")
        at_limit = json.loads(marker.read_text()) if marker.is_file() else None
        if timed_out:
            reason, short = f"timed out after {timeout:.0f} s (--timeout)", "timed out"
        elif at_limit:
            reason = (f"stopped itself at {at_limit['rss_gb']:.2f} GB RSS, over --rss-limit-gb "
                      f"{at_limit['limit_gb']:.1f}")
            short = "over --rss-limit-gb"
        elif killed:
            reason, short = "killed by SIGKILL (out of memory?)", "killed (OOM?)"
        else:
            reason, short = f"exit code {proc.returncode}", f"exit {proc.returncode}"
        out = {"failed": True, "exit_code": proc.returncode, "process_wall_s": took, "reason": reason,
               "reason_short": short, "log_tail": tail[-4000:]}
        partial_path = Path(str(result_path) + ".partial")
        if partial_path.is_file():  # the steps it finished before dying
            part = json.loads(partial_path.read_text())
            out["partial"] = part
            steps = part["steps"]
            out["steps_completed"] = len(steps)
            out["peak_rss_sampled_gb"] = max(part.get("peak_rss_sampled_gb") or 0.0,
                                             at_limit["rss_gb"] if at_limit else 0.0) or None
            done = [st for st in steps if st["measured"]] or steps  # warm-up steps only if nothing else
            wall = sum(st["time_step"] for st in done)
            out["partial_tokens_per_s"] = sum(st["generated_tokens"] for st in done) / wall if wall else None
            out["partial_from_warmup"] = not any(st["measured"] for st in steps)
        elif at_limit:
            out["peak_rss_sampled_gb"] = at_limit["rss_gb"]
        return out
    print(f"[bench] {name} worker done in {took:.1f}s", file=sys.stderr, flush=True)
    out = json.loads(result_path.read_text())
    out["process_wall_s"] = took
    return out


def _fmt(x, nd=2):
    return "n/a" if x is None else f"{x:.{nd}f}"


def _ratio(a, b):
    return a / b if a is not None and b else None


def _median_range(values) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def _is_reinforge(name: str) -> bool:
    return name == "reinforge" or name.startswith("reinforge[")


def ratio_pairs(names: list[str]) -> list[tuple[str, str]]:
    """(numerator, denominator) of the ratios a round reports: each reinforge run over each TRL
    run, and the memory-matched TRL over plain TRL (what its accumulation costs and saves)."""
    pairs = [(n, d) for n in names if _is_reinforge(n) for d in TRL_KINDS if d in names]
    if "trl" in names and "trl_accum" in names:
        pairs.append(("trl_accum", "trl"))
    return pairs


def round_ratios(results: dict, pairs: list[tuple[str, str]]) -> dict:
    out = {}
    for num, den in pairs:
        r, t = results[num], results[den]
        if r.get("failed"):
            continue
        if not t.get("failed"):
            out[f"{num} / {den}"] = {
                "tokens_per_s": _ratio(r["tokens_per_s"], t["tokens_per_s"]),
                "peak_rss_steps": _ratio(r["peak_rss_steps_gb"], t["peak_rss_steps_gb"]),
                "ru_maxrss": _ratio(r["ru_maxrss_gb"], t["ru_maxrss_gb"]),
                "peak_gpu": _ratio(r.get("peak_gpu_allocated_gb"), t.get("peak_gpu_allocated_gb")),
            }
        elif t.get("partial_tokens_per_s"):
            # The denominator died: compare with what it measured before (approximate), and with
            # its RSS when it died (a lower bound of its peak, so the ratio is an upper bound).
            out[f"{num} / {den}"] = {
                "approximate": True,
                "tokens_per_s": _ratio(r["tokens_per_s"], t["partial_tokens_per_s"]),
                "peak_rss_steps_at_most": _ratio(r["peak_rss_steps_gb"], t.get("peak_rss_sampled_gb")),
            }
    return out


SUMMARY_KEYS = ("tokens_per_s", "generated_tokens", "wall_s", "generate_share", "peak_rss_steps_gb",
                "peak_rss_sampled_gb", "peak_gpu_allocated_gb", "ru_maxrss_gb")
RATIO_KEYS = ("tokens_per_s", "peak_rss_steps", "ru_maxrss", "peak_gpu")


def summarize(rounds: list[dict], names: list[str], pairs: list[tuple[str, str]]) -> dict:
    """Median and range over the pairs (rounds) of each framework's numbers and of each ratio;
    a ratio against a framework that died in a round is left out (it is approximate)."""
    frameworks = {}
    for n in names:
        ok = [rd["results"][n] for rd in rounds if not rd["results"][n].get("failed")]
        frameworks[n] = {k: _median_range([r.get(k) for r in ok]) for k in SUMMARY_KEYS}
        frameworks[n]["rounds_ok"] = len(ok)
    ratios = {}
    for num, den in pairs:
        key = f"{num} / {den}"
        complete = [rd["ratios"][key] for rd in rounds
                    if key in rd["ratios"] and not rd["ratios"][key].get("approximate")]
        ratios[key] = {k: _median_range([c.get(k) for c in complete]) for k in RATIO_KEYS}
        ratios[key]["rounds_complete"] = len(complete)
    return {"frameworks": frameworks, "ratios": ratios, "rounds": len(rounds)}


def _died_cell(r: dict, key: str, nd: int) -> str:
    """A framework that died in a round: what it measured before, and why it stopped."""
    if key == "tokens_per_s" and r.get("partial_tokens_per_s") is not None:
        src = "warm-up" if r.get("partial_from_warmup") else "finished steps"
        return f"~{r['partial_tokens_per_s']:.{nd}f} ({src}; {r.get('reason_short', 'died')})"
    if key.startswith("peak_rss") and r.get("peak_rss_sampled_gb") is not None:
        return f">= {r['peak_rss_sampled_gb']:.{nd}f} ({r.get('reason_short', 'died')})"
    return r.get("reason_short", "died")


def _mr_cells(mr: dict | None, nd: int, of: int) -> list[str]:
    if mr is None:
        return ["n/a", "n/a"]
    med = _fmt(mr["median"], nd) + (f" ({mr['n']} of {of})" if mr["n"] < of else "")
    return [med, f"{mr['min']:.{nd}f}-{mr['max']:.{nd}f}"]


def rounds_table(record: dict) -> str:
    """One column per pair (every framework once, alternating order), then median and range."""
    rounds, names, summary = record["rounds"], record["frameworks"], record["summary"]
    n = len(rounds)
    lines = ["| | " + " | ".join(f"pair {i + 1}" for i in range(n)) + " | median | range |",
             "|---|" + "---|" * (n + 2)]
    gpu = any(rd["results"][f].get("peak_gpu_allocated_gb") is not None for rd in rounds for f in names)
    rows = [("tokens/s", "tokens_per_s", 1), ("peak RSS during steps (GB)", "peak_rss_steps_gb", 2)]
    if gpu:
        rows.append(("peak GPU allocated (GB)", "peak_gpu_allocated_gb", 2))
    for label, key, nd in rows:
        for f in names:
            cells = [_died_cell(rd["results"][f], key, nd) if rd["results"][f].get("failed")
                     else _fmt(rd["results"][f].get(key), nd) for rd in rounds]
            cells += _mr_cells(summary["frameworks"][f][key], nd, n)
            lines.append(f"| {f} {label} | " + " | ".join(cells) + " |")
    ratio_rows = [("tokens/s", "tokens_per_s", "peak_rss_steps_at_most", "~"),
                  ("peak RSS", "peak_rss_steps", "peak_rss_steps_at_most", "<= ")]
    if gpu:
        ratio_rows.append(("peak GPU", "peak_gpu", None, ""))
    for key in summary["ratios"]:
        for label, rk, approx_rk, mark in ratio_rows:
            cells = []
            for rd in rounds:
                q = rd["ratios"].get(key)
                if q is None:
                    cells.append("")
                elif q.get("approximate"):
                    v = q.get("tokens_per_s") if rk == "tokens_per_s" else q.get(approx_rk) if approx_rk else None
                    cells.append(f"{mark}{v:.2f}" if v is not None else "")
                else:
                    cells.append(_fmt(q.get(rk)))
            cells += _mr_cells(summary["ratios"][key][rk], 2, n)
            lines.append(f"| {key} {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(record: dict) -> str:
    """Every framework's numbers, the median over the pairs it finished."""
    rounds, names, summary = record["rounds"], record["frameworks"], record["summary"]
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
    lines = ["| metric (median over pairs) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, key, nd in rows:
        mrs = [summary["frameworks"][f][key] for f in names]
        if key == "peak_gpu_allocated_gb" and not any(mrs):
            continue  # a CPU run
        lines.append(f"| {label} | " + " | ".join(_fmt(mr["median"], nd) if mr else "n/a" for mr in mrs) + " |")
    steps = []
    for f in names:
        per = [", ".join(f"{t:.1f}" for t in rd["results"][f].get("step_times_s", []))
               if not rd["results"][f].get("failed") else "died" for rd in rounds]
        steps.append("; ".join(per))
    lines.append("| measured step times (s), pair by pair | " + " | ".join(steps) + " |")
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


def hardware_line(hardware: dict) -> str:
    """'AMD EPYC (AVX2, no native bf16); torch CPU capability AVX2, native bf16: no; 2 threads'."""
    cpu = hardware.get("cpu", {})
    line = (f"{hardware.get('describe', cpu.get('model', '?'))}; torch CPU capability "
            f"{cpu.get('capability', '?')}, native bf16: {'yes' if cpu.get('native_bf16') else 'no'} "
            f"(avx512_bf16 {cpu.get('avx512_bf16')}, amx_tile {cpu.get('amx_tile')}); "
            f"{hardware.get('threads', '?')} threads per worker")
    gpu = hardware.get("gpu")
    if gpu:
        line += (f"; GPU {gpu.get('name')} (compute capability {gpu.get('compute_capability')}, "
                 f"native bf16: {'yes' if gpu.get('native_bf16') else 'no'})")
    return line


def dtype_line(record: dict) -> str:
    """The dtype each framework actually computed in, as its worker recorded it."""
    dtype = record["config"]["dtype"]
    seen = {}
    for rd in record["rounds"]:
        for f, r in rd["results"].items():
            if r.get("failed") or f in seen:
                continue
            p = r.get("precision") or {}
            if _is_reinforge(f):
                seen[f] = f"{f} model.dtype={p.get('dtype', r.get('settings', {}).get('dtype'))}"
            else:
                seen[f] = (f"{f} bf16={p.get('bf16')} (accelerate mixed_precision={p.get('mixed_precision')}, "
                           f"weights {p.get('param_dtype')})")
    return f"{dtype} for every framework, explicit: " + "; ".join(seen.values())


def report(record: dict) -> str:
    """The Markdown a run prints (also ``--report FILE``, from its results JSON)."""
    c, rounds, names, hardware = record["config"], record["rounds"], record["frameworks"], record["hardware"]
    ok = [r for rd in rounds for r in rd["results"].values() if not r.get("failed")]
    out = [f"### reinforge vs TRL {record['versions'].get('trl')} GRPOTrainer: model `{c['model']}`, task "
           f"`{c['task']}`, {c['prompts']} prompts x {c['samples']} samples, {c['max_new_tokens']} new tokens, "
           f"{c['steps']} measured steps after {c['warmup']} warm-up, {len(rounds)} alternating pair(s), "
           f"{c['threads']} threads, {c['dtype']}"
           + (f", reinforge {' '.join(c['reinforge_overrides'])}" if c.get("reinforge_overrides") else ""),
           "", rounds_table(record), "",
           "Order: " + "; ".join(f"pair {i + 1}: {', '.join(rd['order'])}" for i, rd in enumerate(rounds))]
    for i, rd in enumerate(rounds):
        for f, r in rd["results"].items():
            if r.get("failed"):
                out.append(f"- pair {i + 1}, {f}: {r['reason']}"
                           + (f", after {r['steps_completed']} step(s)" if "steps_completed" in r else ""))
    out += ["", detail_table(record), ""]
    for name, overrides in (record.get("variants") or {}).items():
        out.append(f"- `reinforge[{name}]`: {' '.join(overrides)}")
    if "trl_accum" in names:
        n, batch = c["trl_accum"], c["prompts"] * c["samples"]
        out.append(f"- `trl_accum`: per_device_train_batch_size={batch // n}, gradient_accumulation_steps={n}, "
                   f"steps_per_generation={n}: one generation of {batch} completions and one optimizer step "
                   f"per RL step, the update in {n} micro-batches")
    out.append(f"- CPU: {hardware_line(hardware)}")
    out.append(f"- dtype: {dtype_line(record)}")
    if c["dtype"] == "bfloat16" and c.get("device", "cpu") == "cpu" and not hardware.get("cpu", {}).get("native_bf16"):
        probe = next((r["precision"]["probe"] for r in ok
                      if _is_reinforge(r.get("framework", "")) and (r.get("precision") or {}).get("probe")), None)
        out.append("- WARNING: this CPU has no native bf16, so bf16 is emulated in both frameworks"
                   + (f" (reinforge's probe: a bf16 linear ran {probe['bf16_speedup']:.2f}x the speed of fp32)"
                      if probe else "") + "; these numbers do not describe a CPU with AVX512-BF16 or AMX")
    labels = {"prompts_match": "same prompts in the same order in every run",
              "trl_prompt_tokens_match_reinforge_encoding": "TRL's prompt token counts equal reinforge's encoding",
              "trl_one_generation_one_optimizer_step_per_step": "TRL: one generation and one optimizer step per step",
              "trl_timed_steps_cover_all_micro_batches": "TRL: each timed step covers all its micro-batches",
              "trl_gradient_checkpointing_off": "TRL: gradient checkpointing off"}
    out += [f"- {labels.get(k, k)}: {v}" for k, v in record.get("checks", {}).items() if v is not None]
    out.append(f"- command: `{record['command']}`")
    return "\n".join(out)


def parent(args: argparse.Namespace) -> None:
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    for f in frameworks:
        if f not in FRAMEWORKS:
            raise SystemExit(f"--frameworks: unknown {f!r}; accepted: {', '.join(FRAMEWORKS)}")
    if len(set(frameworks)) != len(frameworks):
        raise SystemExit(f"--frameworks: {args.frameworks!r} names one twice")
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
            "device": args.device, "trl_accum": args.trl_accum, "rss_limit_gb": args.rss_limit_gb,
            "reinforge_overrides": list(args.reinforge_option or []),
        }
        prepared = _run_child("prepare", spec, workdir, args.verbose)
        hardware = prepared.pop("hardware", {})
        prepared.pop("process_wall_s", None)
        spec.update(prepared)
        # (label, worker kind, spec) of every run in a pair; variants are reinforge runs.
        entries = [(f, f, spec) for f in frameworks]
        entries += [(f"reinforge[{name}]", "reinforge",
                     dict(spec, reinforge_overrides=spec["reinforge_overrides"] + overrides))
                    for name, overrides in variants.items()]
        names = [label for label, _, _ in entries]
        pairs = ratio_pairs(names)
        rounds = []
        for i in range(args.pairs):
            # Alternate the order, so that neither framework always runs first (or on a machine
            # warmed, or slowed, by the other).
            order = entries if i % 2 == 0 else entries[::-1]
            results = {}
            for label, kind, espec in order:
                tag = label.replace("[", "-").replace("]", "")
                results[label] = _run_child(kind, espec, workdir, args.verbose, name=f"{tag}-pair{i + 1}")
            rounds.append({"order": [label for label, _, _ in order], "results": results,
                           "ratios": round_ratios(results, pairs)})
        if args.keep_logs:
            keep = Path(args.keep_logs)
            keep.mkdir(parents=True, exist_ok=True)
            for p in workdir.glob("log-*.txt"):
                (keep / p.name).write_text(p.read_text())

    ok = [r for rd in rounds for r in rd["results"].values() if not r.get("failed")]
    versions = ok[0]["versions"] if ok else _versions()  # metadata only: no torch import
    spec_out = {k: v for k, v in spec.items() if k != "workdir"}
    command = shlex.join(["python", "benchmarks/bench_vs_trl.py", *args.argv])
    record = {
        "benchmark": "vs_trl",
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "host": {"platform": platform.platform(), "machine": platform.machine(), "cpus": os.cpu_count(),
                 "processor": platform.processor()},
        "hardware": hardware,
        "versions": versions,
        "config": spec_out,
        "frameworks": names,
        "variants": variants,
        "rounds": rounds,
        "summary": summarize(rounds, names, pairs),
        "note": "ratios are numerator / denominator: tokens_per_s > 1 means the numerator is faster; "
                "memory < 1 means it uses less. Each pair runs every framework once, in alternating order.",
    }
    # Checks that every framework did the same work: same prompts in the same order, TRL's prompt
    # tokens as reinforge encodes them, one generation and one optimizer step per RL step.
    prompt_lists = [r["prompt_ids"] for r in ok if "prompt_ids" in r]
    checks = {"prompts_match": all(p == prompt_lists[0] for p in prompt_lists) if len(prompt_lists) > 1 else None}
    trl_ok = [r for r in ok if r.get("framework") in TRL_KINDS]
    if trl_ok:
        checks["trl_prompt_tokens_match_reinforge_encoding"] = all(
            r["prompt_tokens"] == r["prompt_tokens_reinforge_encoding"] for r in trl_ok)
        total = args.warmup + args.steps
        checks["trl_one_generation_one_optimizer_step_per_step"] = all(
            r.get("optimizer_steps") == total and r.get("reward_calls") == total for r in trl_ok)
        checks["trl_timed_steps_cover_all_micro_batches"] = all(
            set(r.get("micro_batches_per_step") or [None]) == {args.trl_accum if r["framework"] == "trl_accum" else 1}
            for r in trl_ok)
        checks["trl_gradient_checkpointing_off"] = not any(r.get("gradient_checkpointing_on") for r in trl_ok)
    record["checks"] = checks
    print()
    print(report(record))
    if checks.get("trl_gradient_checkpointing_off") is False:
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
    p.add_argument("--frameworks", default="reinforge,trl,trl_accum",
                   help="comma list, run in this order in odd pairs and reversed in even ones; trl_accum is "
                        "TRL memory-matched by gradient accumulation (--trl-accum)")
    p.add_argument("--pairs", type=int, default=3,
                   help="alternating pairs: each runs every framework once, each in a fresh process; "
                        "the tables give each pair, then the median and range")
    p.add_argument("--trl-accum", type=int, default=4,
                   help="trl_accum: micro-batches per optimizer step (per_device_train_batch_size = P*G / N, "
                        "gradient_accumulation_steps = steps_per_generation = N): still one generation of P*G "
                        "completions and one optimizer step per RL step")
    p.add_argument("--rss-limit-gb", type=float, default=0,
                   help="a worker whose RSS passes this stops itself and is reported with the steps it "
                        "finished, before the kernel's OOM killer acts on a shared machine (0: no limit)")
    p.add_argument("--variant", action="append", metavar="NAME:KEY=VALUE[,KEY=VALUE...]",
                   help="an extra reinforge run with these config overrides on top of the shared ones, "
                        "after the frameworks in each pair, compared with the same pair's TRL runs (repeatable)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="results JSON (a list; this run is appended)")
    p.add_argument("--keep-logs", default=None, help="copy the workers' logs into this folder")
    p.add_argument("--verbose", action="store_true", help="show the workers' output instead of logging it")
    p.add_argument("--report", metavar="RESULTS_JSON", help="print the Markdown of the last run in this results "
                   "file and exit (runs nothing)")
    # internal: one worker process
    p.add_argument("--worker", choices=["prepare", *FRAMEWORKS], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.report:
        records = json.loads(Path(args.report).read_text())
        records = [r for r in (records if isinstance(records, list) else [records]) if "rounds" in r]
        if not records:
            raise SystemExit(f"--report: no run of this version of the script in {args.report}")
        print(report(records[-1]))
        return
    if args.worker:
        spec = json.loads(Path(args.spec).read_text())
        workers = {"prepare": worker_prepare, "reinforge": worker_reinforge, "trl": worker_trl,
                   "trl_accum": lambda sp, res: worker_trl(sp, res, accum=sp["trl_accum"])}
        workers[args.worker](spec, args.result)
        return
    if args.steps < 1 or args.warmup < 0 or args.samples < 2 or args.prompts < 1 or args.pairs < 1:
        p.error("need --steps >= 1, --warmup >= 0, --samples >= 2 (GRPO groups), --prompts >= 1, --pairs >= 1")
    if args.trl_accum < 2 or (args.prompts * args.samples) % args.trl_accum:
        p.error(f"--trl-accum must be >= 2 and divide prompts x samples ({args.prompts * args.samples})")
    if args.steps < 2 or args.pairs < 3:
        print("[bench] note: fewer than 2 measured steps or 3 pairs: a check, not a number to publish",
              file=sys.stderr)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    parent(args)


if __name__ == "__main__":
    main()
