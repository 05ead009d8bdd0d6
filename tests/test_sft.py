"""Warm starts: demonstrations (from a task, from a file), the SFT loss on response tokens only,
exact resume, the SFT stage before RL in one run, and expert iteration's filter. Tiny real
models, real reasoning-gym tasks and verifiers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import make_model, make_tokenizer, save_tiny_model
from safetensors.torch import load_file
from tiny_run import run_metrics

from reinforge.batch import TrainBatch
from reinforge.cli import main
from reinforge.config import RewardConfig, build_config
from reinforge.learner import Learner
from reinforge.rewards import build_reward
from reinforge.sft import (
    Demo, DemoError, SFTRunner, batch_positions, collate, demos_from_file, demos_from_task, select_accepted,
    tokenize_demo,
)
from reinforge.sft.data import tokenize_demos
from reinforge.sft.runner import sft_learner_config
from reinforge.tasks import PromptFormat, ReasoningGymTask
from reinforge.tracking import RunDir


def _ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


# ----------------------------------------------------------------------------- demonstrations


@pytest.mark.parametrize("fmt", ["tags", "boxed", "last_line"])
def test_task_demonstrations_are_scored_correct_by_the_tasks_own_verifier(fmt):
    """A demonstration made from the gold answer is what the verifier accepts, in every answer
    format: an SFT'd model that imitates it scores."""
    task = ReasoningGymTask("spell_backward", train_size=20, eval_size=5, seed=3)
    reward = build_reward(RewardConfig(answer_format=fmt), task)
    demos = demos_from_task(task, num_examples=12, answer_format=fmt)
    assert [d.id for d in demos] == [e.id for e in task.train_examples()[:12]]  # training examples only
    outcomes = reward([d.response for d in demos], list(task.train_examples()[:12]))
    assert all(o.correct for o in outcomes), [(d.response, o) for d, o in zip(demos, outcomes) if not o.correct]
    # a wrong answer in the same format is not accepted (the check can fail)
    wrong = reward([demos[1].response], [task.train_examples()[0]])
    assert not wrong[0].correct


def test_worked_solutions_precede_the_answer_and_still_score():
    """gsm_symbolic's metadata carries a worked solution (answer_cot): it is written before the
    answer, and the verifier still takes the answer from the end."""
    task = ReasoningGymTask("gsm_symbolic", train_size=4, eval_size=2, seed=0)
    reward = build_reward(RewardConfig(answer_format="tags"), task)
    demos = demos_from_task(task, num_examples=3, answer_format="tags", solution_keys=["answer_cot"])
    for d, e in zip(demos, task.train_examples()):
        cot = e.metadata["metadata"]["answer_cot"]
        assert d.response == f"{cot.strip()}\n<answer>{e.answer}</answer>" and d.metadata["worked_solution"]
    assert all(o.correct for o in reward([d.response for d in demos], list(task.train_examples()[:3])))
    bare = demos_from_task(task, num_examples=1, answer_format="tags", solution_keys=[])
    assert bare[0].response == f"<answer>{task.train_examples()[0].answer}</answer>"


