"""Capability boundary: pass@k of a base model and of its RL-trained version on the same prompts,
for k = 1..N, as in "Does Reinforcement Learning Really Incentivize Reasoning Capacity in LLMs
Beyond the Base Model?" (Yue et al., 2025, arXiv:2504.13837).

Their finding: RL raises pass@1 (it samples the right answer more often) but the base model's
pass@k catches up and often overtakes it at large k, i.e. RL narrows the set of problems the model
can solve at all. Where the curves cross, if they do, is the number to look at.

Both curves use the unbiased pass@k estimator (:mod:`reinforge.evaluation.passk`). The intervals
of each curve, and of their difference (trained - base), are percentile bootstrap intervals over
prompts; the difference is paired (the same prompts are resampled for both models), so prompt
difficulty cancels.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import numpy as np

from reinforge.evaluation.passk import pass_at_k_curve
from reinforge.evaluation.report import log2_k_axis, png_bytes
from reinforge.evaluation.stats import bootstrap_ci_columns

__all__ = ["boundary_analysis", "boundary_markdown", "boundary_csv", "plot_boundary", "crossings"]


def _align(base_rows: Sequence[dict], trained_rows: Sequence[dict]) -> tuple[list[dict], list[dict]]:
    b = {r["id"]: r for r in base_rows}
    t = {r["id"]: r for r in trained_rows}
    if set(b) != set(t):
        only_b, only_t = sorted(set(b) - set(t)), sorted(set(t) - set(b))
        raise ValueError(
            "the base and trained evaluations must use the same prompts: "
            f"{len(only_b)} only in the base evaluation (e.g. {only_b[:2]}), "
            f"{len(only_t)} only in the trained one (e.g. {only_t[:2]}). Evaluate both with the "
            "run's task config (same task.seed, eval_size and --max-prompts)."
        )
    ids = [r["id"] for r in trained_rows]
    return [b[i] for i in ids], [t[i] for i in ids]


def crossings(ks: Sequence[int], diff: Sequence[float], tol: float = 1e-12) -> list[int]:
    """The k values at which ``diff`` (trained - base) changes sign, ignoring exact ties: each
    returned k is the first k of the new sign."""
    out, prev = [], 0
    for k, d in zip(ks, diff):
        sign = 0 if abs(d) <= tol else (1 if d > 0 else -1)
        if sign == 0:
            continue
        if prev and sign != prev:
            out.append(int(k))
        prev = sign
    return out


def boundary_analysis(
    base_rows: Sequence[dict],
    trained_rows: Sequence[dict],
    *,
    ks: Sequence[int] | None = None,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int | None = 0,
) -> dict[str, Any]:
    """pass@k curves of both models with intervals, their paired difference and the crossing.

    Rows are sampled-evaluation rows (one per prompt, with a ``correct`` list of N samples);
    both evaluations must cover the same prompt ids with the same N. Returns a dict with ``ks``,
    ``base`` / ``trained`` / ``diff`` (each ``{"value", "ci_low", "ci_high"}`` lists over k),
    ``crossings`` (k values where the sign of trained - base flips), ``crossover_k`` (the first
    k where the base catches up after the trained model led at k=1, else None), ``n_prompts``,
    ``samples``, and the prompt counts ``solved_by_base_only`` / ``solved_by_trained_only`` /
    ``solved_by_both`` / ``solved_by_neither`` at k = N.
    """
    base, trained = _align(base_rows, trained_rows)
    n_b = {len(r["correct"]) for r in base}
    n_t = {len(r["correct"]) for r in trained}
    if len(n_b) != 1 or n_b != n_t:
        raise ValueError(f"both evaluations need the same number of samples per prompt, got {sorted(n_b)} "
                         f"and {sorted(n_t)}")
    n = n_b.pop()
    ks = list(range(1, n + 1)) if ks is None else [int(k) for k in ks]
    c_b = np.array([int(round(sum(r["correct"]))) for r in base])
    c_t = np.array([int(round(sum(r["correct"]))) for r in trained])
    pb = pass_at_k_curve(np.full(len(base), n), c_b, ks)
    pt = pass_at_k_curve(np.full(len(trained), n), c_t, ks)
    stacked = np.concatenate([pb, pt, pt - pb], axis=1)
    lo, hi = bootstrap_ci_columns(stacked, confidence=confidence, n_resamples=n_resamples, seed=seed)
    means = stacked.mean(axis=0)
    m = len(ks)

    def curve(i: int) -> dict[str, list[float]]:
        sl = slice(i * m, (i + 1) * m)
        return {"value": means[sl].tolist(), "ci_low": lo[sl].tolist(), "ci_high": hi[sl].tolist()}

    diff = curve(2)
    cross = crossings(ks, diff["value"])
    first = next((d for d in diff["value"] if abs(d) > 1e-12), 0.0)
    crossover = cross[0] if cross and first > 0 else None
    solved_b, solved_t = c_b > 0, c_t > 0
    return {
        "ks": ks,
        "n_prompts": len(base),
        "samples": n,
        "confidence": confidence,
        "base": curve(0),
        "trained": curve(1),
        "diff": diff,
        "crossings": cross,
        "crossover_k": crossover,
        "solved_by_base_only": int(np.sum(solved_b & ~solved_t)),
        "solved_by_trained_only": int(np.sum(solved_t & ~solved_b)),
        "solved_by_both": int(np.sum(solved_b & solved_t)),
        "solved_by_neither": int(np.sum(~solved_b & ~solved_t)),
    }


def _fmt_ci(v: float, lo: float, hi: float) -> str:
    return f"{v:.3f} [{lo:.3f}, {hi:.3f}]"


def boundary_markdown(result: dict[str, Any], *, base_name: str, trained_name: str, figure: str | None = None) -> str:
    """A Markdown report: the verdict, the table over k, and how to read it."""
    ks = result["ks"]
    b, t, d = result["base"], result["trained"], result["diff"]
    pct = int(round(result["confidence"] * 100))
    lines = [
        "# Capability boundary: pass@k of base vs trained",
        "",
        f"- base: `{base_name}`",
        f"- trained: `{trained_name}`",
        f"- {result['n_prompts']} held-out prompts, N = {result['samples']} samples each; "
        f"pass@k by the unbiased estimator (Chen et al., 2021, arXiv:2107.03374); "
        f"{pct}% percentile bootstrap intervals over prompts, the difference paired.",
        "",
    ]
    if result["crossover_k"] is not None:
        lines.append(f"**The curves cross at k = {result['crossover_k']}**: the trained model leads at "
                     "small k, the base model matches or overtakes it from there on (the pattern Yue et "
                     "al., 2025, arXiv:2504.13837 report).")
    elif result["crossings"]:
        lines.append(f"The sign of trained - base changes at k = {', '.join(map(str, result['crossings']))}.")
    else:
        lead = "trained" if any(x > 1e-12 for x in d["value"]) else "base" if any(x < -1e-12 for x in d["value"]) else None
        lines.append("The curves do not cross for k <= N" + (f": the {lead} model is never behind." if lead else " (they are equal)."))
    lines += [
        "",
        f"Prompts solved by at least one of the N samples: both {result['solved_by_both']}, base only "
        f"{result['solved_by_base_only']}, trained only {result['solved_by_trained_only']}, neither "
        f"{result['solved_by_neither']}.",
        "",
    ]
    if figure:
        lines += [f"![pass@k curves]({figure})", ""]
    lines += ["| k | base pass@k | trained pass@k | trained - base |", "|---:|---|---|---|"]
    for i, k in enumerate(ks):
        excl = d["ci_low"][i] > 0 or d["ci_high"][i] < 0
        lines.append(f"| {k} | {_fmt_ci(b['value'][i], b['ci_low'][i], b['ci_high'][i])} | "
                     f"{_fmt_ci(t['value'][i], t['ci_low'][i], t['ci_high'][i])} | "
                     f"{d['value'][i]:+.3f} [{d['ci_low'][i]:+.3f}, {d['ci_high'][i]:+.3f}]{' *' if excl else ''} |")
    lines += ["", "`*`: the paired interval of the difference excludes 0.", ""]
    return "\n".join(lines)


def boundary_csv(result: dict[str, Any]) -> str:
    """One row per k: base, trained and difference with their interval bounds."""
    out = io.StringIO()
    out.write("k,base,base_ci_low,base_ci_high,trained,trained_ci_low,trained_ci_high,diff,diff_ci_low,diff_ci_high\n")
    for i, k in enumerate(result["ks"]):
        vals = []
        for part in ("base", "trained", "diff"):
            c = result[part]
            vals += [c["value"][i], c["ci_low"][i], c["ci_high"][i]]
        out.write(f"{k}," + ",".join(f"{v:.6g}" for v in vals) + "\n")
    return out.getvalue()


def plot_boundary(result: dict[str, Any], *, base_name: str, trained_name: str) -> bytes:
    """PNG bytes: both pass@k curves with interval bands over k (log2 axis); a vertical line at
    the crossover k when there is one."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    ks = np.asarray(result["ks"], dtype=float)
    fig = Figure(figsize=(6.4, 4.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for part, name, color in (("base", base_name, "tab:gray"), ("trained", trained_name, "tab:blue")):
        c = result[part]
        ax.plot(ks, c["value"], marker="o" if len(ks) <= 32 else None, markersize=3, color=color, label=name)
        ax.fill_between(ks, c["ci_low"], c["ci_high"], color=color, alpha=0.2, linewidth=0)
    if result["crossover_k"] is not None:
        ax.axvline(result["crossover_k"], color="tab:red", linestyle="--", linewidth=1,
                   label=f"crossover k={result['crossover_k']}")
    log2_k_axis(ax, int(ks.max()))
    ax.set_xlabel("k (samples per prompt)")
    ax.set_ylabel("pass@k")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"pass@k, {result['n_prompts']} prompts, {int(result['confidence'] * 100)}% CI")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.13, top=0.91)
    return png_bytes(fig)
