"""Multi-seed comparison of runs (``reinforge compare``), computed from run directories alone.

1. Runs are grouped by the config keys whose values differ between them. Seeds (any key named
   ``seed``), the ``tracking`` section (names, output folders, exporters) and
   ``trainer.num_threads`` never define a group; the ``task`` section defines the *strata*
   (rliable's tasks) rather than groups, unless ``split_tasks`` is set. A run whose config a
   resume changed (``--new-segment``, segments.json) has a ``segments`` key naming each change and
   its step (``learner.lr=0.001@11``), so it never shares a group with runs that kept one config.
2. Each run is scored by its held-out evaluations (``evals.jsonl``, greedy): the **final** score
   (last evaluation) and the **best** score (maximum over evaluations after step 0; an optimistic
   number, since it picks the checkpoint on the same prompts it reports).
3. Per group: IQM across runs x tasks with stratified bootstrap 95% intervals, the probability of
   improvement between every pair of groups, learning curves (IQM per evaluation step with interval
   bands) and performance profiles, as "Deep Reinforcement Learning at the Edge of the Statistical
   Precipice" (Agarwal et al., 2021, arXiv:2108.13264) recommends. See
   :mod:`reinforge.evaluation.aggregate` for the statistics.

4. Beside the groups, the prior baselines of each run's final evaluation (the guardrails recorded
   in evals.jsonl, :mod:`reinforge.evaluation.guardrails`): the best constant answer, the
   training answers' distribution, the well-formed share and the answer spread.

Outputs (in ``out_dir``): ``report.md``, ``groups.csv``, ``runs.csv``, ``improvement.csv``,
``curves.csv``, ``profiles.csv``, ``aggregates.png``, ``improvement.png``,
``learning_curves.png``, ``performance_profile.png``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from reinforge.evaluation.aggregate import iqm, interval_estimate, mean, performance_profile, poi_interval
from reinforge.evaluation.compare_groups import (
    CompareResult,
    RunScores,
    _group_guardrails,
    _strata,
    collect_runs,
    flatten_config,
    group_runs,
    is_ignored_key,
)
from reinforge.evaluation.report import csv_text, fmt_ci, markdown_table, png_bytes
from reinforge.tracking.io import atomic_write_bytes, atomic_write_text

__all__ = ["flatten_config", "RunScores", "collect_runs", "group_runs", "compare_runs", "CompareResult",
           "is_ignored_key"]


def compare_runs(
    paths: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    metric: str = "accuracy",
    include_unfinished: bool = False,
    ignore: Sequence[str] = (),
    split_tasks: bool = False,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> CompareResult:
    """Group, aggregate and report; see the module docstring. Raises ValueError when no run has a
    held-out evaluation to compare."""
    runs, skipped = collect_runs(paths, metric=metric, include_unfinished=include_unfinished)
    if not runs:
        reasons = "; ".join(f"{p}: {why}" for p, why in skipped[:5])
        raise ValueError(f"no finished training runs with held-out evaluations to compare ({reasons})")
    group_keys, groups = group_runs(runs, ignore=ignore, split_tasks=split_tasks)
    tasks = sorted({r.task for r in runs})
    boot = dict(confidence=confidence, n_resamples=n_resamples, seed=seed)

    stats: dict[str, dict[str, Any]] = {}
    for label, members in groups.items():
        g_tasks = [t for t in tasks if any(r.task == t for r in members)]
        entry: dict[str, Any] = {"n_runs": len(members), "tasks": g_tasks,
                                 "seeds": sorted({str(r.seed) for r in members})}
        for which, fn in (("final", lambda r: r.final), ("best", lambda r: r.best)):
            strata = _strata(members, g_tasks, fn)
            entry[which] = interval_estimate(strata, iqm, **boot)
            entry[f"{which}_mean"] = interval_estimate(strata, mean, **boot)
        entry["guardrails"] = _group_guardrails(members, g_tasks, boot)
        stats[label] = entry

    improvement: list[dict[str, Any]] = []
    labels = list(groups)
    for i, x in enumerate(labels):
        for y in labels[i + 1:]:
            common = [t for t in tasks if any(r.task == t for r in groups[x]) and any(r.task == t for r in groups[y])]
            if not common:
                continue
            for which, fn in (("final", lambda r: r.final), ("best", lambda r: r.best)):
                res = poi_interval(_strata(groups[x], common, fn), _strata(groups[y], common, fn), **boot)
                improvement.append({"x": x, "y": y, "score": which, "tasks": len(common), **res})

    curves: dict[str, list[dict[str, Any]]] = {}
    for label, members in groups.items():
        common_steps = sorted(set.intersection(*(set(r.steps) for r in members)))
        g_tasks = stats[label]["tasks"]
        rows = []
        for step in common_steps:
            strata = _strata(members, g_tasks, lambda r, s=step: r.score_at(s))
            rows.append({"step": step, **interval_estimate(strata, iqm, **boot)})
        curves[label] = rows

    all_final = np.array([r.final for r in runs])
    lo_t, hi_t = (0.0, 1.0) if metric == "accuracy" else (float(all_final.min()), float(all_final.max()))
    if hi_t <= lo_t:
        hi_t = lo_t + 1.0
    taus = np.linspace(lo_t, hi_t, 101)
    profiles = {}
    for label, members in groups.items():
        prof = performance_profile(_strata(members, stats[label]["tasks"], lambda r: r.final), taus, **boot)
        profiles[label] = {k: v.tolist() for k, v in prof.items()}

    result = CompareResult(out_dir=Path(out_dir), group_keys=group_keys, groups=groups, tasks=tasks, stats=stats,
                           improvement=improvement, curves=curves, profiles=profiles, skipped=skipped)
    _write_outputs(result, metric=metric, confidence=confidence, n_resamples=n_resamples, paths=paths)
    return result


# ----------------------------------------------------------------------------- outputs


def _group_ids(result: CompareResult) -> dict[str, str]:
    """Short ids G1, G2, ... for figures and wide tables."""
    return {label: f"G{i + 1}" for i, label in enumerate(result.groups)}


def _legend_labels(result: CompareResult, width: int = 36) -> dict[str, str]:
    """"G1: lr=0.003" for figure legends and axes, cut to ``width`` characters."""
    out = {}
    for label, gid in _group_ids(result).items():
        text = f"{gid}: {label}"
        out[label] = text if len(text) <= width else text[: width - 3] + "..."
    return out


def _write(result: CompareResult, name: str, data: str | bytes) -> None:
    path = result.out_dir / name
    if isinstance(data, bytes):
        atomic_write_bytes(path, data)
    else:
        atomic_write_text(path, data)
    result.files.append(path)


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return [cmap(i % 10) for i in range(n)]


def _plot_aggregates(result: CompareResult, metric: str) -> bytes:
    labels = list(result.groups)
    fig = _figure(9.0, 1.2 + 0.45 * len(labels))
    axes = fig.subplots(1, 2, sharey=True)
    colors = _colors(len(labels))
    for ax, which in zip(axes, ("final", "best")):
        for i, label in enumerate(labels):
            s = result.stats[label][which]
            ax.errorbar([s["value"]], [i], xerr=[[s["value"] - s["ci_low"]], [s["ci_high"] - s["value"]]],
                        fmt="o", color=colors[i], capsize=4, markersize=6)
        ax.set_title(f"{which} held-out {metric} (IQM, 95% CI)", fontsize="medium")
        ax.grid(alpha=0.3, axis="x")
        ax.set_xlabel(metric)
    axes[0].set_yticks(range(len(labels)))
    names = _legend_labels(result)
    axes[0].set_yticklabels([names[lab] for lab in labels])
    axes[0].invert_yaxis()
    left = min(0.45, 0.1 + 0.0085 * max(len(n) for n in names.values()))
    fig.subplots_adjust(left=left, right=0.98, bottom=0.6 / fig.get_figheight(), top=1 - 0.4 / fig.get_figheight(),
                        wspace=0.08)
    return png_bytes(fig)


def _plot_improvement(result: CompareResult) -> bytes:
    ids = _group_ids(result)
    rows = [r for r in result.improvement if r["score"] == "final"]
    fig = _figure(6.4, 1.3 + 0.45 * max(1, len(rows)))
    ax = fig.add_subplot(1, 1, 1)
    if not rows:
        ax.text(0.5, 0.5, "one group: nothing to compare", ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
    for i, r in enumerate(rows):
        ax.errorbar([r["value"]], [i], xerr=[[r["value"] - r["ci_low"]], [r["ci_high"] - r["value"]]], fmt="o",
                    color="tab:blue", capsize=4)
    if rows:
        ax.axvline(0.5, color="gray", linestyle="--", linewidth=1)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"P({ids[r['x']]} > {ids[r['y']]})" for r in rows])
        ax.invert_yaxis()
        ax.set_xlim(-0.02, 1.02)
        ax.set_xlabel("probability of improvement (final score), 95% CI")
        ax.grid(alpha=0.3, axis="x")
    fig.subplots_adjust(left=0.25, right=0.97, bottom=0.6 / fig.get_figheight() + 0.08, top=1 - 0.3 / fig.get_figheight())
    return png_bytes(fig)


def _plot_curves(result: CompareResult, metric: str) -> bytes:
    from matplotlib.ticker import MaxNLocator

    ids = _legend_labels(result)
    fig = _figure(6.8, 4.4)
    ax = fig.add_subplot(1, 1, 1)
    for color, (label, rows) in zip(_colors(len(result.curves)), result.curves.items()):
        if not rows:
            continue
        x = [r["step"] for r in rows]
        ax.plot(x, [r["value"] for r in rows], marker="o", markersize=3, color=color, label=ids[label])
        ax.fill_between(x, [r["ci_low"] for r in rows], [r["ci_high"] for r in rows], color=color, alpha=0.2, linewidth=0)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"held-out {metric} (IQM)")
    ax.set_title("learning curves: IQM across seeds, 95% stratified bootstrap CI", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.12, top=0.91)
    return png_bytes(fig)


def _plot_profiles(result: CompareResult, metric: str) -> bytes:
    ids = _legend_labels(result)
    fig = _figure(6.8, 4.4)
    ax = fig.add_subplot(1, 1, 1)
    for color, (label, p) in zip(_colors(len(result.profiles)), result.profiles.items()):
        ax.plot(p["tau"], p["fraction"], color=color, label=ids[label], drawstyle="steps-post")
        ax.fill_between(p["tau"], p["ci_low"], p["ci_high"], color=color, alpha=0.2, linewidth=0, step="post")
    ax.set_xlabel(f"final held-out {metric} threshold tau")
    ax.set_ylabel("fraction of runs with score > tau")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("performance profile (95% stratified bootstrap CI)", fontsize="medium")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.12, top=0.91)
    return png_bytes(fig)


_RUN_GUARD_COLUMNS = ["best_constant_answer", "best_constant_accuracy", "final_minus_best_constant",
                      "final_minus_best_constant_ci_low", "final_minus_best_constant_ci_high", "train_prior_accuracy",
                      "final_minus_train_prior", "final_minus_train_prior_ci_low", "final_minus_train_prior_ci_high",
                      "well_formed", "distinct_answers", "top_answer_share"]
_GROUP_GUARD_COLUMNS = ["best_constant_accuracy", "final_minus_best_constant", "final_minus_best_constant_ci_low",
                        "final_minus_best_constant_ci_high", "runs_beating_best_constant", "train_prior_accuracy",
                        "final_minus_train_prior", "final_minus_train_prior_ci_low",
                        "final_minus_train_prior_ci_high", "runs_beating_train_prior", "well_formed",
                        "distinct_answers", "top_answer_share"]


def _run_guardrail_cells(r: RunScores) -> list[Any]:
    g = r.guardrails
    if g is None:
        return [""] * len(_RUN_GUARD_COLUMNS)
    cells: list[Any] = []
    for name in ("best_constant", "train_prior"):
        b = g[name]
        if not b.get("applicable"):
            cells += ["n/a"] * (5 if name == "best_constant" else 4)
            continue
        d = b["model_minus"]
        cells += ([b["answer"]] if name == "best_constant" else []) + [b["accuracy"], d["diff"], d["ci_low"], d["ci_high"]]
    return cells + [g["well_formed"], g["distinct_answers"], g["top_answer_share"]]


def _group_guardrail_cells(g: dict[str, Any]) -> list[Any]:
    if not g.get("n_runs"):
        return [""] * len(_GROUP_GUARD_COLUMNS)
    cells: list[Any] = []
    for name in ("best_constant", "train_prior"):
        b = g[name]
        if not b.get("applicable"):
            cells += ["n/a"] * 5
            continue
        d = b["final_minus"]
        cells += [b["accuracy"], d["value"], d["ci_low"], d["ci_high"], b["runs_beating"]]
    return cells + [g["well_formed"], g["distinct_answers"], g["top_answer_share"]]


def _guardrail_report(result: CompareResult, ids: dict[str, str], pct: int) -> list[str]:
    """The prior baselines beside the groups (docs/experiments.md, Guardrails)."""
    labels = list(result.groups)
    lines = ["", "## Prior baselines (guardrails)", ""]
    if not any(result.stats[lab]["guardrails"].get("n_runs") for lab in labels):
        return lines + ["Not recorded: these runs were evaluated before held-out evaluations recorded guardrails."]

    def cell(b: dict[str, Any]) -> tuple[str, str]:
        if not b.get("applicable"):
            return "n/a", "n/a"
        d = b["final_minus"]
        return (f"{b['accuracy']:.3f}" + (f" (`{'`, `'.join(b['answers'][:3])}`)" if "answers" in b else ""),
                f"{d['value']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]; {b['runs_beating']}/{b['n_runs']}")

    rows, words = [], []
    for lab in labels:
        g = result.stats[lab]["guardrails"]
        if not g.get("n_runs"):
            rows.append([ids[lab], lab, 0] + ["not recorded"] * 7)
            continue
        (c_acc, c_diff), (p_acc, p_diff) = cell(g["best_constant"]), cell(g["train_prior"])
        rows.append([ids[lab], lab, g["n_runs"], c_acc, c_diff, p_acc, p_diff, f"{g['well_formed']:.1%}",
                     f"{g['distinct_answers']:.1f}", f"{g['top_answer_share']:.1%}"])
        missed = [what for name, what in (("best_constant", "the best constant answer"),
                                          ("train_prior", "answering with the training answers' distribution"))
                  if g[name].get("applicable") and not g[name]["beats"]]
        words.append(f"- {ids[lab]}: " + (f"does not beat {' nor '.join(missed)}" if missed else
                                           "beats every applicable prior baseline"))
    lines += [
        markdown_table(["id", "group", "runs", "best constant answer: accuracy",
                        f"final - best constant: mean [{pct}% CI]; runs beating it",
                        "training distribution: accuracy", f"final - training distribution [{pct}% CI]; runs beating it",
                        "well-formed", "distinct answers", "top answer share"], rows, "llrlllllrr"),
        "",
        *words,
        "",
        "From each run's final held-out evaluation (evals.jsonl, `guardrails`): the best constant answer (the "
        "answer that would be correct on the most held-out prompts if given to all, scored by the run's "
        "verifiers), the expected accuracy of answering with a random training answer, and the model's "
        "well-formed share, distinct answers and most frequent answer's share (means over runs). "
        "final - baseline: mean over runs of the run's held-out accuracy minus the baseline, with a stratified "
        "bootstrap interval across runs; a run beats a baseline when its own paired bootstrap interval over "
        "prompts lies above zero, and a group when its interval across runs does (with one run: when that "
        "run does).",
    ]
    return lines


def _write_outputs(result: CompareResult, *, metric: str, confidence: float, n_resamples: int,
                   paths: Sequence[Any]) -> None:
    ids = _group_ids(result)
    labels = list(result.groups)
    pct = int(round(confidence * 100))

    g_rows = []
    for label in labels:
        s = result.stats[label]
        g_rows.append([ids[label], label, s["n_runs"], len(s["tasks"]), " ".join(s["seeds"]),
                       s["final"]["value"], s["final"]["ci_low"], s["final"]["ci_high"], s["final_mean"]["value"],
                       s["best"]["value"], s["best"]["ci_low"], s["best"]["ci_high"], s["best_mean"]["value"]])
    for row, label in zip(g_rows, labels):
        row += _group_guardrail_cells(result.stats[label]["guardrails"])
    _write(result, "groups.csv", csv_text(
        ["id", "group", "n_runs", "n_tasks", "seeds", "final_iqm", "final_ci_low", "final_ci_high", "final_mean",
         "best_iqm", "best_ci_low", "best_ci_high", "best_mean", *_GROUP_GUARD_COLUMNS], g_rows))
    r_rows = []
    for label in labels:
        for r in result.groups[label]:
            r_rows.append([str(r.run.path), ids[label], label, r.task, r.seed, r.state, r.final_step, r.final,
                           r.best_step, r.best, *_run_guardrail_cells(r), r.dtype, r.machine])
    _write(result, "runs.csv", csv_text(
        ["run", "id", "group", "task", "seed", "state", "final_step", f"final_{metric}", "best_step", f"best_{metric}",
         *_RUN_GUARD_COLUMNS, "dtype", "machine"], r_rows))
    _write(result, "improvement.csv", csv_text(
        ["x", "y", "score", "tasks", "p_x_beats_y", "ci_low", "ci_high"],
        [[ids[r["x"]], ids[r["y"]], r["score"], r["tasks"], r["value"], r["ci_low"], r["ci_high"]]
         for r in result.improvement]))
    _write(result, "curves.csv", csv_text(
        ["id", "step", "iqm", "ci_low", "ci_high", "n_runs"],
        [[ids[label], r["step"], r["value"], r["ci_low"], r["ci_high"], r["n_runs"]]
         for label, rows in result.curves.items() for r in rows]))
    _write(result, "profiles.csv", csv_text(
        ["id", "tau", "fraction_above", "ci_low", "ci_high"],
        [[ids[label], t, f, lo, hi] for label, p in result.profiles.items()
         for t, f, lo, hi in zip(p["tau"], p["fraction"], p["ci_low"], p["ci_high"])]))
    _write(result, "aggregates.png", _plot_aggregates(result, metric))
    _write(result, "improvement.png", _plot_improvement(result))
    _write(result, "learning_curves.png", _plot_curves(result, metric))
    _write(result, "performance_profile.png", _plot_profiles(result, metric))

    few = min(s["n_runs"] for s in result.stats.values())
    lines = [
        "# Comparison of runs",
        "",
        f"{sum(len(m) for m in result.groups.values())} runs in {len(labels)} group(s), from "
        + ", ".join(f"`{p}`" for p in paths) + f"; written {time.strftime('%Y-%m-%d %H:%M:%S')}.",
        "",
        "Runs are grouped by the config keys that differ between them: "
        + (", ".join(f"`{k}`" for k in result.group_keys) if result.group_keys else "none (one group)")
        + ". Seeds, the `tracking` section and thread counts never define a group"
        + (f"; the task defines the strata ({len(result.tasks)} task(s))." if len(result.tasks) > 1 else ".")
        + f" Score: held-out `{metric}` from the runs' greedy evaluations (evals.jsonl).",
        "",
        "## Final and best score per group",
        "",
        markdown_table(
            ["id", "group", "runs", f"final {metric}: IQM [{pct}% CI]", "final mean", f"best {metric}: IQM [{pct}% CI]"],
            [[ids[lab], lab, result.stats[lab]["n_runs"],
              fmt_ci(result.stats[lab]["final"]["value"], result.stats[lab]["final"]["ci_low"], result.stats[lab]["final"]["ci_high"]),
              f"{result.stats[lab]['final_mean']['value']:.3f}",
              fmt_ci(result.stats[lab]["best"]["value"], result.stats[lab]["best"]["ci_low"], result.stats[lab]["best"]["ci_high"])]
             for lab in labels], "llrlrl"),
        "",
        "![final and best score](aggregates.png)",
        "",
        "- **IQM** (interquartile mean): the mean of the middle 50% of run scores; with fewer than 4 runs per "
        "group it equals the mean. **Intervals**: stratified percentile bootstrap "
        f"({n_resamples} resamples; seeds resampled within each task). Agarwal et al., 2021, arXiv:2108.13264.",
        "- **final**: the last evaluation of each run. **best**: each run's best evaluation after step 0; "
        "it picks the checkpoint on the same prompts it scores, so it is optimistic.",
    ]
    if few < 5:
        lines.append(f"- Only {few} run(s) in the smallest group: bootstrap intervals over so few seeds are "
                     "rough (they tend to be too narrow). More seeds tighten them.")
    lines += _guardrail_report(result, ids, pct)
    lines += ["", "## Probability of improvement", ""]
    finals = [r for r in result.improvement if r["score"] == "final"]
    if finals:
        lines += [
            markdown_table(
                ["comparison", "P(X > Y), final score", f"{pct}% CI", "best score"],
                [[f"{ids[r['x']]} vs {ids[r['y']]}", f"{r['value']:.3f}", f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]",
                  next(f"{b['value']:.3f} [{b['ci_low']:.3f}, {b['ci_high']:.3f}]" for b in result.improvement
                       if b["score"] == "best" and b["x"] == r["x"] and b["y"] == r["y"])]
                 for r in finals], "lrll"),
            "",
            "![probability of improvement](improvement.png)",
            "",
            "P(X > Y): the probability that a random run of X scores higher than a random run of Y on the same "
            "task (ties count one half), averaged over tasks. 0.5 means no difference; an interval that "
            "excludes 0.5 is a difference these seeds support.",
        ]
    else:
        lines.append("Only one group: nothing to compare.")
    lines += [
        "",
        "## Learning curves",
        "",
        "![learning curves](learning_curves.png)",
        "",
        "IQM across the runs of each group at every evaluation step they share, with a 95% stratified "
        "bootstrap band (curves.csv).",
        "",
        "## Performance profiles",
        "",
        "![performance profile](performance_profile.png)",
        "",
        "For each threshold tau, the fraction of runs whose final score exceeds tau: the whole distribution "
        "of outcomes across seeds, not one number (profiles.csv). A curve that lies above another everywhere "
        "is stochastically dominant.",
        "",
        "## Runs",
        "",
        markdown_table(["run", "id", "task", "seed", "final step", f"final {metric}", f"best {metric} (step)",
                        "dtype", "machine"],
                       [[r.name, ids[lab], r.task, r.seed, r.final_step, f"{r.final:.3f}", f"{r.best:.3f} ({r.best_step})",
                         r.dtype, r.machine or "?"]
                        for lab in labels for r in result.groups[lab]], "lllrrrlll"),
        "",
        "dtype: the run's compute dtype (model.dtype, resolved when the run started); machine: its CPU "
        "model and instruction-set capability (and GPU), from environment.json. Speeds compare only on "
        "the same machine and dtype.",
        "",
    ]
    if result.skipped:
        lines += ["Left out:", ""] + [f"- `{p}`: {why}" for p, why in result.skipped] + [""]
    lines += ["Files: groups.csv, runs.csv, improvement.csv, curves.csv, profiles.csv and the figures above.", ""]
    _write(result, "report.md", "\n".join(lines))
