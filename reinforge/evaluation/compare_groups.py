"""Collecting and grouping the runs of ``reinforge compare`` (:mod:`reinforge.evaluation.compare`).

Runs are grouped by the config keys whose values differ between them; seeds, the ``tracking``
section and ``trainer.num_threads`` never define a group, and the ``task`` section defines the
strata unless ``split_tasks`` is set. Each run is scored by its held-out evaluations
(``evals.jsonl``): the final and the best score, and the guardrails of its final evaluation.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from reinforge.evaluation.aggregate import interval_estimate, mean
from reinforge.tracking.history import flatten_dotted
from reinforge.tracking.index import find_runs, run_state
from reinforge.tracking.run_dir import RunDir, task_label
from reinforge.tracking.segments import segment_label

__all__ = ["ALWAYS_IGNORED", "flatten_config", "is_ignored_key", "RunScores", "collect_runs", "group_runs",
           "CompareResult"]

ALWAYS_IGNORED = ("trainer.num_threads",)


def flatten_config(tree: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted keys -> canonical JSON of the value (lists and empty dicts stay whole values)."""
    return {k: json.dumps(v, sort_keys=True, default=str) for k, v in flatten_dotted(tree, prefix).items()}


def is_ignored_key(key: str, extra: Sequence[str] = ()) -> bool:
    """Keys that never define a group: seeds, the tracking section, thread counts, and any key
    equal to, or under, one of ``extra``."""
    leaf = key.rsplit(".", 1)[-1]
    if leaf in ("seed", "seeds") or key.startswith("tracking.") or key in ALWAYS_IGNORED:
        return True
    return any(key == e or key.startswith(e + ".") for e in extra)


def _is_task_key(key: str) -> bool:
    return key.startswith("task.")


@dataclass
class RunScores:
    """One run's held-out scores: ``steps``/``scores`` per evaluation, final and best."""

    run: RunDir
    state: str
    config: dict[str, Any]
    flat: dict[str, str]
    steps: list[int]
    scores: list[float]
    group: str = ""
    task: str = ""
    guardrails: dict[str, Any] | None = None  # the final evaluation's record (evaluation/guardrails.py)
    machine: str = ""  # the CPU (model, instruction-set capability) and GPU from environment.json

    @property
    def dtype(self) -> str:
        return str((self.config.get("model") or {}).get("dtype", ""))

    @property
    def name(self) -> str:
        return self.run.name

    @property
    def seed(self) -> Any:
        return (self.config.get("trainer") or {}).get("seed")

    @property
    def final(self) -> float:
        return self.scores[-1]

    @property
    def final_step(self) -> int:
        return self.steps[-1]

    def _best_idx(self) -> int:
        idx = [i for i, s in enumerate(self.steps) if s > 0] or list(range(len(self.steps)))
        return max(idx, key=lambda i: (self.scores[i], -self.steps[i]))

    @property
    def best(self) -> float:
        return self.scores[self._best_idx()]

    @property
    def best_step(self) -> int:
        return self.steps[self._best_idx()]

    def score_at(self, step: int) -> float | None:
        for s, v in zip(self.steps, self.scores):
            if s == step:
                return v
        return None


def collect_runs(
    paths: Sequence[str | os.PathLike], *, metric: str = "accuracy", include_unfinished: bool = False
) -> tuple[list[RunScores], list[tuple[str, str]]]:
    """Training runs found at or under ``paths`` with their held-out ``metric`` per evaluation.
    Returns (runs, skipped) where skipped lists (run path, reason)."""
    runs: list[RunDir] = []
    for p in paths:
        p = Path(p)
        found = [RunDir.open(p)] if (p / "config.yaml").is_file() else find_runs(p)
        if not found:
            raise FileNotFoundError(f"no run directories (folders with config.yaml) found under {str(p)!r}")
        runs += found
    seen: set[Path] = set()
    out: list[RunScores] = []
    skipped: list[tuple[str, str]] = []
    for rd in runs:
        key = rd.path.resolve()
        if key in seen:
            continue
        seen.add(key)
        try:  # a damaged run is left out, named with its file and fix; the others are still compared
            status, records, cfg, label = rd.status(), rd.read_evals(), rd.load_config(), segment_label(rd)
        except ValueError as err:
            skipped.append((str(rd.path), f"damaged: {err}"))
            continue
        if status.get("kind", "train") != "train":
            continue  # an eval directory of a bare model: not a training run
        if status.get("reproduces"):
            skipped.append((str(rd.path), f"a reproduction of {status['reproduces']}"))
            continue
        state = run_state(rd)
        if state != "finished" and not include_unfinished:
            skipped.append((str(rd.path), f"state {state} (pass --include-unfinished to use its last evaluation)"))
            continue
        evals = [e for e in records
                 if isinstance(e.get(metric), (int, float)) and math.isfinite(e[metric]) and "step" in e]
        if not evals:
            skipped.append((str(rd.path), f"no held-out evaluation with {metric!r} in evals.jsonl"))
            continue
        by_step = {int(e["step"]): float(e[metric]) for e in evals}  # a re-run step keeps its last value
        steps = sorted(by_step)
        flat = flatten_config(cfg)
        if label is not None:
            flat["segments"] = json.dumps(label)
        guard = {int(e["step"]): e["guardrails"] for e in evals if isinstance(e.get("guardrails"), dict)}
        out.append(RunScores(run=rd, state=state, config=cfg, flat=flat, steps=steps,
                             scores=[by_step[s] for s in steps], guardrails=guard.get(steps[-1]),
                             machine=_machine(rd)))
    return out, skipped


