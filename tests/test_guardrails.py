"""Guardrails on constructed evaluations, scored by real verifiers on real reasoning-gym tasks and
files: a model that always answers the training mode is flagged as the prior, a format-only gain
is flagged as format, a genuine gain gets a positive verdict; the counts on hand-built data; the
trainer records them, summary.md and `reinforge compare` show them."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import save_tiny_model

from reinforge.cli import main
from reinforge.config import build_config
from reinforge.evaluation.guardrails import (
    Guardrails,
    PromptCounts,
    answer_spread,
    extract_answers,
    prompt_counts,
    well_formed_flags,
)
from reinforge.evaluation.stats import paired_bootstrap_statistic
from reinforge.evaluation.verdict import guardrail_verdict
from reinforge.rewards import build_reward
from reinforge.tasks import build_task
from reinforge.tracking import RunDir
from reinforge.trainer import Trainer

BOOT = 2000


@pytest.fixture(scope="module")
def count_bits():
    """reasoning-gym's count_bits (popcount of 1..1023: answers 5 and 4/6 are the common ones),
    scored by reasoning-gym's own scorer in the sandboxed scoring pool."""
    cfg = build_config({"task": {"name": "count_bits", "options": {"min_n": 1, "max_n": 1023}, "train_size": 600,
                                 "eval_size": 120, "seed": 0},
                        "reward": {"verifiers": [{"name": "task"}]}})
    task = build_task(cfg.task)
    reward_fn = build_reward(cfg.reward, task)
    guard = Guardrails.build(task, reward_fn, cfg.reward, n_resamples=BOOT)
    return task, reward_fn, guard, list(task.eval_examples())


def _measure(guard, examples, completions):
    """Score constructed completions with the real reward function, then measure."""
    outcomes = guard.reward_fn(completions, examples)
    correct = [[float(o.correct)] for o in outcomes]
    record, extra = guard.measure(examples, [[c] for c in completions], correct)
    counts = PromptCounts.from_lists(correct, [x["well_formed"] for x in extra], ids=[e.id for e in examples])
    return record, counts


def _wrong(answer: str) -> str:
    return str(int(answer) + 20)  # popcounts of 1..1023 are at most 10


# -- hand-built counts ---------------------------------------------------------------------------


def test_well_formed_and_answer_spread_on_hand_built_completions():
    comps = ["<answer>6</answer>", "I think <answer> 6 </answer>", "<answer>4</answer>", "6", "<answer></answer>",
             "<answer>6"]
    assert well_formed_flags(comps, "tags") == [True, True, True, False, False, False]
    answers = extract_answers(comps, "tags")
    assert answers == ["6", "6", "4", None, None, None]
    spread = answer_spread(answers)
    assert spread == {"n_completions": 6, "n_answered": 3, "distinct_answers": 2, "top_answer": "6",
                      "top_answer_count": 2, "top_answer_share": pytest.approx(2 / 6)}
    # case-insensitive like maj@k, shown in the model's most common spelling
    assert answer_spread(["True", "true", "True", "False"])["top_answer"] == "True"
    assert answer_spread(["True", "true", "True", "False"])["distinct_answers"] == 2
    assert well_formed_flags(["so \\boxed{x+1}", "\\boxed{}", "no box"], "boxed") == [True, False, False]
    assert answer_spread([None, None])["distinct_answers"] == 0


def test_measure_counts_match_hand_counts(count_bits):
    task, _, guard, examples = count_bits
    ex = examples[:8]
    comps = [f"<answer>{e.answer}</answer>" for e in ex[:3]] + ["<answer>7</answer>"] * 3 + ["seven", "<answer>"]
    record, counts = _measure(guard, ex, comps)
    gold7 = sum(e.answer == "7" for e in ex[3:6])
    assert record["n_completions"] == 8 and record["n_well_formed"] == 6
    assert record["well_formed"] == pytest.approx(6 / 8)
    assert record["accuracy_well_formed"] == pytest.approx((3 + gold7) / 6)
    assert record["distinct_answers"] == len({e.answer for e in ex[:3]} | {"7"})
    assert record["top_answer"] == Counter([e.answer for e in ex[:3]] + ["7"] * 3).most_common(1)[0][0]
    assert record["top_answer_share"] == pytest.approx(Counter([e.answer for e in ex[:3]] + ["7"] * 3)
                                                       .most_common(1)[0][1] / 8)


