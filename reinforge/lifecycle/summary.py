"""A finished run's summary (summary.md / summary.json): held-out accuracy before and after training
with a paired bootstrap interval of the gain, the guardrails of the last evaluation (prior
baselines, answer spread, well-formed share) with a verdict on the gain
(reinforge/evaluation/guardrails.py), the answers that became correct, and the run's config
segments.

The before/after pair comes from one *evaluation regime*: when a resume changed what the held-out
evaluation measures (the task, the reward, the answer length, the prompt count; see
``resume.EVAL_KEYS``), only the evaluations made since are paired, since earlier ones scored other
prompts or scored them otherwise.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..evaluation import paired_bootstrap_diff
from ..evaluation.guardrails import prompt_counts
from ..evaluation.verdict import (
    guardrail_lines,
    guardrail_verdict,
    spec_from_config,
    verdict_lines,
)
from ..tracking import RunDir
from ..tracking.segments import Segment, read_segments
from ..tracking.validate import missing_steps, step_ranges
from .resume import EVAL_KEYS, _under

__all__ = ["write_run_summary", "eval_regime_start"]


def eval_regime_start(segments: list[Segment]) -> tuple[int, Segment | None]:
    """(first step whose evaluations belong to the current regime, the segment that began it or
    None). Step 0 (the evaluation before training) belongs to the first regime only."""
    for seg in reversed(segments[1:]):
        if any(_under(c.key, EVAL_KEYS) for c in seg.changes):
            return seg.from_step, seg
    return 0, None


def _segment_lines(segments: list[Segment], last_step: int) -> list[str]:
    if len(segments) < 2:
        return []
    lines = ["", "Config segments (a resume changed the config; segments.json has each whole config):"]
    for i, seg in enumerate(segments):
        end = segments[i + 1].from_step - 1 if i + 1 < len(segments) else last_step
        span = f"steps {seg.from_step}-{end}" if end >= seg.from_step else f"from step {seg.from_step}"
        if i == 0:
            lines.append(f"- {span}: the config the run started with")
        else:
            lines.append(f"- {span}: " + "; ".join(f"`{c.key}` {c.describe().split(': ', 1)[1]}"
                                                   for c in seg.changes))
    return lines


def _guardrail_section(rd: RunDir, summary: dict[str, Any], first_step: int, last_step: int,
                       first: list[dict], last: list[dict], seed: int) -> list[str]:
    """The last evaluation's guardrails (recorded in evals.jsonl at evaluation time) and the
    verdict on its gain over the first evaluation of the regime; nothing for a run evaluated
    before guardrails were recorded."""
    records = {int(e["step"]): e["guardrails"] for e in rd.read_evals() if "guardrails" in e and "step" in e}
    record = records.get(last_step)
    if record is None:
        return []
    fmt, code = spec_from_config(rd.load_config())
    base_name = f"step {first_step}"
    verdict = guardrail_verdict(prompt_counts(last, fmt, code=code), record, prompt_counts(first, fmt, code=code),
                                base_label=f"the model at step {first_step}" if first_step else "the base model",
                                seed=seed)
    summary["guardrails"] = {"step": last_step, "base_step": first_step, **record}
    summary["verdict"] = verdict
    return (["", f"Guardrails at step {last_step} (docs/experiments.md, Guardrails):"]
            + guardrail_lines(record, base_record=records.get(first_step), base_name=base_name)
            + verdict_lines(verdict))


def write_run_summary(run_dir: RunDir, *, recipe: str, task_name: str, model_path: str, seed: int,
                      wall_time: float) -> dict[str, Any]:
    """Write summary.json and summary.md from the run directory; returns the summary dict."""
    rd = run_dir
    metrics = rd.read_metrics()
    segments = read_segments(rd)
    last_step = max((int(m["step"]) for m in metrics if "step" in m), default=0)
    # Steps 1..last were trained; a step without a record lost it (metrics.jsonl truncated or deleted
    # before a resume): counted as trained and named, never left out of the count silently.
    missing = missing_steps(metrics, last_step)
    summary: dict[str, Any] = {
        "run_dir": str(rd.path),
        "steps": last_step,
        **({"steps_without_metrics": missing} if missing else {}),
        "wall_time_s_this_session": wall_time,
        "train_time_s": float(sum(m.get("time_step", 0.0) for m in metrics)),
        "tokens_per_s": float(np.mean([m["tokens_per_s"] for m in metrics])) if metrics else math.nan,
    }
    if len(segments) > 1:
        summary["segments"] = [{"from_step": s.from_step, "changes": [c.to_dict() for c in s.changes]}
                               for s in segments]
    lines = [f"# Run {rd.name}", "", f"recipe `{recipe}`, task `{task_name}`, model `{model_path}`, "
             f"{last_step} steps", ""]
    if missing:
        lines[-2] += (f" (metrics.jsonl has no record of step(s) {step_ranges(missing)}: the file was truncated or "
                      "deleted before a resume, and train_time_s counts the logged steps only)")
    start, changed_by = eval_regime_start(segments)
    steps = [s for s in rd.eval_steps() if s >= start]
    pairs: list[tuple[dict, dict]] = []
    if len(steps) >= 2:
        first, last = rd.read_eval_details(steps[0]), rd.read_eval_details(steps[-1])
        by_id = {r["id"]: r for r in first}
        pairs = [(by_id[r["id"]], r) for r in last if r["id"] in by_id]
    if pairs:
        diff = paired_bootstrap_diff([float(a["correct"]) for a, _ in pairs],
                                     [float(b["correct"]) for _, b in pairs], seed=seed)
        summary["heldout_accuracy"] = {**diff, "from_step": steps[0], "to_step": steps[-1]}
        lines += [
            f"Held-out accuracy (greedy, fully correct answers, {diff['n']} prompts): "
            f"{diff['before']:.3f} at step {steps[0]} -> {diff['after']:.3f} at step {steps[-1]}",
            f"Difference {diff['diff']:+.3f}, 95% paired bootstrap interval "
            f"[{diff['ci_low']:+.3f}, {diff['ci_high']:+.3f}]"
            + (" (excludes zero)" if diff["excludes_zero"] else " (includes zero)"),
        ]
        lines += _guardrail_section(rd, summary, steps[0], steps[-1], first, last, seed)
        fixed = [b for a, b in pairs if b["correct"] and not a["correct"]][:3]
        if fixed:
            lines += ["", "Answers that became correct:"]
            lines += [f"- `{b['id']}` expected `{b['answer']}`, got: {b['completion'][:200]!r}" for b in fixed]
    elif changed_by is not None:
        keys = ", ".join(f"`{c.key}`" for c in changed_by.changes if _under(c.key, EVAL_KEYS))
        lines.append(f"Held-out accuracy: no before/after comparison, because the evaluation changed at step "
                     f"{changed_by.from_step} ({keys}) and {len(steps)} evaluation(s) were made since; "
                     "two are needed.")
    elif len(steps) >= 2:
        lines.append(f"Held-out accuracy: no before/after comparison: the evaluations at steps {steps[0]} and "
                     f"{steps[-1]} share no prompt.")
    lines += _segment_lines(segments, last_step)
    rd.write_summary(summary, "\n".join(lines) + "\n")
    return summary
