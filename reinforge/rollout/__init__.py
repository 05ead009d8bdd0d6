"""Generating completions with token ids and log-probs."""

from __future__ import annotations

from pathlib import Path

import torch

from .base import Generator, SamplingParams
from .hf import HFGenerator, left_pad


def __getattr__(name: str):
    # The vLLM backend is imported only when asked for: importing vllm takes seconds.
    if name == "VLLMGenerator":
        from .vllm_backend import VLLMGenerator

        return VLLMGenerator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_generator(
    rollout_cfg,
    model,
    tokenizer,
    *,
    model_path: str | Path,
    model_dtype: str = "float32",
    autocast_dtype=None,
    seed: int = 0,
):
    """The generator that ``rollout_cfg.backend`` names (a ``RolloutConfig``).

    ``hf`` generates with ``model`` itself, or with a bf16 copy of it (``rollout.hf_bf16_copy``);
    ``vllm`` starts an in-process engine from ``model_path`` in ``model_dtype``. Either is a
    ``Generator``: one with ``needs_sync`` gets the policy's weights after updates through
    ``generator.sync_weights(state_dict, version)``."""
    if rollout_cfg.backend == "hf":
        return HFGenerator(
            model, tokenizer, batch_size=rollout_cfg.generation_batch_size, autocast_dtype=autocast_dtype,
            copy_dtype=torch.bfloat16 if rollout_cfg.resolved_hf_bf16_copy(model_dtype) else None,
        )
    if rollout_cfg.backend == "vllm":
        from .vllm_backend import VLLMGenerator

        eos = model.generation_config.eos_token_id if getattr(model, "generation_config", None) else None
        return VLLMGenerator(
            model_path,
            tokenizer,
            dtype=model_dtype,
            eos_token_ids=None if eos is None else (eos if isinstance(eos, list) else [eos]),
            seed=seed,
            kv_cache_gb=rollout_cfg.vllm_kv_cache_gb,
            gpu_memory_utilization=rollout_cfg.vllm_gpu_memory_utilization,
            enforce_eager=rollout_cfg.vllm_enforce_eager,
            max_model_len=rollout_cfg.vllm_max_model_len,
        )
    raise ValueError(f"unknown rollout.backend {rollout_cfg.backend!r}; accepted: hf, vllm")


__all__ = ["Generator", "HFGenerator", "SamplingParams", "VLLMGenerator", "build_generator", "left_pad"]
