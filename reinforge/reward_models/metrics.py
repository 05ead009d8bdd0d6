"""The held-out measurement of ``reinforge train-rm``: step- (or outcome-) label accuracy and AUC,
and best-of-N reranking by the reward model against majority vote and a random pick, with
bootstrap intervals over prompts (reinforge/evaluation/stats.py); ``format_summary`` writes it
as summary.md."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from reinforge.reward_models.config import RMSettings
from reinforge.rewards.models.verifiers import aggregate_steps


def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (the probability a random positive outscores a random negative,
    ties counting half); NaN when one class is missing."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    pos, neg = scores[labels], scores[~labels]
    if not len(pos) or not len(neg):
        return float("nan")
    order = np.argsort(np.concatenate([pos, neg]), kind="mergesort")
    allv = np.concatenate([pos, neg])[order]
    ranks = np.empty(len(allv))
    i = 0
    while i < len(allv):  # average ranks over ties
        j = i
        while j + 1 < len(allv) and allv[j + 1] == allv[i]:
            j += 1
        ranks[i : j + 1] = (i + j) / 2 + 1
        i = j + 1
    r = np.empty(len(allv))
    r[order] = ranks
    return float((r[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg)))


def majority_pick(answers: list[str | None]) -> int:
    """Index of a completion holding the most common answer (ties: the answer seen first;
    completions without an answer never win unless none has one)."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return 0
    best = max(counts.values())
    for i, a in enumerate(answers):
        if a is not None and counts[a] == best:
            return i
    return 0


def _cluster_interval(groups: list[np.ndarray], stat, n_resamples: int, seed: int) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat`` over items clustered by prompt: prompts are
    resampled with replacement, their items kept together (steps of one prompt are not independent)."""
    from reinforge.evaluation.stats import bootstrap_ci

    def on(idx):
        picked = [groups[int(i)] for i in np.asarray(idx)]
        v = stat(np.concatenate(picked) if picked else np.zeros(0, dtype=int))
        return 0.5 if np.isnan(v) else v

    return bootstrap_ci(np.arange(len(groups), dtype=float), statistic=on, n_resamples=n_resamples, seed=seed)


def evaluate_records(records: list[dict], rm: RMSettings, *, seed: int = 0) -> dict[str, Any]:
    """The held-out measurement from labelled records carrying the reward model's predictions
    (``pred``: a probability per step, or one per completion for an outcome RM)."""
    from reinforge.evaluation.stats import bootstrap_ci, paired_bootstrap_diff

    by_prompt: dict[str, list[dict]] = {}
    for r in records:
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    prompts = sorted(by_prompt)
    # Step (or outcome) labels: binary = any rollout from the prefix reached a correct answer.
    preds, labels, groups, pos = [], [], [], 0
    for p in prompts:
        start = pos
        for r in by_prompt[p]:
            ys = r["step_labels"] if rm.kind == "prm" else [float(r["correct"])]
            for y, q in zip(ys, r["pred"]):
                preds.append(q)
                labels.append(y > 0)
                pos += 1
        groups.append(np.arange(start, pos))
    preds_a, labels_a = np.asarray(preds, float), np.asarray(labels, bool)
    n_res = rm.bootstrap_resamples
    unit = "step" if rm.kind == "prm" else "outcome"
    out: dict[str, Any] = {"kind": rm.kind, "prompts": len(prompts), f"{unit}_labels": int(len(labels_a)),
                           f"{unit}_positive_frac": float(labels_a.mean()) if len(labels_a) else float("nan")}
    if len(labels_a):
        acc = lambda idx: float(((preds_a[idx] > 0.5) == labels_a[idx]).mean()) if len(idx) else float("nan")  # noqa: E731
        auc = lambda idx: roc_auc(preds_a[idx], labels_a[idx])  # noqa: E731
        all_idx = np.arange(len(labels_a))
        out[f"{unit}_accuracy"] = acc(all_idx)
        out[f"{unit}_accuracy_ci"] = _cluster_interval(groups, acc, n_res, seed)
        out[f"{unit}_auc"] = auc(all_idx)
        out[f"{unit}_auc_ci"] = _cluster_interval(groups, auc, n_res, seed) if not np.isnan(out[f"{unit}_auc"]) else None
    # Best-of-N: the RM's pick vs majority vote vs a random pick (its exact expectation), per prompt.
    rm_pick, maj, rand, oracle = [], [], [], []
    for p in prompts:
        rows = sorted(by_prompt[p], key=lambda r: r["sample"])
        correct = [float(r["correct"]) for r in rows]
        score = [aggregate_steps(r["pred"], rm.aggregate) if rm.kind == "prm" else r["pred"][0] for r in rows]
        rm_pick.append(correct[int(np.argmax(score))])
        maj.append(correct[majority_pick([r["answer"] for r in rows])])
        rand.append(float(np.mean(correct)))
        oracle.append(float(max(correct)))
    for name, v in (("rm", rm_pick), ("majority", maj), ("random", rand), ("oracle", oracle)):
        out[f"best_of_n_{name}"] = float(np.mean(v))
        out[f"best_of_n_{name}_ci"] = bootstrap_ci(v, n_resamples=n_res, seed=seed)
    out["rm_minus_majority"] = paired_bootstrap_diff(maj, rm_pick, n_resamples=n_res, seed=seed)
    out["rm_minus_random"] = paired_bootstrap_diff(rand, rm_pick, n_resamples=n_res, seed=seed)
    out["n"] = max((len(v) for v in by_prompt.values()), default=0)
    return out


def format_summary(ev: dict[str, Any], run: Path) -> str:
    unit = "step" if ev["kind"] == "prm" else "outcome"

    def ci(key: str) -> str:
        v = ev.get(key)
        return f"[{v[0]:.3f}, {v[1]:.3f}]" if v else "n/a"

    lines = [f"# train-rm: {ev['kind']} reward model", "", f"run: {run}", "",
             f"Held-out: {ev['prompts']} prompts, {ev[f'{unit}_labels']} {unit} labels "
             f"({ev[f'{unit}_positive_frac']:.3f} positive), 95% bootstrap intervals over prompts.", "",
             "| measure | value | 95% interval |", "|---|---|---|"]
    if f"{unit}_accuracy" in ev:
        lines.append(f"| {unit}-label accuracy (p > 0.5) | {ev[f'{unit}_accuracy']:.3f} | {ci(f'{unit}_accuracy_ci')} |")
        lines.append(f"| {unit}-label AUC | {ev[f'{unit}_auc']:.3f} | {ci(f'{unit}_auc_ci')} |")
    for name in ("rm", "majority", "random", "oracle"):
        label = {"rm": "best-of-N, reward model's pick", "majority": "best-of-N, majority vote",
                 "random": "best-of-N, random pick", "oracle": "pass@N (any correct)"}[name]
        lines.append(f"| {label} (N={ev['n']}) | {ev[f'best_of_n_{name}']:.3f} | {ci(f'best_of_n_{name}_ci')} |")
    for key, label in (("rm_minus_majority", "reward model - majority"), ("rm_minus_random", "reward model - random")):
        d = ev[key]
        lines.append(f"| {label} (paired) | {d['diff']:+.3f} | [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}] |")
    return "\n".join(lines) + "\n"
