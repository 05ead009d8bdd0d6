"""A run's learning curves (``learning_curves.png``): train reward, held-out accuracy with its
intervals, held-out reward, completion length, loss and KL, each panel drawn when its data exists.
Computed from the run directory alone, so any run can be plotted again later."""

from __future__ import annotations

import io as _io
import math
from pathlib import Path
from typing import Any

from reinforge.tracking.io import atomic_write_bytes
from reinforge.tracking.run_dir import RunDir
from reinforge.tracking.segments import read_segments

__all__ = ["plot_learning_curves", "CURVES_FILE"]

CURVES_FILE = "learning_curves.png"

# The trainer's metric names that the curves plot (a panel is left out when its metric is absent).
TRAIN_REWARD_KEYS = ("reward_mean",)
TRAIN_ACCURACY_KEYS = ("accuracy",)
LENGTH_KEYS = ("completion_length",)
LOSS_KEYS = ("loss",)
KL_KEYS = ("kl",)


def _segment_starts(run: RunDir) -> list[int]:
    """First steps of the segments after the first (where a resume changed the config)."""
    try:
        return [s.from_step for s in read_segments(run)[1:]]
    except (OSError, ValueError):
        return []


def plot_learning_curves(run: RunDir) -> Path:
    """Write ``<run>/learning_curves.png`` from metrics.jsonl and evals.jsonl; returns its path.

    Dotted vertical lines mark where a resume changed the config (segments.json).
    Panels (each only when its data exists): train reward mean, held-out accuracy (with 95%
    CI error bars when evals carry accuracy_ci_low/high; train batch accuracy dashed),
    held-out mean reward (with CI when present), completion length, loss, KL. With no data at
    all, a single panel says so. Works with 0, 1 or many records.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    metrics = [r for r in run.read_metrics() if isinstance(r, dict) and "step" in r]
    evals = [r for r in run.read_evals() if isinstance(r, dict) and "step" in r]

    panels: list[dict[str, Any]] = []

    def num(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
        xs, ys = [], []
        for r in records:
            v = r.get(key)
            if num(v):
                xs.append(float(r["step"]))
                ys.append(float(v))
        return xs, ys

    def first_key(records: list[dict], keys: tuple[str, ...]) -> str | None:
        for k in keys:
            if any(num(r.get(k)) for r in records):
                return k
        return None

    def eval_line(key: str, ci_prefixes: tuple[str, ...], label: str) -> dict | None:
        xs, ys = series(evals, key)
        if not xs:
            return None
        line: dict[str, Any] = {"x": xs, "y": ys, "label": label}
        rows = [r for r in evals if num(r.get(key))]
        for prefix in ci_prefixes:
            lo_k, hi_k = f"{prefix}_ci_low", f"{prefix}_ci_high"
            if all(num(r.get(lo_k)) and num(r.get(hi_k)) for r in rows):
                break
        else:
            return line
        lo = [max(0.0, y - float(r[lo_k])) for r, y in zip(rows, ys)]
        hi = [max(0.0, float(r[hi_k]) - y) for r, y in zip(rows, ys)]
        line["yerr"] = [lo, hi]
        line["label"] = f"{label} (CI)"
        return line

    k = first_key(metrics, TRAIN_REWARD_KEYS)
    if k:
        x, y = series(metrics, k)
        panels.append({"title": "train reward (mean)", "ylabel": k,
                       "lines": [{"x": x, "y": y, "label": "train"}]})

    acc_lines = []
    k = first_key(metrics, TRAIN_ACCURACY_KEYS)
    if k:
        x, y = series(metrics, k)
        acc_lines.append({"x": x, "y": y, "label": "train batch", "style": "--"})
    line = eval_line("accuracy", ("accuracy",), "held-out")
    if line:
        acc_lines.append(line)
    if acc_lines:
        panels.append({"title": "accuracy", "ylabel": "accuracy", "lines": acc_lines})

    line = eval_line("reward_mean", ("reward", "reward_mean"), "held-out")
    if line:
        panels.append({"title": "held-out reward (mean)", "ylabel": "reward_mean",
                       "lines": [line]})

    for keys, title in ((LENGTH_KEYS, "completion length"), (LOSS_KEYS, "loss"),
                        (KL_KEYS, "KL to reference")):
        k = first_key(metrics, keys)
        if k:
            x, y = series(metrics, k)
            panels.append({"title": title, "ylabel": k,
                           "lines": [{"x": x, "y": y, "label": k}]})

    n = max(1, len(panels))
    ncols = min(3, n)
    nrows = math.ceil(n / ncols)
    height = 3.2 * nrows + 0.4
    fig = Figure(figsize=(4.4 * ncols, height))
    FigureCanvasAgg(fig)
    # Fixed margins (inches -> fractions): constrained layout costs ~1 s per plot.
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    fig.subplots_adjust(left=0.9 / (4.4 * ncols), right=1 - 0.15 / (4.4 * ncols),
                        bottom=0.55 / height, top=1 - 0.75 / height, wspace=0.38, hspace=0.5)
    if not panels:
        ax = axes[0]
        ax.text(0.5, 0.5, "no metrics or evaluations logged yet", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    starts = _segment_starts(run)
    for ax, panel in zip(axes, panels):
        for start in starts:  # a dotted line where a resume changed the config
            ax.axvline(start - 0.5, color="grey", linestyle=":", linewidth=1)
        for ln in panel["lines"]:
            style = ln.get("style", "-")
            if "yerr" in ln:
                ax.errorbar(ln["x"], ln["y"], yerr=ln["yerr"], fmt="o" + style, capsize=3,
                            markersize=4, label=ln["label"])
            else:
                ax.plot(ln["x"], ln["y"], style, marker="o" if len(ln["x"]) < 30 else None,
                        markersize=3, label=ln["label"])
        ax.set_title(panel["title"])
        ax.set_xlabel("step")
        ax.set_ylabel(panel["ylabel"])
        ax.grid(alpha=0.3)
        if len(panel["lines"]) > 1 or any("yerr" in ln for ln in panel["lines"]):
            ax.legend(fontsize="small")
    for ax in axes[len(panels) if panels else 1:]:
        ax.set_visible(False)
    fig.suptitle(run.name + (f" (config changed at step {', '.join(map(str, starts))})" if starts else ""))
    buf = _io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    out = run.path / CURVES_FILE
    atomic_write_bytes(out, buf.getvalue())
    return out
