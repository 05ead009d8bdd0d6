"""Issue 28, finding 5: a prompt (as the trainer encodes it) plus rollout.max_new_tokens that does
not fit the model's context is refused before training with the example and the numbers, or, with
task.truncate_prompts=left, cut from the left and counted."""

from __future__ import annotations

import json
import logging
import re
import subprocess

import pytest
from conftest import make_tokenizer
from tiny_run import cli_in_process, save_tiny_run_inputs, tiny_run_overrides

from reinforge.config import ConfigError, build_config
from reinforge.rollout.context import fit_prompts, model_context
from reinforge.tasks import Example, encode_prompt
from reinforge.tasks.prompts import encode_prompts


def _model_dir(tmp_path, **config):
    path = tmp_path / "model"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def _ex(i: int, text: str, split: str = "train") -> Example:
    return Example(f"t/{split}/{i}", [{"role": "user", "content": text}], "7")


def test_the_context_is_the_models_positions_else_the_tokenizers_stated_limit(tmp_path):
    tok = make_tokenizer()
    assert tok.model_max_length > 10**9  # "no limit" as transformers writes it: not a context
    assert model_context(_model_dir(tmp_path, max_position_embeddings=512), tok)[0] == 512
    assert model_context(_model_dir(tmp_path, n_positions=1024, n_ctx=1024), tok)[0] == 1024  # GPT-2's names
    assert model_context(_model_dir(tmp_path, text_config={"max_position_embeddings": 2048}), tok)[0] == 2048
    assert model_context(_model_dir(tmp_path, hidden_size=8), tok) == (None, "")
    tok.model_max_length = 300
    assert model_context(_model_dir(tmp_path, hidden_size=8), tok) == (300, "the tokenizer's model_max_length")


def test_batched_encoding_gives_the_ids_of_one_prompt_at_a_time():
    tok = make_tokenizer()
    examples = [_ex(0, "plain"), _ex(1, "with <|im_end|> a control token in the text"),
                Example("t/train/2", [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"},
                                      {"role": "assistant", "content": "a"}, {"role": "user", "content": "q2"}], "7")]
    one_by_one = [encode_prompt(tok, e) for e in examples]
    assert encode_prompts(tok, examples, chunk=2) == one_by_one and len({len(ids) for ids in one_by_one}) == 3
    tok.chat_template = None  # a base model: contents joined by newlines, with the tokenizer's special tokens
    assert encode_prompts(tok, examples) == [encode_prompt(tok, e) for e in examples]


def test_prompts_that_fit_are_encoded_once_into_the_cache(tmp_path):
    tok, cfg = make_tokenizer(), build_config({}, ["rollout.max_new_tokens=16"])
    train, held = [_ex(i, "say " * i) for i in range(5)], [_ex(0, "held out", "eval")]
    cache: dict[str, list[int]] = {}
    fit = fit_prompts(cfg, _model_dir(tmp_path, max_position_embeddings=64), tok,
                      {"training": train, "held-out": held}, cache)
    assert cache == {e.id: encode_prompt(tok, e) for e in train + held}
    assert fit.longest_train == len(encode_prompt(tok, train[-1])) and fit.cut_prompts == 0 and fit.context == 64


def test_a_held_out_prompt_too_long_is_refused_naming_it_and_the_numbers(tmp_path):
    tok, cfg = make_tokenizer(), build_config({}, ["rollout.max_new_tokens=16"])
    held = [_ex(0, "short", "eval"), _ex(1, "x" * 40, "eval")]
    n = len(encode_prompt(tok, held[1]))
    with pytest.raises(ConfigError) as err:
        fit_prompts(cfg, _model_dir(tmp_path, max_position_embeddings=64), tok,
                    {"training": [_ex(0, "hi")], "held-out": held}, {})
    msg = str(err.value)
    assert "\n" not in msg
    assert f"held-out example 't/eval/1' has {n} tokens" in msg and f"rollout.max_new_tokens=16 = {n + 16}" in msg
    assert "context of 64 tokens (max_position_embeddings in" in msg and "1 of 3 prompts do not fit" in msg
    assert f"lower rollout.max_new_tokens to {64 - n} or less" in msg and "task.truncate_prompts=left" in msg


