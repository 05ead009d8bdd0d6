"""The memory guard: an estimate of a run's peak memory from its config, checked before the
weights load, so that a run that cannot fit says which setting to change instead of being killed
by the kernel's OOM killer an hour in.

The estimate is a sum of the big pieces, each from the model's shape (read from its config.json,
the parameters counted on the meta device: nothing is allocated) and the run's settings:

- the policy's float32 weights, and under bf16 autocast the bf16 copies autocast caches;
- gradients and AdamW's two float32 moments of the trained parameters (all, or LoRA's);
- a frozen reference copy when the algorithm needs a reference (a KL term) and LoRA is off, and a
  critic (a full trained copy) when it needs one: both read from ``algorithms.needs_of``, the
  declaration the trainer reads too;
- generation: the KV cache, layers x 2 x kv_heads x head_dim x (prompt + max_new_tokens, or an
  agent's env.max_tokens) x generation_batch_size, plus a few [batch, vocab] float32 score tensors;
- the learner: the activations kept for the backward of one micro-batch of
  ``learner.micro_batch_tokens`` tokens (or the whole step's, when fewer) (per token and layer about 10 x hidden + 2 x kv_dim +
  4 x intermediate float32 values, calibrated on SmolLM2-135M; only the layer inputs under
  gradient checkpointing), plus the LM head's
  float32 logits: one chunk of ``learner.logits_chunk_tokens`` positions, or the whole
  micro-batch's completion positions without chunking.

Generation and the update never run at the same time, so the peak is the resident state (weights,
gradients, optimiser, copies) plus the larger of the two transient parts. It is an estimate
(allocator slack, fragmentation and the Python runtime are not in it); the guard warns when it
exceeds 90% of the memory available.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..algorithms import ADVANTAGE_ESTIMATORS, needs_of
from ..models import resolve_device
from ..precision import choose_dtype

log = logging.getLogger("reinforge")

GB = 1024**3
#: Share of the available memory the estimate may use before the guard warns.
HEADROOM = 0.9


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs to know about a decoder-only transformer."""

    params: int
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    #: Trainable parameters of LoRA adapters with the run's settings (0 without LoRA).
    lora_params: int = 0


