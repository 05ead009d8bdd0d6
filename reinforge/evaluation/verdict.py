"""The verdict on a held-out gain, and its report lines.

:func:`guardrail_verdict` turns two evaluations (the base model's and a later one) into one
verdict: the gain over the base model and over the prior baselines (best constant answer,
training distribution, and the *format-only baseline*, the base model's accuracy among its
well-formed completions: what fixing the format alone would give), each with a 95% paired
bootstrap interval, and plain words when the prior or the format explains the gain. The
guardrails themselves (what a score must beat) are measured in
:mod:`reinforge.evaluation.guardrails`; :func:`backfill_run` records them for runs made before
they existed.
"""

from __future__ import annotations

import math
from typing import Any

from reinforge.evaluation.guardrails import Guardrails, PromptCounts, _diff_fields, _short, flat_metrics
from reinforge.evaluation.stats import paired_bootstrap_diff, paired_bootstrap_statistic

__all__ = [
    "backfill_run",
    "guardrail_lines",
    "guardrail_verdict",
    "spec_from_config",
    "verdict_lines",
]


def spec_from_config(config: dict[str, Any]) -> tuple[str, bool]:
    """(answer format, scored by code) from a run's saved config dict."""
    reward = config.get("reward") or {}
    names = {v.get("name") for v in reward.get("verifiers") or [] if isinstance(v, dict)}
    code = "code" in names or (config.get("task") or {}).get("source") == "code"
    return reward.get("answer_format", "tags"), code


def _fmt_diff(d: dict[str, Any]) -> str:
    return f"{d['diff']:+.3f} [{d['ci_low']:+.3f}, {d['ci_high']:+.3f}]"


def _beats(d: dict[str, Any] | None) -> bool:
    return d is not None and math.isfinite(d["ci_low"]) and d["ci_low"] > 0