def _machine(rd: RunDir) -> str:
    """'AMD EPYC (AVX2)' or 'NVIDIA H100 80GB HBM3 on Intel(R) Xeon(R) ... (AVX512)': what ran the
    run, as its environment.json recorded it ('' for runs from before the record)."""
    try:
        env = json.loads((rd.path / "environment.json").read_text())
    except (OSError, ValueError):
        return ""
    hw = env.get("hardware") if isinstance(env, dict) else None
    cpu = hw.get("cpu") if isinstance(hw, dict) else None
    if not isinstance(cpu, dict):
        return ""
    text = f"{cpu.get('model', '?')} ({cpu.get('capability', '?')})"
    gpu = hw.get("gpu")
    return f"{gpu.get('name', '?')} on {text}" if isinstance(gpu, dict) else text


def _short_names(keys: list[str]) -> dict[str, str]:
    leaves = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (leaf if leaves.count(leaf) == 1 else k) for k, leaf in zip(keys, leaves)}


def _display(value_json: str) -> str:
    v = json.loads(value_json)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return v
    return json.dumps(v)


def group_runs(
    runs: list[RunScores], *, ignore: Sequence[str] = (), split_tasks: bool = False
) -> tuple[list[str], dict[str, list[RunScores]]]:
    """Assign each run its group label and task (stratum); returns (group keys, groups by label
    in a stable order). A key absent from some configs counts as differing (older runs)."""
    all_keys = sorted(set().union(*(r.flat.keys() for r in runs))) if runs else []
    differing = [k for k in all_keys if len({r.flat.get(k, "<absent>") for r in runs}) > 1]
    group_keys = [k for k in differing if not is_ignored_key(k, ignore) and (split_tasks or not _is_task_key(k))]
    task_keys = [] if split_tasks else [k for k in differing if _is_task_key(k) and not is_ignored_key(k, ignore)]
    short = _short_names(group_keys)
    groups: dict[str, list[RunScores]] = {}
    for r in runs:
        parts = [f"{short[k]}={_display(r.flat.get(k, 'null'))}" for k in group_keys]
        r.group = ", ".join(parts) if parts else "all runs"
        task_name = task_label(r.config.get("task") or {}, r.config.get("env"))
        extra = [f"{k[5:]}={_display(r.flat.get(k, 'null'))}" for k in task_keys if k != "task.name"]
        r.task = task_name + (f" ({', '.join(extra)})" if extra else "")
        groups.setdefault(r.group, []).append(r)
    ordered = dict(sorted(groups.items(), key=lambda kv: kv[0]))
    return group_keys, ordered


def _strata(runs: list[RunScores], tasks: list[str], value) -> list[np.ndarray]:
    return [np.array([value(r) for r in runs if r.task == t], dtype=np.float64) for t in tasks]


def _group_guardrails(members: list[RunScores], tasks: list[str], boot: dict[str, Any]) -> dict[str, Any]:
    """The prior baselines beside a group, from its runs' final evaluations: per baseline the mean
    over runs of (final accuracy - baseline) with a stratified bootstrap interval across runs, and
    how many runs beat it on their own prompts (paired 95% interval above zero); the mean
    well-formed share, distinct answers and top answer share. Runs evaluated before guardrails
    were recorded are left out (``n_runs`` counts the ones used)."""
    have = [r for r in members if r.guardrails is not None]
    out: dict[str, Any] = {"n_runs": len(have)}
    if not have:
        return out
    for key in ("well_formed", "distinct_answers", "top_answer_share"):
        out[key] = float(np.mean([r.guardrails[key] for r in have]))
    for name in ("best_constant", "train_prior"):
        used = [r for r in have if r.guardrails[name].get("applicable")]
        if not used:
            reasons = {r.guardrails[name].get("reason") for r in have}
            out[name] = {"applicable": False, "reason": "; ".join(sorted(str(x) for x in reasons))}
            continue
        g_tasks = [t for t in tasks if any(r.task == t for r in used)]
        diff = interval_estimate(_strata(used, g_tasks, lambda r, n=name: r.guardrails[n]["model_minus"]["diff"]),
                                 mean, **boot)
        entry = {"applicable": True, "n_runs": len(used),
                 "accuracy": float(np.mean([r.guardrails[name]["accuracy"] for r in used])),
                 "final_minus": diff,
                 "runs_beating": sum(r.guardrails[name]["model_minus"]["ci_low"] > 0 for r in used)}
        # One run has no spread across runs to bootstrap: its own paired interval over prompts decides.
        entry["beats"] = bool(diff["ci_low"] > 0 if len(used) > 1 else entry["runs_beating"] == 1)
        if name == "best_constant":
            entry["answers"] = sorted({str(r.guardrails[name]["answer"]) for r in used})
        out[name] = entry
    return out


@dataclass
class CompareResult:
    out_dir: Path
    group_keys: list[str]
    groups: dict[str, list[RunScores]]
    tasks: list[str]
    stats: dict[str, dict[str, Any]]
    improvement: list[dict[str, Any]]
    curves: dict[str, list[dict[str, Any]]]
    profiles: dict[str, dict[str, Any]]
    skipped: list[tuple[str, str]]
    files: list[Path] = field(default_factory=list)
