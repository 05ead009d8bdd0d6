"""What is needed to reproduce a run's software environment: Python, platform, CPU and thread
counts, torch and CUDA, every installed package's version, the git commit and uncommitted diff.
Written to ``environment.json`` when a run directory is created."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["collect_environment"]


def _run_git(args: list[str], cwd: Path) -> str | None:
    """Output of a read-only git command, or None if git is missing / not a repo / fails."""
    try:
        out = subprocess.run(
            ["git", "--no-optional-locks", *args],  # never take the index lock
            cwd=cwd,
            capture_output=True,
            timeout=15,
            check=True,
        )
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return out.stdout.decode("utf-8", errors="replace")


def _git_info(cwd: Path) -> tuple[dict[str, Any], str | None]:
    """Commit and dirtiness of the repository containing ``cwd``; (info, diff or None)."""
    commit = _run_git(["rev-parse", "HEAD"], cwd)
    if commit is None:
        return {"available": False, "commit": None, "dirty": None}, None
    info: dict[str, Any] = {"available": True, "commit": commit.strip()}
    root = _run_git(["rev-parse", "--show-toplevel"], cwd)
    info["root"] = root.strip() if root else None
    status = _run_git(["status", "--porcelain", "--untracked-files=no"], cwd)
    info["dirty"] = None if status is None else bool(status.strip())
    diff = None
    if info["dirty"]:
        diff = _run_git(["diff", "HEAD"], cwd)
    return info, diff


def _installed_packages() -> dict[str, str]:
    packages: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        try:
            name = dist.metadata["Name"]
        except Exception:
            name = None
        if name:
            packages.setdefault(name, dist.version)
    return dict(sorted(packages.items(), key=lambda kv: kv[0].lower()))


def collect_environment(cwd: str | os.PathLike | None = None) -> tuple[dict[str, Any], str | None]:
    """What is needed to reproduce a run's software environment; returns (info, git diff or None).

    Never raises for a missing git or a directory that is not a repository.
    """
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    try:
        affinity = len(os.sched_getaffinity(0))  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        affinity = None
    env: dict[str, Any] = {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "full_version": sys.version,
            "executable": sys.executable,
        },
        "platform": {
            "platform": platform.platform(),
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "processor": platform.processor(),
            "hostname": socket.gethostname(),
        },
        "cpu_count": os.cpu_count(),
        "cpu_affinity_count": affinity,
        "argv": list(sys.argv),
        "cwd": str(cwd),
    }
    try:
        import torch

        env["torch"] = {
            "version": torch.__version__,
            "num_threads": torch.get_num_threads(),
            "num_interop_threads": torch.get_num_interop_threads(),
            "cuda_available": torch.cuda.is_available(),
            "cuda_version": torch.version.cuda,
            "cuda_devices": [
                torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
            ]
            if torch.cuda.is_available()
            else [],
        }
    except Exception as err:  # torch missing or broken: record, do not fail the run
        env["torch"] = {"version": None, "error": repr(err)}
    try:  # the CPU's model and instruction-set capability decide how fast each dtype runs
        from reinforge.precision import hardware_info

        env["hardware"] = hardware_info()
    except Exception as err:
        env["hardware"] = {"error": repr(err)}
    env["packages"] = _installed_packages()
    git, diff = _git_info(cwd)
    env["git"] = git
    return env, diff
