"""What machine a benchmark ran on, for its results JSON (imported by the bench scripts, which run
as `python benchmarks/NAME.py` and so have this folder on their path)."""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"
