"""Which compute dtype a run uses on the hardware it runs on (``model.dtype: auto``).

bf16 autocast pays off only where the hardware computes bf16 natively: x86 CPUs with AVX512-BF16
or AMX, GPUs of compute capability 8.0 and later. Elsewhere (AVX2-only CPUs, most laptops and many
cloud VMs) oneDNN and torch emulate bf16 through fp32 conversions, and a model's forward and
backward under bf16 autocast runs 7-50x slower than in fp32. The instruction-set flags alone can
mislead (a CPU may report AVX-512 without BF16, a VM may hide or mis-report flags), so where the
flags promise native bf16 a short matmul probe confirms that bf16 is actually faster here.

The choice is made once per run, before any weights load, and recorded with its reason; an
explicit ``bfloat16`` on hardware without native support is kept (the user asked) but warned about
with the slowdown measured on the spot.
"""

from __future__ import annotations

import functools
import logging
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("reinforge")

__all__ = ["DtypeChoice", "hardware_info", "cpu_model", "bf16_probe", "choose_dtype"]

# bf16 must beat fp32 by this much in the probe to be chosen: a near tie is not worth the rounding.
_MIN_SPEEDUP = 1.15


def cpu_model() -> str:
    """The CPU's marketing name ("AMD EPYC", "Intel(R) Xeon(R) Platinum 8480+", ...)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "?"


def _flag(name: str) -> bool | None:
    fn = getattr(torch.cpu, name, None) or getattr(getattr(torch._C, "_cpu", None), name, None)
    try:
        return bool(fn()) if fn is not None else None
    except Exception:  # a build without the query
        return None


@functools.lru_cache(maxsize=None)
def _cpu_flags() -> dict[str, Any]:
    try:
        mkldnn_bf16 = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:
        mkldnn_bf16 = None
    return {
        "model": cpu_model(),
        "machine": platform.machine(),
        # torch's kernel dispatch level: DEFAULT, AVX2, AVX512, SVE256, ...
        "capability": torch.backends.cpu.get_cpu_capability(),
        "avx512_bf16": _flag("_is_avx512_bf16_supported"),
        "amx_tile": _flag("_is_amx_tile_supported"),
        # oneDNN's answer is True on any AVX-512 core, where it emulates bf16: not enough alone.
        "mkldnn_bf16": mkldnn_bf16,
    }


def cpu_has_native_bf16(flags: dict[str, Any] | None = None) -> bool:
    """Whether the CPU's flags promise native bf16 math: AVX512-BF16 or AMX on x86; on other
    architectures (ARM's BF16 extension) oneDNN's own query is all torch offers."""
    flags = flags or _cpu_flags()
    if flags["machine"] in ("x86_64", "AMD64", "i386", "i686"):
        return bool(flags["avx512_bf16"] or flags["amx_tile"])
    return bool(flags["mkldnn_bf16"])


def hardware_info(device: torch.device | str = "cpu") -> dict[str, Any]:
    """What decides the dtype, for environment.json and the benchmarks: the CPU's model, its
    instruction-set capability and bf16 flags, and the GPU when ``device`` is one."""
    device = torch.device(device)
    info: dict[str, Any] = {"cpu": dict(_cpu_flags()), "threads": torch.get_num_threads()}
    info["cpu"]["native_bf16"] = cpu_has_native_bf16()
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        major, minor = torch.cuda.get_device_capability(index)
        info["gpu"] = {"name": torch.cuda.get_device_name(index), "compute_capability": f"{major}.{minor}",
                       "native_bf16": major >= 8}
    return info


def describe_cpu(info: dict[str, Any] | None = None) -> str:
    """One phrase naming the CPU and its bf16 support, e.g. 'AMD EPYC (AVX2, no native bf16)'."""
    cpu = (info or hardware_info())["cpu"]
    native = [n for n, k in (("AVX512-BF16", "avx512_bf16"), ("AMX", "amx_tile")) if cpu.get(k)]
    bf16 = f"native bf16: {'+'.join(native)}" if native else (
        "native bf16" if cpu.get("native_bf16") else "no native bf16")
    return f"{cpu['model']} ({cpu['capability']}, {bf16})"


@functools.lru_cache(maxsize=None)
def bf16_probe(device_type: str = "cpu", threads: int | None = None, size: int = 128) -> dict[str, float]:
    """Time one linear layer's forward and backward ([size, 576] x [576, 1536], the shape of
    SmolLM2-135M's MLP) in fp32 and under bf16 autocast on ``device_type``; the median of 3 after
    two warm-ups. About 0.1 s with native bf16, about 1 s without (emulated bf16 runs at a few
    GFLOP/s). ``threads`` keys the cache: the ratio depends on the thread count."""
    device = torch.device(device_type)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(size, 576, generator=gen).to(device)
    w = torch.randn(1536, 576, generator=gen).to(device).requires_grad_(True)

    def once(dtype: torch.dtype | None) -> float:
        xi = x.clone().requires_grad_(True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        with torch.autocast(device_type=device.type, dtype=dtype, enabled=dtype is not None):
            y = torch.nn.functional.linear(xi, w)
        y.float().sum().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        w.grad = None
        return time.perf_counter() - t0

    result = {}
    for name, dtype in (("float32", None), ("bfloat16", torch.bfloat16)):
        once(dtype), once(dtype)  # (the first calls pay for thread-pool and kernel set-up)
        result[f"{name}_s"] = sorted(once(dtype) for _ in range(3))[1]
    flops = 3 * 2 * size * 576 * 1536  # forward, backward-input, backward-weight
    result["float32_gflops"] = flops / result["float32_s"] / 1e9
    result["bfloat16_gflops"] = flops / result["bfloat16_s"] / 1e9
    result["bf16_speedup"] = result["float32_s"] / result["bfloat16_s"]
    return result


@dataclass
class DtypeChoice:
    """The dtype a run computes in and why (one line for the log and environment.json)."""

    requested: str        # model.dtype as configured: auto, float32 or bfloat16
    dtype: str            # what the run uses: float32 or bfloat16
    reason: str
    warning: str | None = None   # set when an explicit bfloat16 will be slow here
    probe: dict[str, float] | None = None
    hardware: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_dtype(requested: str, device: torch.device | str = "cpu") -> DtypeChoice:
    """Resolve ``model.dtype`` on ``device``: ``auto`` becomes bfloat16 where the hardware
    computes bf16 natively and faster (confirmed by :func:`bf16_probe` on a CPU), float32
    otherwise. An explicit value is kept; ``bfloat16`` without native support gets a warning
    with the measured slowdown and the fix."""
    device = torch.device(device)
    info = hardware_info(device)
    if device.type == "cuda":
        gpu = info.get("gpu", {})
        native = bool(gpu.get("native_bf16"))
        where = f"GPU {gpu.get('name', '?')} (compute capability {gpu.get('compute_capability', '?')})"
        if requested == "auto":
            dtype = "bfloat16" if native else "float32"
            why = "computes bf16 natively" if native else "has no native bf16 (needs compute capability 8.0+)"
            return DtypeChoice(requested, dtype, f"{where} {why}", hardware=info)
        warning = None if native or requested != "bfloat16" else (
            f"model.dtype=bfloat16 on {where}, which has no native bf16: expect it to be slower than "
            "float32; set model.dtype=auto (or float32)")
        return DtypeChoice(requested, requested, f"model.dtype={requested} as configured", warning, hardware=info)

    where = f"CPU {describe_cpu(info)}"
    native = info["cpu"]["native_bf16"]
    if requested == "float32":
        return DtypeChoice(requested, "float32", "model.dtype=float32 as configured", hardware=info)
    threads = torch.get_num_threads()
    if requested == "auto" and not native:
        return DtypeChoice(requested, "float32", f"{where}: bf16 would be emulated, far slower than fp32",
                           hardware=info)
    probe = bf16_probe("cpu", threads)
    speedup = probe["bf16_speedup"]
    measured = (f"a bf16 linear forward+backward ran {speedup:.2f}x the speed of fp32 here "
                f"({probe['bfloat16_gflops']:.1f} vs {probe['float32_gflops']:.1f} GFLOP/s, {threads} threads)")
    if requested == "auto":
        if speedup >= _MIN_SPEEDUP:
            return DtypeChoice(requested, "bfloat16", f"{where}; {measured}", probe=probe, hardware=info)
        return DtypeChoice(requested, "float32", f"{where} reports native bf16, but {measured}",
                           probe=probe, hardware=info)
    warning = None
    if speedup < 1.0:
        warning = (f"model.dtype=bfloat16 on {where}: {measured}, so bf16 is about {1 / speedup:.0f}x slower "
                   "here; set model.dtype=auto (or float32) for this machine")
    return DtypeChoice(requested, "bfloat16", f"model.dtype=bfloat16 as configured; {measured}", warning,
                       probe=probe, hardware=info)
