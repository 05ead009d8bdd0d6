"""Did a re-run reproduce the original? Step-by-step comparison of two run directories and of the
software environments they ran in (``reinforge reproduce``).

On CPU with the same package versions (and thread count) a reinforge run is deterministic, so
every logged value must match *exactly*: training metrics (metrics.jsonl), held-out evaluations
(evals.jsonl) and the logged completions (samples.jsonl). Timing values cannot match and are left
out: the record timestamp ``time``, any key starting with ``time_`` (``time_collect``,
``time_step``, ...), throughput keys ending in ``_per_s`` (``tokens_per_s``) and keys ending in
``_time_s`` / ``wall_time``.

A run resumed under a changed config has segments (segments.json); ``reinforge reproduce`` replays
them at their steps, and the comparison checks that the reproduction changed the same keys to the
same values at the same steps (the ``tracking`` section, which a reproduction pins, left out).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from reinforge.tracking.run_dir import RunDir
from reinforge.tracking.segments import read_segments

__all__ = ["is_timing_key", "Mismatch", "ReproReport", "compare_run_dirs", "environment_differences",
           "format_repro_report"]

_TIMING = re.compile(r"^(time|wall_time)$|^time_|_per_s$|_time_s$|^wall_time")


def is_timing_key(key: str) -> bool:
    """Keys that measure time or speed and so never reproduce exactly."""
    leaf = key.rsplit("/", 1)[-1]
    return bool(_TIMING.search(key) or _TIMING.search(leaf))


def _same(a: Any, b: Any) -> bool:
    """Exact equality, except that NaN equals NaN (a NaN loss reproduced is a match)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@dataclass
class Mismatch:
    file: str          # "metrics", "evals" or "samples"
    step: int
    key: str
    original: Any
    reproduced: Any


@dataclass
class ReproReport:
    steps_compared: int
    mismatches: list[Mismatch] = field(default_factory=list)
    missing_steps: dict[str, list[int]] = field(default_factory=dict)   # in the original only
    extra_steps: dict[str, list[int]] = field(default_factory=dict)     # in the reproduction only
    ignored_keys: list[str] = field(default_factory=list)
    environment: list[str] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)  # how the config histories differ

    @property
    def matched(self) -> bool:
        return (not self.mismatches and not any(self.missing_steps.values()) and not any(self.extra_steps.values())
                and not self.segments)

    @property
    def first_mismatch_step(self) -> int | None:
        return min((m.step for m in self.mismatches), default=None)