def test_max_new_tokens_alone_beyond_the_context_is_refused(tmp_path):
    tok, cfg = make_tokenizer(), build_config({}, ["rollout.max_new_tokens=64"])
    with pytest.raises(ConfigError, match=r"rollout.max_new_tokens=64 leaves no room for a prompt in the model's "
                       r"context of 64 tokens .*lower rollout.max_new_tokens to at most"):
        fit_prompts(cfg, _model_dir(tmp_path, max_position_embeddings=64), tok, {"training": [_ex(0, "hi")]}, {})


def test_vllms_smaller_max_model_len_is_the_context(tmp_path):
    tok = make_tokenizer()
    cfg = build_config({}, ["rollout.max_new_tokens=16", "rollout.backend=vllm", "rollout.vllm_max_model_len=32"])
    with pytest.raises(ConfigError, match=r"context of 32 tokens \(rollout.vllm_max_model_len\)"):
        fit_prompts(cfg, _model_dir(tmp_path, max_position_embeddings=4096), tok, {"training": [_ex(0, "y" * 30)]}, {})


def test_left_truncation_cuts_the_start_and_counts_what_was_cut(tmp_path, caplog):
    tok = make_tokenizer()
    cfg = build_config({}, ["rollout.max_new_tokens=16", "task.truncate_prompts=left"])
    train = [_ex(0, "short"), _ex(1, "a" * 80), _ex(2, "b" * 70)]
    held = [_ex(0, "c" * 100, "eval")]
    full = {e.id: encode_prompt(tok, e) for e in train + held}
    cache: dict[str, list[int]] = {}
    with caplog.at_level(logging.WARNING, logger="reinforge"):
        fit = fit_prompts(cfg, _model_dir(tmp_path, max_position_embeddings=64), tok,
                          {"training": train, "held-out": held}, cache)
    room = 64 - 16
    cut = sum(len(ids) - room for ids in full.values() if len(ids) > room)
    assert cache["t/train/0"] == full["t/train/0"]
    for key in ("t/train/1", "t/train/2", "t/eval/0"):
        assert cache[key] == full[key][-room:]  # the end stays: the question's end and the assistant's turn
    assert (fit.cut_prompts, fit.cut_tokens, fit.longest_train) == (3, cut, room)
    assert (f"cut the start of 3 of 4 prompts (2 training, 1 held-out), {cut} tokens in all, to at most {room} "
            "tokens each") in caplog.text


def test_a_multi_turn_run_is_checked_with_its_trajectory_budget_and_never_cut(tmp_path):
    tok = make_tokenizer()
    n = len(encode_prompt(tok, _ex(0, "z" * 50)))
    model = _model_dir(tmp_path, max_position_embeddings=n + 100)
    # rollout.max_new_tokens does not count (the turns are budgeted by env.*), env.max_tokens does
    cfg = build_config({}, ["rollout.max_new_tokens=500", "env={name: calculator, max_tokens: 100}"])
    cache: dict = {}
    fit = fit_prompts(cfg, model, tok, {"training": [_ex(0, "z" * 50)]}, cache)
    assert fit.longest_train == n and fit.context == n + 100 and cache == {}
    cfg = build_config({}, ["env={name: calculator, max_tokens: 101}"])
    with pytest.raises(ConfigError) as err:
        fit_prompts(cfg, model, tok, {"training": [_ex(0, "z" * 50)], "held-out": [_ex(1, "y")]}, {})
    msg = str(err.value)
    assert (f"training example 't/train/0' opens with {n} tokens" in msg and "env.max_tokens=101 more may follow" in msg
            and f"{n + 101} in all, beyond the model's context of {n + 100} tokens" in msg
            and "lower env.max_tokens to 100 or less" in msg), msg


# ----------------------------------------------------------------------------- the real command line

LONG_ROW = 30  # the row index of the long prompt in the task file (after 30 short ones)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = save_tiny_run_inputs(tmp_path_factory.mktemp("context"))  # max_position_embeddings=512
    with open(root / "task.jsonl", "a") as f:
        f.write(json.dumps({"prompt": "count the sevens: " + "7 " * 400, "answer": "7"}) + "\n")
    return root


