"""Where ``reinforge eval`` keeps its results inside a run (or eval) directory::

    sampled_evals/<label>/   summary.json (written last: its presence marks the evaluation
                             complete), samples.jsonl (every prompt's completions), and the
                             report files the CLI adds (report.md, passk.csv, passk.png)
    boundary/<label>/        ``reinforge eval --boundary``: boundary.png/.md/.csv/.json

The label names the weights and the sampling settings (``final_n16_T1_len32_seed0``).
"""

from __future__ import annotations

import json
from pathlib import Path

from reinforge.tracking.io import atomic_write_json, read_jsonl, rewrite_jsonl
from reinforge.tracking.run_dir import RunDir, safe_name

__all__ = ["SAMPLED_EVALS_DIR", "BOUNDARY_DIR", "sampled_eval_dir", "sampled_eval_labels", "write_sampled_eval",
           "read_sampled_eval", "boundary_dir"]

SAMPLED_EVALS_DIR = "sampled_evals"
BOUNDARY_DIR = "boundary"
_SUMMARY = "summary.json"
_SAMPLES = "samples.jsonl"


def sampled_eval_dir(run: RunDir, label: str) -> Path:
    return run.path / SAMPLED_EVALS_DIR / safe_name(label)


def sampled_eval_labels(run: RunDir) -> list[str]:
    """Labels of the complete sampled evaluations of ``run``, sorted."""
    d = run.path / SAMPLED_EVALS_DIR
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.iterdir() if (p / _SUMMARY).is_file())


def write_sampled_eval(run: RunDir, label: str, summary: dict, per_prompt: list[dict]) -> Path:
    """Write ``sampled_evals/<label>/samples.jsonl`` (every prompt's completions) and then
    ``summary.json`` (its presence marks the evaluation complete); returns the folder."""
    d = sampled_eval_dir(run, label)
    rewrite_jsonl(d / _SAMPLES, per_prompt)
    atomic_write_json(d / _SUMMARY, summary)
    return d


def read_sampled_eval(run: RunDir, label: str) -> tuple[dict, list[dict]]:
    """(summary, per-prompt rows) of one sampled evaluation; FileNotFoundError lists the labels."""
    d = sampled_eval_dir(run, label)
    try:
        summary = json.loads((d / _SUMMARY).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(
            f"run {str(run.path)!r} has no sampled evaluation {label!r} "
            f"(it has: {', '.join(sampled_eval_labels(run)) or 'none'})"
        ) from None
    return summary, read_jsonl(d / _SAMPLES)


def boundary_dir(run: RunDir, label: str) -> Path:
    return run.path / BOUNDARY_DIR / safe_name(label)