def _by_step(records: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for r in records:
        if isinstance(r, dict) and isinstance(r.get("step"), int):
            out.setdefault(r["step"], []).append(r)
    return out


def _compare_file(name: str, orig: list[dict], new: list[dict], report: ReproReport, ignored: set[str]) -> set[int]:
    a, b = _by_step(orig), _by_step(new)
    report.missing_steps[name] = sorted(set(a) - set(b))
    report.extra_steps[name] = sorted(set(b) - set(a))
    common = sorted(set(a) & set(b))
    for step in common:
        rows_a, rows_b = a[step], b[step]
        if len(rows_a) != len(rows_b):
            report.mismatches.append(Mismatch(name, step, "<number of records>", len(rows_a), len(rows_b)))
        for i, (ra, rb) in enumerate(zip(rows_a, rows_b)):
            suffix = f"[{i}]" if len(rows_a) > 1 else ""
            for key in sorted(set(ra) | set(rb)):
                if key == "step":
                    continue
                if is_timing_key(key):
                    ignored.add(key)
                    continue
                va, vb = ra.get(key, "<absent>"), rb.get(key, "<absent>")
                if not _same(va, vb):
                    report.mismatches.append(Mismatch(name, step, key + suffix, va, vb))
    return set(common)


def environment_differences(original: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """What differs between two environment.json records that can change the numbers: Python,
    torch and its thread count, the platform, package versions, the git commit and dirtiness."""
    out: list[str] = []

    def cmp(label: str, a: Any, b: Any) -> None:
        if a != b:
            out.append(f"{label}: {a} (original) vs {b} (reproduction)")

    cmp("python", (original.get("python") or {}).get("version"), (current.get("python") or {}).get("version"))
    cmp("platform", (original.get("platform") or {}).get("machine"), (current.get("platform") or {}).get("machine"))
    ta, tb = original.get("torch") or {}, current.get("torch") or {}
    cmp("torch threads", ta.get("num_threads"), tb.get("num_threads"))
    cmp("CUDA available", ta.get("cuda_available"), tb.get("cuda_available"))
    pa, pb = original.get("packages") or {}, current.get("packages") or {}
    for name in sorted(set(pa) | set(pb), key=str.lower):
        if pa.get(name) != pb.get(name):
            out.append(f"package {name}: {pa.get(name, 'not installed')} (original) vs "
                       f"{pb.get(name, 'not installed')} (reproduction)")
    ga, gb = original.get("git") or {}, current.get("git") or {}
    cmp("git commit", ga.get("commit"), gb.get("commit"))
    if ga.get("dirty") or gb.get("dirty"):
        out.append(f"uncommitted changes: original {bool(ga.get('dirty'))}, reproduction {bool(gb.get('dirty'))} "
                   "(see git_diff.patch in each run)")
    return out


def _segment_history(run: RunDir) -> dict[int, list[tuple[str, str]]]:
    out = {}
    for seg in read_segments(run)[1:]:
        changes = sorted((c.key, repr(c.after)) for c in seg.changes if not c.key.startswith("tracking."))
        if changes:
            out[seg.from_step] = changes
    return out


def segment_differences(original: RunDir, reproduction: RunDir) -> list[str]:
    """Where the config histories of two runs differ: a step at which only one of them changed its
    config, or changed other keys or to other values (the pinned tracking section left out)."""
    a, b = _segment_history(original), _segment_history(reproduction)
    out = []
    for step in sorted(set(a) | set(b)):
        if a.get(step) != b.get(step):
            def fmt(ch):
                return ", ".join(f"{k}={v}" for k, v in ch) if ch else "no change"
            out.append(f"step {step}: original {fmt(a.get(step))}; reproduction {fmt(b.get(step))}")
    return out


def compare_run_dirs(original: RunDir, reproduction: RunDir) -> ReproReport:
    """Compare every logged record of two runs step by step (timing keys left out) and their
    environments; see the module docstring."""
    report = ReproReport(steps_compared=0)
    ignored: set[str] = set()
    steps = _compare_file("metrics", original.read_metrics(), reproduction.read_metrics(), report, ignored)
    _compare_file("evals", original.read_evals(), reproduction.read_evals(), report, ignored)
    _compare_file("samples", original.read_samples(), reproduction.read_samples(), report, ignored)
    report.steps_compared = len(steps)
    report.ignored_keys = sorted(ignored)
    report.segments = segment_differences(original, reproduction)
    report.mismatches.sort(key=lambda m: (m.step, ("metrics", "evals", "samples").index(m.file), m.key))
    try:
        report.environment = environment_differences(original.load_environment(), reproduction.load_environment())
    except (OSError, ValueError) as err:
        report.environment = [f"environment.json unreadable: {err}"]
    return report


def format_repro_report(report: ReproReport, original: RunDir, reproduction: RunDir, *, max_lines: int = 20) -> str:
    """Markdown: the verdict, the mismatches (first ones), missing steps, environment differences."""
    lines = [f"# Reproduction of `{original.path}`", "", f"Reproduction: `{reproduction.path}`", ""]
    if report.matched:
        lines.append(f"**Exact match**: {report.steps_compared} steps of metrics, every held-out evaluation and every "
                     "logged completion are identical.")
    else:
        step = report.first_mismatch_step
        lines.append("**Mismatch**" + (f": first at step {step}." if step is not None else "."))
    history = _segment_history(original)
    if history:
        lines += ["", "The original's config changed on resume (segments.json); replayed at the same steps: "
                  + "; ".join(f"step {step}: " + ", ".join(f"`{k}`={v}" for k, v in ch) for step, ch in history.items())
                  + "."]
    if report.segments:
        lines += ["", "**Config histories differ:**", ""] + [f"- {d}" for d in report.segments]
    lines += ["", "Timing keys left out of the comparison: " + (", ".join(f"`{k}`" for k in report.ignored_keys) or "none") + "."]
    if report.mismatches:
        lines += ["", "| file | step | key | original | reproduction |", "|---|---:|---|---|---|"]
        for m in report.mismatches[:max_lines]:
            lines.append(f"| {m.file} | {m.step} | `{m.key}` | {_short(m.original)} | {_short(m.reproduced)} |")
        if len(report.mismatches) > max_lines:
            lines.append(f"| ... | | {len(report.mismatches) - max_lines} more | | |")
    for name, steps in report.missing_steps.items():
        if steps:
            lines.append(f"\n{name}: steps {_steps(steps)} are in the original only.")
    for name, steps in report.extra_steps.items():
        if steps:
            lines.append(f"\n{name}: steps {_steps(steps)} are in the reproduction only.")
    lines += [""]
    if report.environment:
        lines += ["Environment differences (a likely cause of numeric differences):", ""]
        lines += [f"- {d}" for d in report.environment]
    else:
        lines.append("Environment: the same Python, torch, thread count, platform and package versions.")
    return "\n".join(lines) + "\n"


def _short(v: Any, n: int = 60) -> str:
    s = repr(v)
    s = s if len(s) <= n else s[: n - 3] + "..."
    return s.replace("|", "\\|")


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:10])) + (f" ... ({len(steps)} in all)" if len(steps) > 10 else "")