def test_chain_sum_worked_solutions_script_writes_demos_the_verifier_accepts(tmp_path):
    """scripts/chain_sum_demos.py (the PRM warm start, docs/reward_models.md): one line per
    operation, the prompt exactly as the task renders it, and an answer the verifier accepts."""
    import subprocess
    import sys

    import yaml

    raw = {"task": {"source": "reasoning_gym", "name": "chain_sum", "train_size": 30, "eval_size": 5, "seed": 1,
                    "options": {"min_terms": 3, "max_terms": 4, "min_digits": 1, "max_digits": 2},
                    "prompt_suffix": "\nSolve it step by step."},
           "reward": {"answer_format": "tags", "verifiers": [{"name": "exact_match"}]}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    script = Path(__file__).resolve().parents[1] / "scripts" / "chain_sum_demos.py"
    subprocess.run([sys.executable, str(script), str(tmp_path / "c.yaml"), "--n", "20", "--out",
                    str(tmp_path / "d.jsonl")], check=True, capture_output=True)
    demos = demos_from_file(tmp_path / "d.jsonl")
    task = ReasoningGymTask("chain_sum", train_size=30, eval_size=5, seed=1,
                            options=raw["task"]["options"], prompt_format=PromptFormat(suffix="\nSolve it step by step."))
    examples = list(task.train_examples()[:20])
    assert [d.messages for d in demos] == [e.messages for e in examples]
    reward = build_reward(RewardConfig(answer_format="tags"), task)
    assert all(o.correct for o in reward([d.response for d in demos], examples))
    for d, e in zip(demos, examples):  # one line per operation, then the answer
        assert len(d.response.splitlines()) == e.metadata["metadata"]["num_terms"]


def _write(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("bad,message", [
    ({"prompt": "q"}, "line 2 has no 'response'"),
    ({"question": "q", "response": "a"}, "line 2 has no 'prompt'"),
    ({"prompt": "q", "response": ""}, "line 2: the response is empty"),
    ({"prompt": 3, "response": "a"}, "line 2: field 'prompt' must be a string or a list of chat messages"),
    ({"messages": [{"role": "user", "content": "q"}]}, "line 2: the last message of 'messages' has role 'user'"),
    ({"messages": "hi"}, "line 2: field 'messages' must be a list"),
    ("{not json", "line 2 is not valid JSON"),
    ([1, 2], "line 2 is a list, not an object of fields"),
])
def test_bad_rows_are_named_with_the_fix(tmp_path, bad, message):
    path = _write(tmp_path / "demos.jsonl", [{"prompt": "p", "response": "r"}, bad])
    with pytest.raises(Exception) as err:
        demos_from_file(path)
    assert message in str(err.value) and "demos.jsonl" in str(err.value)
    if "has no" in message:  # the fix is named too
        assert "sft.prompt_field" in str(err.value) and "sft.messages_field" in str(err.value)


def test_bad_row_fails_the_cli_before_any_model_loads(tmp_path, capsys):
    path = _write(tmp_path / "d.jsonl", [{"prompt": "p", "response": "r"}, {"prompt": "p2", "answer": "r"}])
    rc = main(["sft", "sft.source=file", f"sft.path={path}", f"model.path={tmp_path / 'no-such-model'}",
               "task.name=count_bits", "task.eval_size=2", f"tracking.output_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert rc == 1 and "line 2 has no 'response'" in err and "no-such-model" not in err
    assert not (tmp_path / "runs").exists()


def test_file_rows_and_chat_messages_tokenize_to_prompt_then_response_and_stop(tmp_path):
    tok = make_tokenizer()
    path = _write(tmp_path / "d.parquet.jsonl", [
        {"prompt": "2+2?", "response": "<answer>4</answer>"},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "3+3?"},
                      {"role": "assistant", "content": "<answer>6</answer>"}]},
    ])
    fmt = PromptFormat(suffix=" Answer in tags.")
    demos = demos_from_file(path, prompt_format=fmt)
    assert demos[0].messages == [{"role": "user", "content": "2+2? Answer in tags."}]
    assert demos[1].messages[-1] == {"role": "user", "content": "3+3? Answer in tags."}
    eos = tok.eos_token_id
    t = tokenize_demo(tok, demos[1], eos)
    rendered = tok.apply_chat_template(demos[1].messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert t.prompt_ids == list(rendered)
    assert t.response_ids == _ids(tok, "<answer>6</answer>") + [eos]


def test_demonstrations_beyond_the_models_context_are_left_out_and_named(caplog):
    tok = make_tokenizer()
    eos = tok.eos_token_id
    demos = [Demo("short", [{"role": "user", "content": "2+2?"}], "<answer>4</answer>"),
             Demo("long", [{"role": "user", "content": "count: " + "7 " * 300}], "<answer>300</answer>")]
    n_long = len(tokenize_demo(tok, demos[1], eos))
    assert n_long > 300
    with caplog.at_level("WARNING", logger="reinforge"):
        kept = tokenize_demos(tok, demos, eos, max_tokens=1024, context=(300, "max_position_embeddings in m"))
    assert [d.id for d in kept] == ["short"]
    assert (f"1 of 2 demonstrations are longer than the model's context of 300 tokens (max_position_embeddings "
            f"in m) and are left out (the longest, 'long', has {n_long})") in caplog.text
    # a context above sft.max_tokens changes nothing; below it, sft.max_tokens is the limit and is named
    assert [d.id for d in tokenize_demos(tok, demos, eos, max_tokens=2048, context=(4096, "c"))] == ["short", "long"]
    with pytest.raises(DemoError, match="no demonstration fits in the model's context of 5 tokens .*shorten"):
        tokenize_demos(tok, demos, eos, max_tokens=1024, context=(5, "c"))
    with pytest.raises(DemoError, match=r"no demonstration fits in sft.max_tokens=5 tokens; raise sft.max_tokens"):
        tokenize_demos(tok, demos, eos, max_tokens=5, context=(512, "c"))


def test_a_held_out_prompt_beyond_the_context_fails_sft_before_the_model_loads(tmp_path, capsys):
    save_tiny_model(tmp_path / "model", hidden=32, layers=1)  # 512 positions
    demos = _write(tmp_path / "d.jsonl", [{"prompt": "p", "response": "r"}])
    rows = [{"prompt": f"say {i}", "answer": str(i)} for i in range(8)]
    task = _write(tmp_path / "task.jsonl", rows)
    held = _write(tmp_path / "held.jsonl", rows[:2] + [{"prompt": "count: " + "7 " * 400, "answer": "7"}])
    rc = main(["sft", "sft.source=file", f"sft.path={demos}", f"model.path={tmp_path / 'model'}", "task.source=file",
               f"task.path={task}", f"task.eval_path={held}", "task.eval_size=3",
               f"tracking.output_dir={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert rc == 2 and "prompt too long for the model: held-out example" in err, err[-3000:]
    assert "beyond the model's context of 512 tokens" in err and "task.truncate_prompts=left" in err
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------- the loss


def test_prompt_tokens_get_exactly_zero_gradient():
    """The SFT step's gradient is the gradient of the mean NLL of the response tokens alone,
    computed by hand from one full forward pass: prompt positions contribute nothing (and a loss
    that also counted the prompt's tokens has another gradient). Micro-batching does not change it."""
    tok = make_tokenizer()
    demos = [Demo(f"d{i}", [{"role": "user", "content": q}], a)
             for i, (q, a) in enumerate([("spell cat backwards", "tac"), ("2+2", "4"), ("hi there", "hello!")])]
    batch = collate([tokenize_demo(tok, d, tok.eos_token_id) for d in demos], tok.pad_token_id)
    # the action mask is exactly the response tokens and their stop token
    assert batch.action_mask.sum(1).tolist() == [len(_ids(tok, d.response)) + 1 for d in demos]
    cfg = build_config({}, ["sft={lr: 0.1}"])
    lcfg, algo = sft_learner_config(cfg)

    def step_grads(budget: int):
        model = make_model(tok, hidden=32, layers=2)
        grads = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
        for n, p in model.named_parameters():
            p.register_hook(lambda g, n=n: grads[n].add_(g))
        stats = Learner(model, lcfg.model_copy(update={"micro_batch_tokens": budget}), algo).step(
            TrainBatch(rollout=batch, advantages=torch.ones(len(demos))))
        return stats["loss"], grads

    loss, grads = step_grads(4096)

    ref = make_model(tok, hidden=32, layers=2)
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], 1)
    attn = torch.cat([batch.prompt_mask, batch.completion_mask], 1)
    pos = (attn.long().cumsum(1) - 1).clamp(min=0)
    logp = torch.log_softmax(ref(input_ids=ids, attention_mask=attn.long(), position_ids=pos).logits.float(), -1)
    token_lp = logp[:, :-1].gather(2, ids[:, 1:, None]).squeeze(2)  # log p(token t | tokens < t)
    P = batch.prompt_ids.shape[1]
    response = torch.zeros_like(attn)
    response[:, P:] = batch.action_mask
    response = response[:, 1:]
    nll = -(token_lp * response).sum() / response.sum()
    nll.backward(retain_graph=True)
    assert loss == pytest.approx(float(nll.detach()), rel=1e-5)
    ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
    for n, g in grads.items():
        torch.testing.assert_close(g, ref_grads[n], rtol=1e-4, atol=1e-6)
    # counting the prompt's tokens too gives another gradient: the masking is what the test sees
    ref.zero_grad()
    everything = attn[:, 1:] & attn[:, :-1]
    (-(token_lp * everything).sum() / everything.sum()).backward()
    emb = "model.embed_tokens.weight"
    assert not torch.allclose(dict(ref.named_parameters())[emb].grad, grads[emb], rtol=1e-3, atol=1e-5)
    # one demonstration per micro-batch: the same gradient
    _, small = step_grads(1)
    for n, g in grads.items():
        torch.testing.assert_close(small[n], g, rtol=1e-4, atol=1e-6)


def test_batch_positions_cover_every_demo_once_per_epoch():
    seen = [i for s in range(1, 6) for i in batch_positions(10, 4, s, seed=1)]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))
    assert seen[:10] != list(range(10))  # shuffled
    assert batch_positions(10, 4, 3, seed=1) == batch_positions(10, 4, 3, seed=1)