def guardrail_verdict(model: PromptCounts, record: dict[str, Any], base: PromptCounts | None = None, *,
                      base_label: str = "the base model", seed: int = 0, n_resamples: int = 10_000,
                      confidence: float = 0.95) -> dict[str, Any]:
    """The verdict on one evaluation (``model`` with its guardrail ``record``) against the base
    model's evaluation on the same prompts (paired by id) and the prior baselines.

    Returns {"gain_over_base", "over_best_constant", "over_train_prior", "over_format_only",
    "well_formed_accuracy_change" (each {"diff", "ci_low", "ci_high", "excludes_zero"} or None
    when not measurable), "over_baselines" (an environment's baseline policies: name -> the same
    fields), "flags" (subset of "no_gain", "prior", "format", "baseline"), "status" ("genuine",
    "explained", "no_gain" or "priors_only" without a base), "text" (one line in plain words)}.
    """
    boot = dict(confidence=confidence, n_resamples=n_resamples, seed=seed)
    out: dict[str, Any] = {"base": base_label if base is not None else None, "gain_over_base": None,
                           "over_format_only": None, "well_formed_accuracy_change": None}
    const, prior = record.get("best_constant") or {}, record.get("train_prior") or {}
    out["over_best_constant"] = const.get("model_minus") if const.get("applicable") else None
    out["over_train_prior"] = prior.get("model_minus") if prior.get("applicable") else None
    policies = {k: b for k, b in (record.get("baselines") or {}).items() if b.get("applicable")}
    out["over_baselines"] = {k: b["model_minus"] for k, b in policies.items()}
    notes: list[str] = []
    if base is not None:
        ids = [i for i in model.ids if i in set(base.ids)]
        if not ids:
            raise ValueError("the evaluation and its base share no prompt: nothing to pair")
        m, b = model.select(ids), base.select(ids)
        out["n_paired"] = len(ids)
        out["gain_over_base"] = _diff_fields(paired_bootstrap_diff(b.per_prompt_accuracy, m.per_prompt_accuracy, **boot))
        out["base_accuracy"] = b.accuracy
        out["base_well_formed"] = b.well_formed_share
        out["base_accuracy_well_formed"] = b.accuracy_well_formed
        if b.wf.sum() > 0:
            # format-only baseline: the base model's accuracy among its well-formed completions
            fmt = paired_bootstrap_statistic(
                [m.correct, m.n, b.correct_wf, b.wf],
                lambda mc, mn, bc, bw: mc.sum(1) / mn.sum(1) - bc.sum(1) / bw.sum(1), **boot)
            out["format_only_accuracy"] = b.accuracy_well_formed
            out["over_format_only"] = {"diff": fmt["value"], "ci_low": fmt["ci_low"], "ci_high": fmt["ci_high"],
                                       "excludes_zero": fmt["excludes_zero"]}
            if m.wf.sum() > 0:
                wfc = paired_bootstrap_statistic(
                    [m.correct_wf, m.wf, b.correct_wf, b.wf],
                    lambda mc, mw, bc, bw: mc.sum(1) / mw.sum(1) - bc.sum(1) / bw.sum(1), **boot)
                out["well_formed_accuracy_change"] = {"diff": wfc["value"], "ci_low": wfc["ci_low"],
                                                      "ci_high": wfc["ci_high"], "excludes_zero": wfc["excludes_zero"]}
        else:
            notes.append("format-only baseline not measurable: the base model gave no well-formed answer")
    flags: list[str] = []
    reasons: list[str] = []
    gain = out["gain_over_base"]
    if base is not None and not _beats(gain):
        flags.append("no_gain")
    if const.get("applicable") and not _beats(out["over_best_constant"]):
        flags.append("prior")
        reasons.append(f"does not beat the best constant answer (`{_short(const['answer'])}`, "
                       f"{const['accuracy']:.3f}): {_fmt_diff(out['over_best_constant'])}")
    if prior.get("applicable") and not _beats(out["over_train_prior"]):
        if "prior" not in flags:
            flags.append("prior")
        reasons.append(f"does not beat answering with the training answers' distribution "
                       f"({prior['accuracy']:.3f}): {_fmt_diff(out['over_train_prior'])}")
    for name, b in policies.items():  # an environment's baseline policies (random, scripted)
        if not _beats(b["model_minus"]):
            if "baseline" not in flags:
                flags.append("baseline")
            reasons.append(f"does not beat the {name} policy's success ({b['success']:.3f}): "
                           f"{_fmt_diff(b['model_minus'])}")
    if base is not None and _beats(gain):
        fo, wfc = out["over_format_only"], out["well_formed_accuracy_change"]
        if fo is not None and not _beats(wfc):
            flags.append("format")
            b_wf = out["base_accuracy_well_formed"]
            m_wf = model.select(ids).accuracy_well_formed
            change = _fmt_diff(wfc) if wfc is not None else "n/a (no well-formed answer now)"
            reasons.append(f"gain explained by format: accuracy among well-formed answers did not rise "
                           f"({b_wf:.3f} -> {m_wf if m_wf is None else format(m_wf, '.3f')}, {change}; "
                           f"well-formed {out['base_well_formed']:.1%} -> {model.select(ids).well_formed_share:.1%})")
        elif fo is not None and not _beats(fo):
            flags.append("format")
            reasons.append(f"does not beat the format-only baseline (the base model's accuracy among its "
                           f"well-formed answers, {out['format_only_accuracy']:.3f}): {_fmt_diff(fo)}")
    out["flags"] = flags
    if base is not None:
        head = f"gain over {base_label} {_fmt_diff(gain)}"
        if "no_gain" in flags:
            status = "no_gain"
            # an interval wholly below zero is a loss, not a null result: say so
            worse = gain is not None and math.isfinite(gain["ci_high"]) and gain["ci_high"] < 0
            if worse:
                flags.append("worse")
            text = ((f"significantly worse than {base_label}: {_fmt_diff(gain)}" if worse
                     else f"no significant gain over {base_label}: {_fmt_diff(gain)}")
                    + (f"; it also {'; '.join(reasons)}" if reasons else ""))
        elif reasons:
            status = "explained"
            text = f"{head}, but it " + "; ".join(reasons)
        else:
            status = "genuine"
            parts = [f"{base_label} ({_fmt_diff(gain)})"]
            if out["over_best_constant"] is not None:
                parts.append(f"the best constant answer ({_fmt_diff(out['over_best_constant'])})")
            if out["over_train_prior"] is not None:
                parts.append(f"the training answers' distribution ({_fmt_diff(out['over_train_prior'])})")
            parts += [f"the {k} policy ({_fmt_diff(d)})" for k, d in out["over_baselines"].items()]
            if out["over_format_only"] is not None:
                parts.append(f"the format-only baseline ({_fmt_diff(out['over_format_only'])})")
            text = "genuine gain: beats " + ", ".join(parts) + ", each with a 95% interval above zero"
    else:
        status = "explained" if reasons else "priors_only"
        text = ("the model " + "; ".join(reasons)) if reasons else (
            "beats the prior baselines" + (f" (best constant answer {_fmt_diff(out['over_best_constant'])})"
                                           if out["over_best_constant"] is not None else "")
            + "; no base evaluation to measure a gain against")
    if notes:
        text += " (" + "; ".join(notes) + ")"
    out["status"] = status
    out["text"] = text
    return out


# ----------------------------------------------------------------------------- text