def test_best_constant_is_scored_by_the_verifier_not_by_string_equality(tmp_path):
    """Gold answers written as 1/2, 0.5 and \\frac{1}{2}: math-verify accepts one constant for all
    of them, which string equality would split three ways."""
    golds = ["1/2", "0.5", "\\frac{1}{2}", "3", "1/2", "0.5", "7", "\\frac{1}{2}", "2", "0.50"]
    with open(tmp_path / "train.jsonl", "w") as f:
        for i in range(20):
            f.write(json.dumps({"prompt": f"train {i}", "answer": ["1/2", "3", "3", "0.5"][i % 4]}) + "\n")
    with open(tmp_path / "eval.jsonl", "w") as f:
        for i, g in enumerate(golds):
            f.write(json.dumps({"prompt": f"eval {i}", "answer": g}) + "\n")
    cfg = build_config({"task": {"source": "file", "path": str(tmp_path / "train.jsonl"),
                                 "eval_path": str(tmp_path / "eval.jsonl")},
                        "reward": {"verifiers": [{"name": "math_verify"}], "answer_format": "boxed"}})
    task = build_task(cfg.task)
    guard = Guardrails.build(task, build_reward(cfg.reward, task), cfg.reward, n_resamples=BOOT)
    examples = list(task.eval_examples())
    record, _ = _measure(guard, examples, ["\\boxed{3}"] * len(examples))
    const = record["best_constant"]
    assert const["applicable"] and const["accuracy"] == pytest.approx(7 / 10)  # every form of one half
    assert const["answer"] in {"1/2", "0.5", "\\frac{1}{2}", "0.50"}
    assert max(Counter(golds).values()) / len(golds) == 0.2  # what string equality would have found
    # the training distribution: half of the training answers are one half (1/2 or 0.5), half 3
    prior = record["train_prior"]
    assert prior["accuracy"] == pytest.approx(0.5 * 7 / 10 + 0.5 * 1 / 10)
    # the model always answers 3 (1 prompt of 10): 0.1 - 0.7
    assert const["model_minus"]["diff"] == pytest.approx(0.1 - 0.7)


# -- the three verdicts --------------------------------------------------------------------------


def test_a_model_that_always_answers_the_training_mode_is_flagged_as_the_prior(count_bits):
    task, _, guard, examples = count_bits
    train_mode = Counter(task.train_examples()[i].answer for i in range(len(task.train_examples()))).most_common(1)[0][0]
    base, base_counts = _measure(guard, examples, ["<answer>0</answer>"] * len(examples))  # always wrong
    record, counts = _measure(guard, examples, [f"<answer>{train_mode}</answer>"] * len(examples))
    assert base_counts.accuracy == 0.0 and counts.accuracy > 0.15  # a large gain over the base model ...
    assert record["distinct_answers"] == 1 and record["top_answer_share"] == 1.0
    assert record["best_constant"]["accuracy"] >= counts.accuracy
    v = guardrail_verdict(counts, record, base_counts, n_resamples=BOOT)
    assert v["gain_over_base"]["ci_low"] > 0  # ... that is significant,
    assert "prior" in v["flags"] and v["status"] == "explained"  # and explained by the prior
    assert "does not beat the best constant answer" in v["text"]


