"""The policy's weights as a plain Hugging Face state dict, for a generation engine that holds its
own copy of them (vLLM, or the HF backend's bf16 copy)."""

from __future__ import annotations

import torch


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The policy's weights under the base model's Hugging Face names. For a PEFT (LoRA) model
    each adapted layer's weight is ``W + scale * B @ A``, computed here without merging the
    adapters into the model (merging and unmerging would perturb the learner's fp32 weights)."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        PeftModel = ()  # type: ignore[assignment]
    if not isinstance(model, PeftModel):
        return model.state_dict()
    base = model.get_base_model()
    out: dict[str, torch.Tensor] = {}
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if hasattr(module, "base_layer") and hasattr(module, "get_delta_weight"):
            adapters = [a for a in getattr(module, "active_adapters", []) if a in getattr(module, "lora_A", {})]
            if adapters and not getattr(module, "disable_adapters", False):
                with torch.no_grad():
                    delta = sum(module.get_delta_weight(a) for a in adapters)
                deltas[f"{name}.weight"] = delta
    for key, tensor in base.state_dict().items():
        if "lora_" in key or ".modules_to_save." in key:
            continue
        key = key.replace(".base_layer.", ".").replace(".original_module.", ".")
        if key in deltas:
            tensor = tensor + deltas[key].to(tensor.dtype)
        out[key] = tensor
    return out
