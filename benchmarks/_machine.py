"""What machine a benchmark ran on, for its results JSON (imported by the bench scripts, which run
as `python benchmarks/NAME.py` and so have this folder on their path).

Nothing here imports torch: a bench script's parent process may measure its children's memory, or
must stay light; `hardware_info` asks a child interpreter instead."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# Run in a child: reinforge.precision imports torch.
_HARDWARE_CODE = (
    "import json, sys\n"
    "from reinforge.precision import describe_cpu, hardware_info\n"
    "info = hardware_info(sys.argv[1])\n"
    "info['describe'] = describe_cpu(info)\n"
    "print(json.dumps(info))\n"
)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def hardware_info(device: str = "cpu", timeout: float = 120.0) -> dict:
    """`reinforge.precision.hardware_info(device)` (CPU model, torch's CPU capability such as AVX2
    or AVX512, the bf16 flags, torch's default thread count, the GPU on `cuda`) plus its one-line
    `describe`, read by a child interpreter (a few seconds: it imports torch). On failure: the CPU
    model only, and the error."""
    try:
        proc = subprocess.run([sys.executable, "-c", _HARDWARE_CODE, device], capture_output=True, text=True,
                              timeout=timeout, cwd=str(REPO))
        if proc.returncode == 0:
            return json.loads(proc.stdout.strip().splitlines()[-1])
        error = proc.stderr.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        error = error[0]
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as err:
        error = repr(err)
    return {"cpu": {"model": cpu_model()}, "describe": cpu_model(), "error": error}


def cpu_line(info: dict | None = None, threads: int | None = None) -> str:
    """One line for a benchmark's printed results, e.g. 'AMD EPYC (AVX2, no native bf16), 2 threads'
    (`info` from `hardware_info`, read now if not given; `threads` if the benchmark set its own)."""
    info = info if info is not None else hardware_info()
    threads = threads if threads is not None else info.get("threads")
    return f"{info.get('describe') or cpu_model()}" + (f", {threads} thread{'s' * (threads != 1)}" if threads else "")
