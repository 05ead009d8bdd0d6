"""Tables, CSV and figures for sampled evaluations (``reinforge eval``), plus the small formatting
helpers the comparison and boundary reports share."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["fmt_ci", "markdown_table", "csv_text", "passk_markdown", "passk_csv", "plot_passk", "png_bytes",
           "log2_k_axis"]


def fmt_ci(value: float, lo: float, hi: float, digits: int = 3) -> str:
    return f"{value:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub Markdown table; ``align`` is one character per column ('l' or 'r')."""
    align = align or "l" * len(headers)
    sep = ["---:" if a == "r" else "---" for a in align]
    out = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + "|".join(sep) + "|"]
    for r in rows:
        out.append("| " + " | ".join(str(c).replace("|", "\\|") for c in r) + " |")
    return "\n".join(out)


def csv_text(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(headers)
    for r in rows:
        w.writerow([f"{c:.10g}" if isinstance(c, float) else c for c in r])
    return buf.getvalue()


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def log2_k_axis(ax, n: int) -> None:
    """A log2 x axis for k = 1..n, ticks at the powers of two (and n) written as plain numbers."""
    if n <= 1:
        return
    ax.set_xscale("log", base=2)
    ticks = _selected_ks(n)
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(k) for k in ticks])
    ax.minorticks_off()


def _selected_ks(n: int) -> list[int]:
    """k values shown in the Markdown table: powers of two and N (the CSV has every k)."""
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if k <= n]
    return ks + ([n] if n not in ks else [])


def passk_markdown(summary: dict[str, Any], *, title: str, figure: str | None = None) -> str:
    """Summary of one sampled evaluation: reward, pass@k and maj@k with intervals."""
    pct = int(round(summary.get("confidence", 0.95) * 100))
    n = summary["samples"]
    lines = [
        f"# {title}",
        "",
        f"{summary['n_prompts']} held-out prompts x N = {n} samples (temperature "
        f"{summary.get('temperature')}, top-p {summary.get('top_p')}, up to "
        f"{summary.get('max_new_tokens')} new tokens, seed {summary.get('seed')}). Intervals: {pct}% "
        "percentile bootstrap over prompts.",
        "",
        f"- mean reward: {fmt_ci(summary['reward_mean'], summary['reward_ci_low'], summary['reward_ci_high'])}",
        f"- accuracy of one sample (= pass@1): "
        f"{fmt_ci(summary['accuracy'], summary['accuracy_ci_low'], summary['accuracy_ci_high'])}",
        f"- mean completion length {summary.get('completion_length', float('nan')):.1f} tokens, "
        f"{summary.get('truncated_frac', 0.0):.1%} truncated",
        "",
    ]
    if figure:
        lines += [f"![pass@k and maj@k]({figure})", ""]
    by_k_pass = {r["k"]: r for r in summary["pass_at_k"]}
    by_k_maj = {r["k"]: r for r in summary["maj_at_k"]}
    rows = []
    for k in _selected_ks(n):
        p, m = by_k_pass.get(k), by_k_maj.get(k)
        if p is None or m is None:
            continue
        rows.append([k, fmt_ci(p["value"], p["ci_low"], p["ci_high"]), fmt_ci(m["value"], m["ci_low"], m["ci_high"])])
    lines += [markdown_table(["k", "pass@k", "maj@k"], rows, "rll"), "",
              "pass@k: unbiased estimator of Chen et al. (2021, arXiv:2107.03374); maj@k: exact "
              "majority-vote accuracy over all k-subsets of the N samples (ties split evenly). "
              "Every k is in passk.csv.", ""]
    if summary.get("guardrails"):
        from reinforge.evaluation.verdict import guardrail_lines, verdict_lines

        lines += ["## Guardrails", "", "What this accuracy must beat before it counts as learning "
                  "(docs/experiments.md, Guardrails); the model's accuracy is per sample, paired by prompt:", ""]
        lines += guardrail_lines(summary["guardrails"])
        if summary.get("verdict"):
            lines += verdict_lines(summary["verdict"])
        lines.append("")
    return "\n".join(lines)


def passk_csv(summary: dict[str, Any]) -> str:
    rows = []
    for p, m in zip(summary["pass_at_k"], summary["maj_at_k"]):
        rows.append([p["k"], p["value"], p["ci_low"], p["ci_high"], m["value"], m["ci_low"], m["ci_high"]])
    return csv_text(["k", "pass_at_k", "pass_ci_low", "pass_ci_high", "maj_at_k", "maj_ci_low", "maj_ci_high"], rows)


def plot_passk(summary: dict[str, Any], *, title: str) -> bytes:
    """PNG bytes: pass@k and maj@k over k (log2 axis) with interval bands."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for key, label, color in (("pass_at_k", "pass@k", "tab:blue"), ("maj_at_k", "maj@k", "tab:orange")):
        rows = summary[key]
        ks = np.array([r["k"] for r in rows], dtype=float)
        ax.plot(ks, [r["value"] for r in rows], marker="o" if len(ks) <= 32 else None, markersize=3,
                color=color, label=label)
        ax.fill_between(ks, [r["ci_low"] for r in rows], [r["ci_high"] for r in rows], color=color,
                        alpha=0.2, linewidth=0)
    log2_k_axis(ax, summary["samples"])
    ax.set_xlabel("k")
    ax.set_ylabel("score")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.13, top=0.9)
    return png_bytes(fig)