def _train(*args: str) -> subprocess.CompletedProcess:
    return cli_in_process("train", *args)  # a refusal needs no process of its own


def test_the_cli_refuses_a_prompt_beyond_the_context_before_training(inputs):
    proc = _train(*tiny_run_overrides(inputs, "long", "trainer.steps=1"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("reinforge:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    m = re.search(r"reinforge: prompt too long for the model: (training|held-out) example "
                  rf"'file:task.jsonl/(train|eval)/{LONG_ROW}' has (\d+) tokens .* \+ rollout.max_new_tokens=6 = "
                  r"(\d+), beyond the model's context of 512 tokens \(max_position_embeddings in .*config.json\); "
                  r"1 of 31 prompts do not fit\. .*task.truncate_prompts=left", lines[0])
    assert m and int(m[3]) > 800 and int(m[4]) == int(m[3]) + 6, lines[0]
    assert not (inputs / "runs" / "long").exists()  # refused before the model loaded and the run was made


def test_the_cli_cuts_the_prompt_when_asked_and_says_how_much(inputs):
    refused = _train(*tiny_run_overrides(inputs, "long2", "trainer.steps=1"))
    tokens = int(re.search(r"has (\d+) tokens", refused.stderr)[1])
    proc = _train(*tiny_run_overrides(inputs, "cut", "trainer.steps=1", "task.truncate_prompts=left"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("task.truncate_prompts=left: cut the start of 1 of 31 prompts" in proc.stderr
            and f"{tokens - (512 - 6)} tokens in all, to at most {512 - 6} tokens each" in proc.stderr), proc.stderr
    status = json.loads((inputs / "runs" / "cut" / "status.json").read_text())
    assert status["state"] == "finished"


def _eval(inputs, tmp_path, *extra: str) -> subprocess.CompletedProcess:
    """`reinforge eval` of the tiny model on a held-out file of two short prompts and the long one."""
    rows = (inputs / "task.jsonl").read_text().splitlines()
    (tmp_path / "held.jsonl").write_text("\n".join([rows[0], rows[1], rows[LONG_ROW]]) + "\n")
    over = [o for o in tiny_run_overrides(inputs, None) if o.startswith(("model.", "task.", "reward."))]
    return cli_in_process("eval", str(inputs / "model"), "--samples", "1", "--resamples", "100",
                          "--output-dir", str(tmp_path), "--name", "ev", *over,
                          f"task.eval_path={tmp_path / 'held.jsonl'}", "task.eval_size=3", *extra)


def test_eval_refuses_a_prompt_beyond_the_context_naming_its_own_flag(inputs, tmp_path):
    proc = _eval(inputs, tmp_path, "--max-new-tokens", "8")
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("reinforge:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert re.search(r"prompt too long for the model: held-out example '[^']+' has \d+ tokens .* "
                     r"\+ --max-new-tokens=8 = \d+, beyond the model's context of 512 tokens", lines[0]), lines[0]
    assert not (tmp_path / "ev").exists()  # refused before the model loaded: no empty eval directory
    proc = _eval(inputs, tmp_path, "--max-new-tokens", "600")
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "--max-new-tokens=600 leaves no room for a prompt" in proc.stderr, proc.stderr[-3000:]


def test_eval_cuts_the_prompt_when_asked_and_evaluates_every_prompt(inputs, tmp_path):
    proc = _eval(inputs, tmp_path, "--max-new-tokens", "4", "task.truncate_prompts=left")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("task.truncate_prompts=left: cut the start of 1 of 3 prompts (1 held-out)" in proc.stderr
            and "so that --max-new-tokens=4 fits" in proc.stderr), proc.stderr[-3000:]
    from reinforge.tracking import RunDir
    from reinforge.tracking.sampled_evals import read_sampled_eval, sampled_eval_labels

    rd = RunDir.open(tmp_path / "ev")
    (label,) = sampled_eval_labels(rd)
    assert read_sampled_eval(rd, label)[0]["n_prompts"] == 3