def test_a_format_only_gain_is_flagged(count_bits):
    _, _, guard, examples = count_bits
    # base: the even prompts tagged (half of them right), the odd ones right but untagged
    base_comps, model_comps = [], []
    for i, e in enumerate(examples):
        ans = e.answer if i % 4 in (0, 1) else _wrong(e.answer)
        base_comps.append(f"<answer>{ans}</answer>" if i % 2 == 0 else f"The answer is {ans}.")
        model_comps.append(f"<answer>{ans}</answer>")  # the same answers, all in the format
    base, base_counts = _measure(guard, examples, base_comps)
    record, counts = _measure(guard, examples, model_comps)
    assert base_counts.well_formed_share == 0.5 and counts.well_formed_share == 1.0
    assert base_counts.accuracy_well_formed == pytest.approx(counts.accuracy_well_formed)
    v = guardrail_verdict(counts, record, base_counts, n_resamples=BOOT)
    assert v["gain_over_base"]["ci_low"] > 0
    assert v["flags"] == ["format"] and v["status"] == "explained"
    assert "gain explained by format: accuracy among well-formed answers did not rise" in v["text"]
    assert v["format_only_accuracy"] == pytest.approx(0.5)
    assert v["over_format_only"]["ci_low"] <= 0 <= v["over_format_only"]["ci_high"]


def test_a_genuine_gain_gets_a_positive_verdict(count_bits):
    _, _, guard, examples = count_bits
    base, base_counts = _measure(guard, examples, [f"<answer>{_wrong(e.answer)}</answer>" for e in examples])
    comps = [f"<answer>{e.answer if i % 10 < 7 else _wrong(e.answer)}</answer>" for i, e in enumerate(examples)]
    record, counts = _measure(guard, examples, comps)
    assert counts.accuracy == pytest.approx(np.mean([i % 10 < 7 for i in range(len(examples))]))
    v = guardrail_verdict(counts, record, base_counts, n_resamples=BOOT)
    assert v["flags"] == [] and v["status"] == "genuine"
    assert v["text"].startswith("genuine gain: beats the base model")
    for key in ("gain_over_base", "over_best_constant", "over_train_prior", "over_format_only",
                "well_formed_accuracy_change"):
        assert v[key]["ci_low"] > 0, key
    # no significant gain: said first, whatever else
    flat = guardrail_verdict(base_counts, base, base_counts, n_resamples=BOOT)
    assert flat["status"] == "no_gain" and flat["text"].startswith("no significant gain")
    assert "worse" not in flat["flags"]
    # a loss whose interval lies below zero is named as a loss (the trained model is the worse one)
    lost = guardrail_verdict(base_counts, base, counts, n_resamples=BOOT)
    assert lost["status"] == "no_gain" and "worse" in lost["flags"]
    assert lost["text"].startswith("significantly worse than the base model: -0.")


def test_code_tasks_report_constant_answers_as_not_applicable():
    cfg = build_config({"task": {"source": "code", "name": "basic", "eval_size": 3},
                        "reward": {"verifiers": [{"name": "code"}]}})
    task = build_task(cfg.task)
    guard = Guardrails.build(task, build_reward(cfg.reward, task), cfg.reward, n_resamples=BOOT)
    examples = list(task.eval_examples())
    ep = [e.metadata["entry_point"] for e in examples]
    comps = [f"```python\ndef {ep[0]}(*a):\n    return 0\n```", "```python\ndef nope(:\n```",
             f"def {ep[2]}(x): return x"]
    record, extra = guard.measure(examples, [[c] for c in comps], [[0.0]] * 3)
    assert [x["well_formed"][0] for x in extra] == [True, False, True]
    assert record["best_constant"] == {"applicable": False, "reason": record["best_constant"]["reason"]}
    assert "running code" in record["best_constant"]["reason"]
    assert record["train_prior"]["applicable"] is False
    assert record["distinct_answers"] == 3
    counts = prompt_counts([{"id": e.id, "completion": c, "correct": 0.0} for e, c in zip(examples, comps)],
                           "tags", code=True)
    assert counts.well_formed_share == pytest.approx(2 / 3)  # from the text: the broken program does not parse
    v = guardrail_verdict(counts, record, counts, n_resamples=BOOT)
    assert v["over_best_constant"] is None and v["status"] == "no_gain"