# ----------------------------------------------------------------------------- runs


def _base(root: Path, name: str, *extra: str) -> list[str]:
    return [f"model.path={root / 'model'}", "task.name=count_bits", "task.options={min_n: 1, max_n: 63}",
            "task.eval_size=6", "task.train_size=60", "rollout.max_new_tokens=8",
            f"tracking.output_dir={root / 'runs'}", f"tracking.run_name={name}", "tracking.progress=false",
            "trainer.seed=3", *extra]


SFT = "sft={steps: 4, batch_size: 3, num_examples: 24, lr: 0.01, checkpoint_every: 1}"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    save_tiny_model(root / "model", hidden=32, layers=1)
    return root


def test_sft_resume_equals_an_uninterrupted_run(root, capsys):
    straight = SFTRunner(build_config({}, _base(root, "straight", SFT))).run()
    assert straight.finished and straight.steps_done == 4
    runner = SFTRunner(build_config({}, _base(root, "cut", SFT)))
    runner.stop_after_step = 2
    cut = runner.run()
    assert not cut.finished and RunDir.open(cut.run_dir).status()["state"] == "interrupted"
    assert main(["sft", "--resume", str(cut.run_dir)]) == 0
    a, b = run_metrics(straight.run_dir), run_metrics(cut.run_dir)
    assert sorted(b) == [1, 2, 3, 4]
    for step in a:
        for key in ("loss", "grad_norm", "lr", "response_tokens", "entropy"):
            assert a[step][key] == b[step][key], (step, key)
    wa = load_file(str(straight.run_dir / "final_model" / "model.safetensors"))
    wb = load_file(str(cut.run_dir / "final_model" / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    # the loss fell, held-out evaluations at the start and the end, a summary, a finished status
    assert a[4]["loss"] < a[1]["loss"]
    rd = RunDir.open(cut.run_dir)
    assert [e["step"] for e in rd.read_evals()] == [0, 4] and rd.status()["state"] == "finished"
    assert "Supervised fine-tuning" in (cut.run_dir / "summary.md").read_text()
    # SFT's held-out evaluations carry the same guardrails as RL's (best constant answer, verdict)
    assert all("best_constant" in e["guardrails"] for e in rd.read_evals())
    assert "Guardrails at step 4" in (cut.run_dir / "summary.md").read_text()


def test_lora_sft_saves_a_whole_model_that_rl_and_eval_start_from(root):
    res = SFTRunner(build_config({}, _base(root, "lora", SFT, "model.lora={r: 4, alpha: 8}", "sft.lr=0.05"))).run()
    final = res.run_dir / "final_model"
    assert (final / "config.json").is_file() and not (final / "adapter_config.json").exists()
    weights = load_file(str(final / "model.safetensors"))
    base = load_file(str(root / "model" / "model.safetensors"))
    assert not any("lora" in k for k in weights) and weights.keys() == base.keys()
    assert any(not torch.equal(weights[k], base[k]) for k in base)  # the adapters were merged in
    # its last held-out evaluation is reproduced by the saved model (same greedy answers)
    from reinforge.trainer import Trainer

    rl = Trainer(build_config({}, _base(root, "rl-from-lora-sft", f"model.path={final}", "trainer.steps=1",
                                        "rollout.num_samples=2", "trainer.prompts_per_step=2")))
    rl.run()
    sft_final = RunDir.open(res.run_dir).read_eval_details(4)
    rl_start = RunDir.open(rl.run_dir.path).read_eval_details(0)
    assert [r["completion"] for r in sft_final] == [r["completion"] for r in rl_start]


# ----------------------------------------------------------------------------- SFT stage + RL


STAGE = ["sft={steps: 3, batch_size: 3, num_examples: 24, lr: 0.01, checkpoint_every: 1}",
         "trainer.steps=3", "trainer.checkpoint_every=1", "trainer.eval_every=0", "rollout.num_samples=2",
         "trainer.prompts_per_step=2"]


def test_sft_stage_then_rl_in_one_run_resumes_without_repeating_sft(root):
    from reinforge.trainer import Trainer

    straight = Trainer(build_config({}, _base(root, "stage-straight", *STAGE)))
    straight.run()
    run = straight.run_dir.path
    sft_dir = run / "sft"
    assert RunDir.open(sft_dir).status()["state"] == "finished"
    # RL starts from the SFT weights: its step-0 evaluation is the SFT run's last one
    assert [r["completion"] for r in RunDir.open(run).read_eval_details(0)] == \
        [r["completion"] for r in RunDir.open(sft_dir).read_eval_details(3)]

    # crash inside the SFT stage, then inside RL; each resume continues where it stopped
    t = Trainer(build_config({}, _base(root, "stage-cut", *STAGE)))
    t.sft_stop_after_step = 1
    t.run()
    cut = t.run_dir.path
    assert RunDir.open(cut / "sft").status()["state"] == "interrupted"
    assert not (cut / "metrics.jsonl").exists()  # RL never started
    t = Trainer(build_config(RunDir.open(cut).load_config()), run_dir=RunDir.open(cut), resume=True)
    t.stop_after_step = 1
    t.run()
    assert RunDir.open(cut / "sft").status()["state"] == "finished"
    untouched = {p: p.read_bytes() for p in [cut / "sft" / "metrics.jsonl", cut / "sft" / "status.json",
                                             cut / "sft" / "final_model" / "model.safetensors"]}
    mtime = (cut / "sft" / "final_model").stat().st_mtime_ns
    assert main(["train", "--resume", str(cut)]) == 0
    # the finished stage was not run again: not even its status or final model were rewritten
    assert all(p.read_bytes() == b for p, b in untouched.items())
    assert (cut / "sft" / "final_model").stat().st_mtime_ns == mtime
    for step, m in run_metrics(run).items():
        assert m["loss"] == run_metrics(cut)[step]["loss"]
        assert m["reward_mean"] == run_metrics(cut)[step]["reward_mean"]
    sa, sb = run_metrics(run / "sft"), run_metrics(cut / "sft")
    assert sorted(sb) == [1, 2, 3] and all(sa[s]["loss"] == sb[s]["loss"] for s in sa)
    assert sorted(run_metrics(cut)) == [1, 2, 3]
    summary = (cut / "summary.md").read_text()
    assert "Warm start: an SFT stage ran before RL" in summary and "SFT stage: held-out accuracy" in summary
    assert main(["reproduce", str(cut / "sft")]) == 2  # an SFT run is not replayed as RL
    fa = load_file(str(run / "final_model" / "model.safetensors"))
    fb = load_file(str(cut / "final_model" / "model.safetensors"))
    assert all(torch.equal(fa[k], fb[k]) for k in fa)


# ----------------------------------------------------------------------------- expert iteration


def even_length(completion: str, example) -> float:
    """Accepts completions with an even number of characters: a verifier whose verdict the test
    can recompute."""
    return float(len(completion) % 2 == 0)


def test_select_accepted_keeps_accepted_untruncated_distinct_samples():
    groups = [0, 0, 0, 0, 1, 1, 1]
    toks = [[5, 2], [5, 2], [6, 2], [7, 2], [8, 2], [9], [8, 2]]
    rewards = [1.0, 1.0, 0.0, 1.0, 0.5, 1.0, 0.9]
    cut = [False, False, False, False, False, True, False]
    assert select_accepted(groups, toks, rewards, cut, threshold=1.0) == [0, 3]
    assert select_accepted(groups, toks, rewards, cut, threshold=1.0, dedupe=False) == [0, 1, 3]
    assert select_accepted(groups, toks, rewards, cut, threshold=0.5) == [0, 3, 4]  # row 6 repeats row 4
    assert select_accepted(groups, toks, rewards, cut, threshold=0.5, dedupe=False, max_per_prompt=1) == [0, 6]
    assert select_accepted(groups, toks, [float("nan")] * 7, cut, threshold=0.0) == []


def test_expert_iteration_keeps_only_what_the_verifier_accepts(tmp_path):
    """Round 1 samples from the base model: the test draws the same samples itself (same seed),
    applies the verifier by hand and finds exactly that set, deduplicated, in the round's file."""
    from reinforge.rollout import HFGenerator, SamplingParams
    from reinforge.sft.expert import round_prompts, round_seed
    from reinforge.tasks import build_task, encode_prompt

    tok = make_tokenizer()
    model = make_model(tok, hidden=32, layers=1)
    # Digits also stop a completion, so a random model's samples end before the token budget.
    stops = [tok.eos_token_id] + [tok.convert_tokens_to_ids(c) for c in "0123456789"]
    model.generation_config.eos_token_id = stops
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    args = _base(tmp_path, "ei", "reward.verifiers=[{name: python, options: {function: 'test_sft:even_length'}}]",
                 "reward.answer_format=raw", "rollout.max_new_tokens=12",
                 "sft={source: expert_iteration, steps: 2, batch_size: 4, lr: 0.01, expert_iteration: "
                 "{rounds: 2, prompts_per_round: 6, samples_per_prompt: 4, temperature: 1.5}}")
    cfg = build_config({}, args)
    res = SFTRunner(cfg).run()
    assert res.finished and res.steps_done == 4
    r1 = json.loads((res.run_dir / "expert_iteration" / "round_001.json").read_text())

    task = build_task(cfg.task)
    idx = round_prompts(len(task.train_examples()), 6, cfg.trainer.seed, 1)
    examples = [task.train_examples()[i] for i in idx]
    gen = HFGenerator(_load(tmp_path / "model"), tok)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(round_seed(cfg.trainer.seed, 1))
        rollout = gen.generate([encode_prompt(tok, e) for e in examples],
                               SamplingParams(num_samples=4, temperature=1.5, max_new_tokens=12))
    expected, seen = [], set()
    for i in range(len(rollout)):
        n = int(rollout.completion_mask[i].sum())
        ids = tuple(rollout.completion_ids[i, :n].tolist())
        key = (int(rollout.group_index[i]), ids)
        if not rollout.truncated[i] and even_length(rollout.texts[i], None) == 1.0 and key not in seen:
            seen.add(key)
            expected.append((examples[key[0]].id, list(ids)))
    assert 0 < len(expected) < len(rollout)  # some were accepted, some were not
    assert [(k["id"], k["response_ids"]) for k in r1["kept"]] == expected
    assert all(even_length(k["text"], None) == 1.0 and k["response_ids"][-1] in stops for k in r1["kept"])
    assert r1["samples_kept"] == len(expected) and r1["samples_generated"] == 24
    assert r1["prompts_with_accepted"] == len({e for e, _ in expected})
    # per round: counts in the metrics, a held-out evaluation at its end, a line in the summary
    m = run_metrics(res.run_dir)
    assert m[1]["ei_samples_kept"] == len(expected) and m[3]["round"] == 2.0 and "ei_samples_kept" in m[3]
    assert [e["step"] for e in RunDir.open(res.run_dir).read_evals()] == [0, 2, 4]
    summary = (res.run_dir / "summary.md").read_text()
    assert f"| 1 | {r1['prompts_with_accepted']} / 6 | {len(expected)} / 24 |" in summary


def _load(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).eval()