def guardrail_lines(record: dict[str, Any], *, base_record: dict[str, Any] | None = None,
                    base_name: str = "step 0") -> list[str]:
    """Markdown bullets for one evaluation's guardrail record (with the base's values beside)."""
    def was(key: str, fmt: str) -> str:
        if base_record is None or base_record.get(key) is None:
            return ""
        return f" ({base_name}: {format(base_record[key], fmt)})"

    awf = record.get("accuracy_well_formed")
    lines = [
        f"- well-formed answers: {record['well_formed']:.1%}{was('well_formed', '.1%')}; accuracy among them "
        f"{'n/a' if awf is None else format(awf, '.3f')}{was('accuracy_well_formed', '.3f')}",
    ]
    top = record.get("top_answer")
    spread = (f"- distinct answers: {record['distinct_answers']}{was('distinct_answers', 'd')}; most frequent "
              + (f"`{_short(top)}` on {record['top_answer_share']:.1%} of completions" if top is not None else "none")
              + (f" ({base_name}: `{_short(base_record['top_answer'])}` on {base_record['top_answer_share']:.1%})"
                 if base_record is not None and base_record.get("top_answer") is not None else ""))
    lines.append(spread)
    const, prior = record["best_constant"], record["train_prior"]
    if const.get("applicable"):
        lines.append(f"- best constant answer: `{_short(const['answer'])}` scores {const['accuracy']:.3f} "
                     f"(best of {const['n_candidates']} candidates, scored by the reward's verifiers"
                     f"{_errors_note(const)}); model minus it {_fmt_diff(const['model_minus'])}")
    else:
        lines.append(f"- best constant answer: not applicable ({const.get('reason')})")
    if prior.get("applicable"):
        lines.append(f"- answering with the training answers' distribution: {prior['accuracy']:.3f} expected "
                     f"accuracy ({prior['distinct_train_answers']} distinct answers in {prior['train_answers']} "
                     f"training examples, most common `{_short(prior['top_train_answer'])}` "
                     f"{prior['top_train_share']:.1%}{_errors_note(prior)}); model minus it "
                     f"{_fmt_diff(prior['model_minus'])}")
    else:
        lines.append(f"- training answers' distribution: not applicable ({prior.get('reason')})")
    for name, b in (record.get("baselines") or {}).items():
        lines.append(f"- {name} policy (the environment's baseline, no model): success {b['success']:.3f} on the "
                     f"{b['n_episodes']} held-out episodes ({b['max_turns']} turns at most); model minus it "
                     f"{_fmt_diff(b['model_minus'])}")
    return lines


def _errors_note(baseline: dict[str, Any]) -> str:
    """Scorings of a baseline that were reward errors count as wrong: said, so a low baseline is not
    taken for a measured one."""
    n = baseline.get("reward_errors") or 0
    return f"; {n} scorings were reward errors, counted as wrong" if n else ""


def verdict_lines(verdict: dict[str, Any]) -> list[str]:
    lines = []
    fo = verdict.get("over_format_only")
    if fo is not None:
        lines.append(f"- format-only baseline (accuracy among the well-formed answers of {verdict['base']}): "
                     f"{verdict['format_only_accuracy']:.3f}; model minus it {_fmt_diff(fo)}")
    lines.append(f"- **Verdict**: {verdict['text']}.")
    return lines


# ----------------------------------------------------------------------------- old runs


def backfill_run(run_path: Any, *, seed: int | None = None) -> list[dict[str, Any]]:
    """Compute and record the guardrails of every greedy evaluation of a run made before they
    existed (evals.jsonl lines without "guardrails"), from its saved completions, task and reward
    config. Writes evals.jsonl and evals/ of the run (take a copy to keep the original); the
    summary is rewritten by ``reinforge.lifecycle.summary.write_run_summary``. Returns the updated
    evals.jsonl lines."""
    from reinforge.config import RunConfig
    from reinforge.rewards import build_reward
    from reinforge.tasks import build_task
    from reinforge.tracking import RunDir
    from reinforge.tracking.io import atomic_write_json, rewrite_jsonl
    from reinforge.tracking.run_dir import EVAL_DETAILS_DIR, EVALS_FILE, _eval_detail_name

    rd = RunDir.open(run_path)
    cfg = RunConfig.model_validate(rd.load_config())
    task = build_task(cfg.task)
    reward_fn = build_reward(cfg.reward, task)
    guard = Guardrails.build(task, reward_fn, cfg.reward, seed=cfg.trainer.seed if seed is None else seed)
    by_id = {e.id: e for e in task.eval_examples()}
    evals = rd.read_evals()
    rd.acquire_writer()
    try:
        for line in evals:
            step = int(line["step"])
            if "guardrails" in line or step not in rd.eval_steps():
                continue
            rows = rd.read_eval_details(step)
            missing = [r["id"] for r in rows if r["id"] not in by_id]
            if missing:
                raise ValueError(f"eval at step {step} has prompts the task no longer makes (first {missing[0]!r})")
            record, extra = guard.measure([by_id[r["id"]] for r in rows], [[r["completion"]] for r in rows],
                                          [[float(r["correct"])] for r in rows])
            for r, x in zip(rows, extra):
                r["extracted"], r["well_formed"] = x["answers"][0], x["well_formed"][0]
            atomic_write_json(rd.path / EVAL_DETAILS_DIR / _eval_detail_name(step), rows, indent=None)
            line.update(flat_metrics(record))
            line["guardrails"] = record
        rewrite_jsonl(rd.path / EVALS_FILE, evals)
    finally:
        rd.release_writer()
    return evals