def test_ratio_bootstrap_pairs_prompts_and_skips_undefined_resamples():
    # correct well-formed / well-formed: prompts 3 and 4 have no well-formed answer, so some
    # resamples (only those prompts drawn) have no ratio and are left out, not counted as NaN
    num, den = np.array([1.0, 0.0, 0.0, 0.0]), np.array([1.0, 1.0, 0.0, 0.0])
    out = paired_bootstrap_statistic([num, den], lambda a, b: a.sum(1) / b.sum(1), n_resamples=500, seed=1)
    assert out["value"] == pytest.approx(0.5) and out["ci_low"] == 0.0 and out["ci_high"] == 1.0
    diff = paired_bootstrap_statistic([num, den, num], lambda a, b, c: a.sum(1) / b.sum(1) - c.mean(1),
                                      n_resamples=500, seed=1)
    assert diff["value"] == pytest.approx(0.5 - 0.25) and diff["ci_low"] < diff["value"] < diff["ci_high"]
    none = paired_bootstrap_statistic([num, np.zeros(4)], lambda a, b: a.sum(1) / b.sum(1), n_resamples=50)
    assert np.isnan(none["value"]) and not none["excludes_zero"]
    with pytest.raises(ValueError, match="same items"):
        paired_bootstrap_statistic([num, den[:3]], lambda a, b: a.sum(1))


# -- recorded by the trainer, shown in summary.md and `reinforge compare` ------------------------


def _constructed_run(root: Path, name: str, task_cfg: dict, answers: list[str], guard, examples, seed: int) -> Path:
    """A finished run directory whose step-0 and step-1 evaluations are the given answers, recorded
    the way the trainer records them (real verifier, real guardrails)."""
    cfg = build_config({"task": task_cfg, "reward": {"verifiers": [{"name": "task"}]},
                        "trainer": {"seed": seed, "steps": 1},
                        "tracking": {"output_dir": str(root), "run_name": name, "progress": False}})
    rd = RunDir.create(cfg, name=name)
    for step, comps in ((0, ["<answer>0</answer>"] * len(examples)), (1, [f"<answer>{a}</answer>" for a in answers])):
        outcomes = guard.reward_fn(comps, examples)
        correct = [float(o.correct) for o in outcomes]
        record, extra = guard.measure(examples, [[c] for c in comps], [[c] for c in correct])
        rows = [{"id": e.id, "answer": e.answer, "completion": c, "correct": k, "reward": k,
                 "extracted": x["answers"][0], "well_formed": x["well_formed"][0]}
                for e, c, k, x in zip(examples, comps, correct, extra)]
        rd.log_eval(step, {"accuracy": float(np.mean(correct)), "guardrails": record}, rows)
    rd.set_status("finished")
    rd.release_writer()
    return rd.path


def test_compare_shows_the_baselines_beside_the_groups(count_bits, tmp_path):
    task, _, guard, examples = count_bits
    task_cfg = {"name": "count_bits", "options": {"min_n": 1, "max_n": 1023}, "train_size": 600, "eval_size": 120}
    mode = Counter(e.answer for e in examples).most_common(1)[0][0]
    runs = tmp_path / "runs"
    for seed in (0, 1):
        # group "prior": always the most common held-out answer; group "skill": mostly right
        _constructed_run(runs / "prior", f"prior{seed}", {**task_cfg, "prompt_suffix": " (a)"}, [mode] * len(examples),
                         guard, examples, seed)
        answers = [e.answer if (i + seed) % 10 < 8 else _wrong(e.answer) for i, e in enumerate(examples)]
        _constructed_run(runs / "skill", f"skill{seed}", {**task_cfg, "prompt_suffix": " (b)"}, answers, guard,
                         examples, seed)
    out = tmp_path / "cmp"
    assert main(["compare", str(runs), "--out", str(out), "--split-tasks"]) == 0
    report = (out / "report.md").read_text()
    section = report.split("## Prior baselines (guardrails)")[1].split("## Probability")[0]
    const = Counter(e.answer for e in examples)[mode] / len(examples)
    assert f"{const:.3f} (`{mode}`)" in section
    lines = {ln.split(":")[0]: ln for ln in section.splitlines() if ln.startswith("- G")}
    groups = list(csv.DictReader((out / "groups.csv").open()))
    by_suffix = {g["group"]: g for g in groups}
    prior_id = next(g["id"] for g in groups if "(a)" in g["group"])
    skill_id = next(g["id"] for g in groups if "(b)" in g["group"])
    assert "does not beat the best constant answer" in lines[f"- {prior_id}"]
    assert "beats every applicable prior baseline" in lines[f"- {skill_id}"]
    assert all(float(g["best_constant_accuracy"]) == pytest.approx(const) for g in by_suffix.values())
    assert next(g for g in groups if g["id"] == prior_id)["runs_beating_best_constant"] == "0"
    assert next(g for g in groups if g["id"] == skill_id)["runs_beating_best_constant"] == "2"
    run_rows = list(csv.DictReader((out / "runs.csv").open()))
    assert {r["best_constant_answer"] for r in run_rows} == {mode}
    assert all(float(r["top_answer_share"]) == 1.0 for r in run_rows if r["id"] == prior_id)