def model_shape(model_path: str | Path, lora=None) -> ModelShape:
    """The shape of the causal LM in ``model_path``, its parameters counted on the meta device (no
    memory allocated, no weights read). ``lora``: a ``LoraConfig`` section, to count its adapters."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(model_path, local_files_only=True)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    params = sum(p.numel() for p in model.parameters())
    lora_params = 0
    if lora is not None:
        targets = lora.target_modules
        head = model.get_output_embeddings()
        for name, mod in model.named_modules():
            if not isinstance(mod, torch.nn.Linear):
                continue
            if targets == "all-linear":
                hit = mod is not head  # PEFT's all-linear leaves the output layer out
            else:
                wanted = [targets] if isinstance(targets, str) else list(targets)
                hit = name.split(".")[-1] in wanted or name in wanted
            if hit:
                lora_params += lora.r * (mod.in_features + mod.out_features)
    heads = getattr(cfg, "num_attention_heads", 1)
    hidden = cfg.hidden_size
    return ModelShape(
        params=params,
        layers=cfg.num_hidden_layers,
        hidden=hidden,
        intermediate=getattr(cfg, "intermediate_size", None) or 4 * hidden,
        heads=heads,
        kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
        head_dim=getattr(cfg, "head_dim", None) or hidden // heads,
        vocab=cfg.vocab_size,
        lora_params=lora_params,
    )


@dataclass
class MemoryEstimate:
    """Bytes per component; ``peak`` = resident + max(generation, learner)."""

    resident: dict[str, int]
    generation: dict[str, int]
    learner: dict[str, int]
    available: int | None = None
    available_source: str = ""
    advice: list[str] = field(default_factory=list)

    @property
    def peak(self) -> int:
        return sum(self.resident.values()) + max(sum(self.generation.values()), sum(self.learner.values()))

    @property
    def fits(self) -> bool:
        return self.available is None or self.peak <= HEADROOM * self.available

    def summary(self) -> str:
        parts = {**self.resident, **self.generation, **self.learner}
        big = sorted(((v, k) for k, v in parts.items() if v), reverse=True)
        return ", ".join(f"{k} {v / GB:.2f} GB" for v, k in big)


def estimate_memory(cfg, shape: ModelShape, *, prompt_tokens: int) -> MemoryEstimate:
    """The estimate for a ``RunConfig`` and a model shape; ``prompt_tokens``: the longest prompt."""
    dtype = cfg.model.dtype
    if dtype == "auto":  # what a run on this machine would choose (reinforge/precision.py)
        dtype = choose_dtype("auto", resolve_device(cfg.model.device)).dtype
    bf16 = dtype == "bfloat16"
    act = 2 if bf16 else 4  # bytes of a cached key or value
    lora = cfg.model.lora is not None
    needs = needs_of(cfg.algorithm)
    P = shape.params
    trained = shape.lora_params if lora else P
    kv_dim = shape.kv_heads * shape.head_dim

    resident = {
        "weights": 4 * P,
        # autocast caches a bf16 copy of each trained weight it casts, for the whole forward
        "bf16_weight_copies": 2 * P if bf16 and not lora else 0,
        "gradients": 4 * trained,
        "adamw_states": 8 * trained,
        "reference_model": 4 * P if needs.reference and not lora else 0,
        "critic": 16 * P if needs.critic else 0,  # weights, gradients, AdamW
    }
    env = getattr(cfg, "env", None)
    seat_mode = env.seat_mode if env is not None else None
    seats = env.seats if env is not None else 1
    if seat_mode == "frozen":  # the opponent's weights: the KL reference's when there is one (agents/seats.py)
        resident["frozen_opponent"] = 0 if resident["reference_model"] else 4 * P

    g = cfg.rollout.num_samples
    # A game of several seats decodes a row per seat (chunks hold whole games); self-play trains them all.
    rows = cfg.trainer.prompts_per_step * g * (seats if seat_mode == "self_play" else 1)
    decoded = cfg.trainer.prompts_per_step * g * seats
    gen_rows = min(decoded, max(g * seats, cfg.rollout.generation_batch_size // (g * seats) * g * seats))
    # tokens after the prompt: an agent's trajectory (env:) holds every turn and observation
    after = cfg.env.max_tokens if getattr(cfg, "env", None) else cfg.rollout.max_new_tokens
    seq = prompt_tokens + after
    if cfg.rollout.backend == "vllm":
        # The engine's own weights (in model.dtype) and the KV cache it reserves up front.
        kv_gb = cfg.rollout.vllm_kv_cache_gb
        generation = {
            "generation_copy": act * P,
            "kv_cache": int(kv_gb * GB) if kv_gb else shape.layers * 2 * kv_dim * seq * rows * act,
        }
    else:
        generation = {
            # rollout.hf_bf16_copy: the bf16 weights the HF backend decodes with
            "generation_copy": 2 * P if cfg.rollout.resolved_hf_bf16_copy(dtype) else 0,
            "kv_cache": shape.layers * 2 * kv_dim * seq * gen_rows * act,
            # float32 log-probs, probabilities and the float64 cumulative sum of a decode step
            "generation_scores": 5 * gen_rows * shape.vocab * 4,
        }

    # A micro-batch holds at most the token budget, and at most the whole step's rollout.
    c = after
    share = cfg.learner.share_prompt_prefix and not cfg.model.gradient_checkpointing
    step_tokens = rows // g * prompt_tokens + rows * c if share else rows * (prompt_tokens + c)
    tokens = min(cfg.learner.micro_batch_tokens, step_tokens)
    # 4 bytes even under bf16: CPU autocast keeps the residual stream and the norms in float32
    # and saves bf16 copies of the matmul inputs besides (measured: about as much as fp32).
    per_token_layer = (10 * shape.hidden + 2 * kv_dim + 4 * shape.intermediate) * 4
    if cfg.model.gradient_checkpointing:
        activations = tokens * shape.layers * shape.hidden * 4 + tokens * per_token_layer
    else:
        activations = tokens * shape.layers * per_token_layer
    # Completion positions in a micro-batch: with a shared prompt a group costs p + G*c tokens,
    # without it every row costs p + c.
    completion_frac = g * c / (prompt_tokens + g * c) if share else c / (prompt_tokens + c)
    completion_tokens = max(1, math.ceil(tokens * completion_frac))
    chunk = cfg.learner.logits_chunk_tokens
    # float32 logits, their softmax / log-softmax, the gradient (and bf16 logits under autocast)
    logit_rows = min(chunk, completion_tokens) if chunk > 0 else completion_tokens
    learner = {
        "activations": activations,
        "logits": logit_rows * shape.vocab * (4 * 4 + (2 if bf16 else 0)),
    }
    est = MemoryEstimate(resident, generation, learner)
    est.advice = _advice(cfg, est)
    return est


def _advice(cfg, est: MemoryEstimate) -> list[str]:
    """Settings to change, biggest component first."""
    parts = {**est.resident, **est.learner, **est.generation}
    tips = {
        "activations": [f"lower learner.micro_batch_tokens (now {cfg.learner.micro_batch_tokens})"]
        + ([] if cfg.model.gradient_checkpointing else ["set model.gradient_checkpointing=true"]),
        "logits": [f"lower learner.logits_chunk_tokens (now {cfg.learner.logits_chunk_tokens})"
                   if cfg.learner.logits_chunk_tokens > 0 else "set learner.logits_chunk_tokens=1024",
                   f"lower learner.micro_batch_tokens (now {cfg.learner.micro_batch_tokens})"],
        "kv_cache": ([f"lower rollout.vllm_kv_cache_gb (now {cfg.rollout.vllm_kv_cache_gb})"]
                     if cfg.rollout.backend == "vllm"
                     else [f"lower rollout.generation_batch_size (now {cfg.rollout.generation_batch_size})"]),
        "generation_copy": (["use rollout.backend=hf"] if cfg.rollout.backend == "vllm"
                            else ["set rollout.hf_bf16_copy=false (decode with the learner's weights, slower)"]),
        "generation_scores": [f"lower rollout.generation_batch_size (now {cfg.rollout.generation_batch_size})"],
        "gradients": [] if cfg.model.lora else ["train LoRA adapters (model.lora)"],
        "adamw_states": [] if cfg.model.lora else ["train LoRA adapters (model.lora)"],
        "bf16_weight_copies": ["train LoRA adapters (model.lora)"],
        "frozen_opponent": ["use env.options.opponent=self_play (no second copy of the weights)"],
        "reference_model": ["train LoRA adapters (model.lora: the KL reference is then the base model "
                            "with the adapters off, no copy)"],
        "critic": ["use a critic-free algorithm.advantage ("
                   + ", ".join(n for n in ADVANTAGE_ESTIMATORS if not ADVANTAGE_ESTIMATORS.needs(n).critic) + ")"],
    }
    if getattr(cfg, "env", None):  # agent trajectories: their token budget sets both
        for name in ("activations", "kv_cache", "logits"):
            tips[name] = [f"lower env.max_tokens (now {cfg.env.max_tokens})", *tips[name]]
    out: list[str] = []
    for _, name in sorted(((v, k) for k, v in parts.items() if v), reverse=True):
        for tip in tips.get(name, []):
            if tip not in out:
                out.append(tip)
    return out


def available_memory(device: str = "cpu") -> tuple[int | None, str]:
    """Bytes this process can still allocate, and where the number comes from: CUDA's free memory,
    or /proc/meminfo's MemAvailable (lowered to the cgroup's limit when a container sets one)."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free), f"free memory of {device}"
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        return None, ""
    source = "MemAvailable"
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            room = int(limit) - used
            if avail is None or room < avail:
                avail, source = room, "the cgroup's memory.max"
    except (OSError, ValueError):
        pass
    return avail, source


def check_memory(cfg, model_path, *, prompt_tokens: int, device: str = "cpu",
                 available: int | None = None) -> MemoryEstimate | None:
    """Estimate the run's peak memory and warn (``logging.warning``) naming the settings to change
    when it will not fit. Never raises: a model the estimate cannot read is logged and skipped."""
    try:
        shape = model_shape(model_path, cfg.model.lora)
    except Exception as err:  # an exotic config: the guard must never stop a run
        log.info("memory guard skipped: cannot read the model's shape (%s)", err)
        return None
    est = estimate_memory(cfg, shape, prompt_tokens=prompt_tokens)
    if available is None:
        available, source = available_memory(device)
    else:
        source = "given"
    est.available, est.available_source = available, source
    if available is None:
        return est
    msg = (f"estimated peak memory {est.peak / GB:.1f} GB ({est.summary()}); "
           f"{available / GB:.1f} GB available ({source})")
    if est.fits:
        log.info("memory guard: %s", msg)
    else:
        log.warning("memory guard: this run will probably not fit in memory: %s. To fit: %s.",
                    msg, "; or ".join(est.advice))
    return est

