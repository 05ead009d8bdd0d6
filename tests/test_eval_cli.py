"""`reinforge eval` on a tiny model folder, a run's final model and its checkpoints, and the
capability-boundary analysis."""

from __future__ import annotations

import functools
import itertools
import json
from pathlib import Path

import pytest
import yaml
from conftest import save_tiny_model

from reinforge.cli import main
from reinforge.config import ConfigError, build_config
from reinforge.evaluation.runner import ModelSource, build_eval_setup, greedy_heldout_eval, load_policy
from reinforge.rollout import HFGenerator
from reinforge.tasks import encode_prompt
from reinforge.tracking import RunDir
from reinforge.tracking.sampled_evals import read_sampled_eval, sampled_eval_labels
from reinforge.trainer import Trainer

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAST = ["--resamples", "300"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    save_tiny_model(root / "tiny-model", hidden=32, layers=1)
    with open(root / "task.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"prompt": f"say {i}", "answer": str(i % 3)}) + "\n")
    raw = {
        "model": {"path": str(root / "tiny-model")},
        "task": {"source": "file", "path": str(root / "task.jsonl"), "eval_size": 6},
        "reward": {"answer_format": "raw", "verifiers": [{"name": "exact_match"}]},
        "rollout": {"num_samples": 4, "max_new_tokens": 6},
        "learner": {"lr": 0.05},
        "trainer": {"steps": 2, "prompts_per_step": 2, "eval_every": 1, "checkpoint_every": 1,
                    "keep_checkpoints": 3, "seed": 3},
        "tracking": {"output_dir": str(root / "runs"), "run_name": "run", "progress": False},
    }
    (root / "base.yaml").write_text(yaml.safe_dump(raw))
    result = Trainer(build_config(raw)).run()
    return root, Path(result.run_dir)


def _brute_pass(correct, k):
    subsets = list(itertools.combinations(range(len(correct)), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


def test_eval_of_a_run_writes_pass_at_k_into_the_run(setup, capsys):
    _, run = setup
    assert main(["eval", str(run), "--samples", "4", *FAST]) == 0
    out = capsys.readouterr().out
    folder = run / "sampled_evals" / "final_n4_T1_len6_seed3"
    assert f"written to {folder}" in out and "| 4 |" in out
    summary = json.loads((folder / "summary.json").read_text())
    rows = [json.loads(line) for line in (folder / "samples.jsonl").read_text().splitlines()]
    assert summary["n_prompts"] == 6 == len(rows) and summary["samples"] == 4
    assert summary["model"]["kind"] == "final" and summary["model"]["step"] == 2
    assert all(len(r["completions"]) == 4 and len(r["correct"]) == 4 for r in rows)
    for entry in summary["pass_at_k"]:
        expected = sum(_brute_pass(r["correct"], entry["k"]) for r in rows) / len(rows)
        assert entry["value"] == pytest.approx(expected)
        assert entry["ci_low"] <= entry["value"] <= entry["ci_high"]
    assert [e["k"] for e in summary["maj_at_k"]] == [1, 2, 3, 4]
    assert summary["reward_mean"] == pytest.approx(sum(sum(r["rewards"]) for r in rows) / 24)
    assert (folder / "passk.png").read_bytes()[:8] == PNG_MAGIC
    assert (folder / "passk.csv").read_text().startswith("k,pass_at_k")
    assert "pass@k" in (folder / "report.md").read_text()


def test_an_eval_under_another_task_keeps_the_runs_own_and_is_not_paired_with_step_0(setup, capsys):
    # e.g. an agent run evaluated with env=null: same checkpoint and sampling, another task.
    _, run = setup
    argv = ["eval", str(run), "--samples", "2", "--seed", "5", *FAST]
    assert main(argv) == 0
    own = "final_n2_T1_len6_seed5"
    before = read_sampled_eval(RunDir.open(run), own)[0]
    assert "step-0" in before["verdict"]["text"]  # the run's own task: paired with its step-0 eval
    assert main([*argv, "task.prompt_suffix=Answer now."]) == 0
    labels = sampled_eval_labels(RunDir.open(run))
    other = [x for x in labels if x.startswith(own + "_cfg")]
    assert len(other) == 1, labels
    after_own = read_sampled_eval(RunDir.open(run), own)[0]
    assert after_own["fingerprint"] == before["fingerprint"]  # not overwritten
    summary = read_sampled_eval(RunDir.open(run), other[0])[0]
    assert summary["task"]["prompt_suffix"] == "Answer now."
    assert summary["verdict"]["base"] is None and "step-0" not in summary["verdict"]["text"]
    capsys.readouterr()
    assert main([*argv, "task.prompt_suffix=Answer now."]) == 0  # the same overrides: reused
    assert "reusing" in capsys.readouterr().err


def test_final_model_and_last_checkpoint_are_the_same_weights(setup, capsys):
    _, run = setup
    assert main(["eval", str(run), "--checkpoint", "step_000002", "--samples", "4", *FAST]) == 0
    assert main(["eval", str(run), "--checkpoint", "1", "--samples", "4", *FAST]) == 0
    assert main(["eval", str(run), "--samples", "4", *FAST]) == 0  # cached from the test above, or made now
    rd = RunDir.open(run)
    final = read_sampled_eval(rd, "final_n4_T1_len6_seed3")[1]
    last = read_sampled_eval(rd, "step_000002_n4_T1_len6_seed3")[1]
    first = read_sampled_eval(rd, "step_000001_n4_T1_len6_seed3")[1]
    assert [r["completions"] for r in final] == [r["completions"] for r in last]
    assert read_sampled_eval(rd, "step_000001_n4_T1_len6_seed3")[0]["model"]["step"] == 1
    assert len(first) == 6
    capsys.readouterr()
    assert main(["eval", str(run), "--checkpoint", "step_000007"]) == 1
    err = capsys.readouterr().err
    assert "no checkpoint 'step_000007'" in err and "step_000001, step_000002" in err


def test_loaded_final_model_reproduces_the_trainers_last_greedy_eval(setup):
    _, run = setup
    rd = RunDir.open(run)
    cfg = rd.load_run_config()
    model, tok = load_policy(cfg, ModelSource.from_run(rd, cfg))
    ev = build_eval_setup(cfg)
    summary, per_prompt = greedy_heldout_eval(
        HFGenerator(model, tok), ev.reward_fn, ev.examples, functools.partial(encode_prompt, tok),
        max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.trainer.seed, guardrails=ev.guardrails)
    assert per_prompt == rd.read_eval_details(2)
    assert summary["accuracy"] == rd.read_evals()[-1]["accuracy"]
    assert summary["guardrails"] == rd.read_evals()[-1]["guardrails"]
    # with progress reported after each generation batch: the same answers, counted as they come
    calls = []
    summary2, per_prompt2 = greedy_heldout_eval(
        HFGenerator(model, tok, batch_size=4), ev.reward_fn, ev.examples, functools.partial(encode_prompt, tok),
        max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.trainer.seed, guardrails=ev.guardrails,
        progress=lambda done, total: calls.append((done, total)))
    n = len(ev.examples)
    assert calls == [(min(k, n), n) for k in range(4, n + 4, 4)]
    assert per_prompt2 == per_prompt and summary2 == summary


def test_temperature_zero_is_greedy_and_matches_the_trainers_held_out_eval(setup):
    # --temperature 0 once divided the logits by zero and sampled garbage from NaNs
    _, run = setup
    assert main(["eval", str(run), "--samples", "1", "--temperature", "0", *FAST]) == 0
    rd = RunDir.open(run)
    (label,) = [x for x in sampled_eval_labels(rd) if x.startswith("final_n1_T0_")]
    rows = read_sampled_eval(rd, label)[1]
    trainer_eval = {r["id"]: r["completion"] for r in rd.read_eval_details(2)}
    assert {r["id"]: r["completions"][0] for r in rows} == trainer_eval
    assert main(["eval", str(run), "--samples", "1", "--temperature", "-1", *FAST]) == 1


def test_eval_of_a_bare_model_makes_an_eval_directory(setup, capsys, tmp_path):
    root, _ = setup
    args = ["eval", str(root / "tiny-model"), "--config", str(root / "base.yaml"), "--samples", "2",
            "--output-dir", str(tmp_path), "task.eval_size=4", *FAST]
    assert main(args) == 0
    (eval_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert "eval-tiny-model-task" in eval_dir.name
    rd = RunDir.open(eval_dir)
    assert rd.status()["state"] == "finished" and rd.kind == "eval"
    (label,) = sampled_eval_labels(rd)
    assert label == "base-tiny-model_n2_T1_len6_seed3"
    summary, rows = read_sampled_eval(rd, label)
    assert summary["n_prompts"] == 4 and summary["model"]["kind"] == "base"
    capsys.readouterr()
    # the same evaluation again, into the same directory: reused, not recomputed
    assert main(["eval", str(eval_dir), "--samples", "2", *FAST]) == 0
    assert "reusing" in capsys.readouterr().err
    assert main(["runs", str(tmp_path)]) == 0
    assert "finished (eval)" in capsys.readouterr().out


def test_a_failed_bare_eval_leaves_no_directory_and_a_taken_name_is_a_clear_error(setup, capsys, tmp_path):
    root, _ = setup
    base = ["eval", str(root / "tiny-model"), "--config", str(root / "base.yaml"), "--samples", "1",
            "--output-dir", str(tmp_path), "--name", "ev", *FAST]
    assert main(base + ["task.eval_size=100000"]) == 1  # more held-out prompts than the task has
    assert "task.eval_size" in capsys.readouterr().err
    assert not (tmp_path / "ev").exists()
    assert main(base + ["task.eval_size=4"]) == 0
    capsys.readouterr()
    assert main(base + ["task.eval_size=4"]) == 2  # a config error
    err = capsys.readouterr().err
    assert "already exists" in err and "--name" in err and "Traceback" not in err


def test_a_bare_eval_reads_a_train_rm_config_and_leaves_its_rm_section(setup, tmp_path):
    # a train-rm config names the policy that samples; `reinforge eval --config` of it once failed
    # with "rm: unknown key"
    root, _ = setup
    raw = yaml.safe_load((root / "base.yaml").read_text())
    raw["rm"] = {"kind": "prm", "train_prompts": 4}
    (tmp_path / "rm.yaml").write_text(yaml.safe_dump(raw))
    args = ["eval", str(root / "tiny-model"), "--config", str(tmp_path / "rm.yaml"), "--samples", "1",
            "--output-dir", str(tmp_path / "evals"), "task.eval_size=3", *FAST]
    assert main(args) == 0
    (eval_dir,) = (tmp_path / "evals").iterdir()
    assert "rm" not in yaml.safe_load((eval_dir / "config.yaml").read_text())
    (label,) = sampled_eval_labels(RunDir.open(eval_dir))
    assert read_sampled_eval(RunDir.open(eval_dir), label)[0]["n_prompts"] == 3
    # outside eval the section is still refused: a typo there must not pass silently
    with pytest.raises(ConfigError, match="rm"):
        build_config(raw)


def test_boundary_between_base_model_and_run(setup, capsys):
    root, run = setup
    assert main(["eval", "--boundary", str(root / "tiny-model"), str(run), "--samples", "4", *FAST]) == 0
    out = capsys.readouterr().out
    assert "Capability boundary" in out
    folder = run / "boundary" / "base-tiny-model_vs_final_n4"
    result = json.loads((folder / "boundary.json").read_text())
    assert result["ks"] == [1, 2, 3, 4] and result["n_prompts"] == 6
    base = read_sampled_eval(RunDir.open(run), "base-tiny-model_n4_T1_len6_seed3")[1]
    expected = sum(_brute_pass(r["correct"], 2) for r in base) / len(base)
    assert result["base"]["value"][1] == pytest.approx(expected)
    assert (folder / "boundary.png").read_bytes()[:8] == PNG_MAGIC
    assert (folder / "boundary.csv").read_text().count("\n") == 5
    assert "| 4 |" in (folder / "boundary.md").read_text()


@pytest.mark.parametrize("argv, code, message", [
    (["eval", "/nonexistent/model"], 2, "does not exist"),
    (["eval"], 2, "needs one MODEL_OR_RUN"),
    (["eval", "a", "b"], 2, "needs one MODEL_OR_RUN"),
])
def test_eval_errors_name_the_problem(argv, code, message, capsys):
    assert main(argv) == code
    assert message in capsys.readouterr().err


def test_checkpoint_needs_a_run(setup, capsys):
    root, _ = setup
    assert main(["eval", str(root / "tiny-model"), "--checkpoint", "1"]) == 2
    assert "--checkpoint needs a run directory" in capsys.readouterr().err