def test_trainer_records_guardrails_and_summary_shows_the_verdict(tmp_path):
    save_tiny_model(tmp_path / "model", hidden=32, layers=1)
    with open(tmp_path / "task.jsonl", "w") as f:
        for i in range(30):
            f.write(json.dumps({"prompt": f"say {i} mod 3", "answer": str(i % 3)}) + "\n")
    raw = {"model": {"path": str(tmp_path / "model")},
           "task": {"source": "file", "path": str(tmp_path / "task.jsonl"), "eval_size": 6},
           "reward": {"answer_format": "raw", "verifiers": [{"name": "exact_match"}]},
           "rollout": {"num_samples": 2, "max_new_tokens": 4},
           "trainer": {"steps": 1, "prompts_per_step": 2, "eval_every": 1, "checkpoint_every": 0},
           "tracking": {"output_dir": str(tmp_path / "runs"), "run_name": "r", "progress": False}}
    result = Trainer(build_config(raw)).run()
    rd = RunDir.open(result.run_dir)
    evals = rd.read_evals()
    assert [e["step"] for e in evals] == [0, 1]
    for e in evals:
        g = e["guardrails"]
        rows = rd.read_eval_details(e["step"])
        assert g["n_prompts"] == len(rows) == 6
        assert e["well_formed"] == g["well_formed"] == np.mean([r["well_formed"] for r in rows])
        assert g["best_constant"]["answer"] in {"0", "1", "2"} | {r["extracted"] for r in rows}
        assert e["best_constant_accuracy"] == g["best_constant"]["accuracy"] >= 2 / 6  # 6 prompts, 3 answers
    summary_md = (rd.path / "summary.md").read_text()
    assert "Guardrails at step 1" in summary_md and "best constant answer" in summary_md
    assert "**Verdict**:" in summary_md
    summary = json.loads((rd.path / "summary.json").read_text())
    assert summary["verdict"]["status"] in {"no_gain", "explained", "genuine"}
    assert summary["guardrails"]["step"] == 1
    assert yaml.safe_load((rd.path / "config.yaml").read_text())["reward"]["answer_format"] == "raw"

    # `reinforge eval` of the run: the sampled evaluation records them too, with a verdict
    # against the run's step-0 greedy evaluation
    assert main(["eval", str(rd.path), "--samples", "3", "--resamples", "300"]) == 0
    folder = next((rd.path / "sampled_evals").iterdir())
    sampled = json.loads((folder / "summary.json").read_text())
    g = sampled["guardrails"]
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    assert g["n_completions"] == 18 and sampled["well_formed"] == np.mean([w for r in rows for w in r["well_formed"]])
    assert sampled["verdict"]["base"] == "the base model (the run's step-0 greedy evaluation)"
    assert sampled["verdict"]["gain_over_base"] is not None
    report = (folder / "report.md").read_text()
    assert "## Guardrails" in report and "best constant answer" in report and "**Verdict**" in report
