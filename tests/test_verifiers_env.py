"""A verifiers (0.4, ``verifiers.v1``) environment trained token-in/token-out: verifiers renders
prompts and calls the loopback endpoint's ``/inference/v1/generate``; the branches it records
become the rows reinforge trains on (reinforge/agents/verifiers_source.py). Skipped without
``verifiers`` (``pip install "reinforge[verifiers]"``)."""

from __future__ import annotations

import asyncio
import json
import os
from types import SimpleNamespace

import pytest
import torch

vf = pytest.importorskip("verifiers.v1")

from reinforge.agents.verifiers_source import (  # noqa: E402
    VerifiersGenerator,
    VerifiersReward,
    VerifiersTask,
    sampled_spans,
)
from reinforge.config import build_config  # noqa: E402
from reinforge.tasks.base import normalize_answer  # noqa: E402
from reinforge.rollout import HFGenerator, SamplingParams  # noqa: E402

from conftest import eos_biased_model as eos_biased, forward_logprobs, make_tokenizer  # noqa: E402
from vf_toy_taskset import WORDS  # noqa: E402

pytestmark = pytest.mark.slow


def _post(url: str, body: dict, headers: dict) -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json",
                                                                               **headers})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def test_verifiers_episodes_become_token_in_token_out_rows():
    tok = make_tokenizer()
    model = eos_biased(tok)
    task = VerifiersTask({"taskset": "vf_toy_taskset"}, eval_size=2, seed=0)
    assert len(task.train_examples()) == len(WORDS) - 2 and len(task.eval_examples()) == 2
    examples = list(task.train_examples())[:2]
    agent = VerifiersGenerator(HFGenerator(model, tok), {"taskset": "vf_toy_taskset"}, max_tokens=12)
    try:
        torch.manual_seed(0)
        batch = agent.generate_examples(examples, SamplingParams(num_samples=3, temperature=1.0, max_new_tokens=12),
                                        record=True)
        generations = list(agent.server.generations)
        assert generations == []  # the generator takes them
        # verifiers was given the run's key (through an *API_KEY* variable, which its subprocess
        # runtime keeps from the programs it starts); each trace was a live episode only while it
        # ran: a request naming one now is refused and recorded nowhere.
        key_var = agent._key_var
        assert os.environ[key_var] == agent.server.api_key and "API_KEY" in key_var
        assert agent.server.gate._live == set()
        status = _post(agent.server.url[: -len("/v1")] + "/inference/v1/generate", {"token_ids": [5, 6]},
                       {"Authorization": f"Bearer {agent.server.api_key}", "X-Session-ID": batch.episodes[0].trace_id})
        assert status == 403 and agent.server.generations == []
    finally:
        agent.close()
    assert key_var not in os.environ
    episodes = batch.episodes
    assert len(episodes) == 6 and batch.group_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert len({e.trace_id for e in episodes}) == 6
    for i, ep in enumerate(episodes):
        example = examples[i // 3]
        # verifiers rendered the prompt with the model's own chat template (a system message kept)
        assert ep.prompt_ids == tok.apply_chat_template(example.messages, add_generation_prompt=True,
                                                        tokenize=True, return_dict=False)
        # one model call; every token after the prompt was sampled, the stop token included
        assert ep.action_mask == [True] * len(ep.token_ids) and len(ep.turns) == 1
        assert ep.token_ids[-1] == tok.eos_token_id or len(ep.token_ids) == 12
    # The rows' tensors are the episodes', and the recorded log-probs are the policy's: one
    # forward pass over prompt + sampled ids gives them back.
    for i, ep in enumerate(episodes):
        k = len(ep.token_ids)
        assert batch.completion_ids[i, :k].tolist() == ep.token_ids
        assert batch.action_mask[i].sum() == k
    ref = forward_logprobs(model, batch)
    assert torch.allclose(batch.sampler_logprobs[batch.action_mask], ref[batch.action_mask], atol=1e-4)
    # The reward is the taskset's @vf.reward on the reply, through the trace.
    reward = VerifiersReward(SimpleNamespace(shaping=None))  # the config's reward: only its shaping is used
    scores = reward.score(batch, [examples[int(g)] for g in batch.group_index])
    expected = [1.0 if any(c in batch.texts[i] for c in "aeiou") else 0.0 for i in range(len(episodes))]
    assert scores.rewards.tolist() == expected
    assert all(o.components == {"vowel": r} for o, r in zip(scores.outcomes, expected))
    rec = episodes[0].to_record()
    assert rec["rewards"] == {"vowel": expected[0]} and rec["trained_mask"] == [1] * len(episodes[0].token_ids)
    json.dumps(rec)


def test_a_multi_turn_verifiers_env_keeps_the_sampled_ids_across_turns():
    """verifiers' user-sim env: a simulated user (the same policy, untrainable) talks with the
    assistant for several turns. verifiers extends the assistant's token ids turn by turn (its
    renderer's bridge), so a row holds several sampled spans with the user's turns between them as
    context; the user's own traces are not trained on. Where the bridge cannot extend the ids (the
    random model samples a special token that the parsed message drops), verifiers re-renders and
    the trace forks: each branch is a row, trained only on what was sampled in its context."""
    tok = make_tokenizer()
    model = eos_biased(tok, bias=2.0)
    opts = {"taskset": "vf_toy_taskset", "env_id": "user-sim",
            "env_options": {"user": {"max_turns": 3}, "persona": "Ask: {scenario} Reply {done} when done."}}
    examples = list(VerifiersTask(opts).train_examples())[:1]
    agent = VerifiersGenerator(HFGenerator(model, tok), opts, max_tokens=10, max_turns=4)
    try:
        torch.manual_seed(0)
        batch = agent.generate_examples(examples, SamplingParams(num_samples=2, temperature=1.0, max_new_tokens=10))
    finally:
        agent.close()
    assert {e.agent for e in batch.episodes} == {"assistant"}
    multi = [e for e in batch.episodes if len(e.turns) >= 2]
    assert multi
    for ep in multi:
        for t in ep.turns:
            assert ep.action_mask[t.start:t.end] == [True] * (t.end - t.start)
            assert not any(ep.action_mask[t.obs_start:t.obs_end])
            if t.obs_end > t.obs_start:  # the user's reply, rendered by the template, as context
                assert "<|im_start|>user" in tok.decode(ep.token_ids[t.obs_start:t.obs_end])
    ref = forward_logprobs(model, batch)
    assert torch.allclose(batch.sampler_logprobs[batch.action_mask], ref[batch.action_mask], atol=1e-4)


def test_branch_check_refuses_tokens_the_server_did_not_sample():
    from reinforge.agents.server import Generation
    from reinforge.agents.verifiers_source import BranchMismatch

    gens = [Generation("a", [1, 2], [5, 6], [-0.5, -0.25], "stop"),
            Generation("b", [1, 2, 5, 6, 9], [7], [-1.0], "stop")]
    ids, mask, lps = [1, 2, 5, 6, 9, 7], [False, False, True, True, False, True], [0, 0, -0.5, -0.25, 0, -1.0]
    assert sampled_spans(ids, mask, lps, gens) == [(2, 4), (5, 6)]
    with pytest.raises(BranchMismatch, match="re-rendered"):  # a re-tokenized history
        sampled_spans([1, 2, 5, 6, 8, 7], mask, lps, gens)
    with pytest.raises(BranchMismatch, match="log-probs"):
        sampled_spans(ids, mask, [0, 0, -0.5, -0.3, 0, -1.0], gens)


def test_reinforge_train_runs_a_verifiers_environment(tmp_path, tiny_model_dir, monkeypatch):
    """``env.name: verifiers`` with ``task.source: env``: two seeded GRPO steps through the
    trainer, the rewards from the taskset, every trajectory written."""
    import reinforge.learner.build as build_mod  # where the trainer loads its policy
    from reinforge.tracking import RunDir
    from reinforge.trainer import Trainer

    real = build_mod.load_model

    def load(*a, **k):  # the stop token likelier (as eos_biased), so replies end on their own
        model = real(*a, **k)
        eos = model.generation_config.eos_token_id
        model.lm_head.register_forward_hook(lambda _m, _i, out: out + torch.nn.functional.one_hot(
            torch.tensor(eos), out.shape[-1]).to(out.dtype) * 2.5)
        return model

    monkeypatch.setattr(build_mod, "load_model", load)
    def config(name):
        return build_config({}, [
            f"model.path={tiny_model_dir}", "task.source=env", "task.eval_size=2", "task.seed=0",
            "env.name=verifiers", "env.options={taskset: vf_toy_taskset}", "env.max_tokens_per_turn=12",
            "env.max_tokens=64", "rollout.num_samples=4", "rollout.max_new_tokens=12", "trainer.prompts_per_step=2",
            "trainer.steps=2", "trainer.eval_every=0", "trainer.eval_at_start=false", "trainer.checkpoint_every=0",
            "trainer.seed=3", "trainer.num_threads=1", "learner.lr=3e-3",
            f"tracking.output_dir={tmp_path / 'runs'}", "tracking.progress=false", f"tracking.run_name={name}",
        ])

    rd = RunDir.open(Trainer(config("a")).run().run_dir)
    metrics = rd.read_metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    # Seeded: episodes run one at a time, so the server sees the same requests in the same order.
    again = RunDir.open(Trainer(config("b")).run().run_dir).read_metrics()
    for x, y in zip(metrics, again):
        for key in ("reward_mean", "loss", "grad_norm", "completion_length"):
            assert x[key] == y[key], (key, x["step"])
    for m in metrics:
        assert all(torch.isfinite(torch.tensor(float(m[k]))) for k in ("loss", "grad_norm", "reward_mean"))
    traj = [json.loads(line) for line in (rd.path / "trajectories" / "step_000002.jsonl").read_text().splitlines()]
    assert len(traj) == 8
    tok = make_tokenizer()
    for t in traj:
        text = tok.decode(t["token_ids"], skip_special_tokens=True)
        assert t["reward"] == (1.0 if any(c in text for c in "aeiou") else 0.0)
        assert t["rewards"] == {"vowel": t["reward"]}
        assert len(t["trained_mask"]) == len(t["token_ids"]) and all(t["trained_mask"])
        assert t["truncated"] == (t["truncation"] == "max_tokens_per_turn")  # a reply cut at 12 tokens
    rewards = [t["reward"] for t in traj]
    assert abs(metrics[-1]["reward_mean"] - sum(rewards) / len(rewards)) < 1e-6
    assert 0.0 < sum(rewards) < len(rewards)  # rewards vary within the step: GRPO has a signal
    assert metrics[-1]["grad_norm"] > 0


def test_a_reinforge_task_runs_as_a_verifiers_taskset(tmp_path):
    """The bundled ``reinforge_task`` taskset: a reinforge task's examples (here a JSONL file) as
    verifiers tasks, the reply's answer scored by the task's own scorer."""
    rows = [{"prompt": f"say {w}", "answer": w} for w in ("a", "e", "o", "t", "n", "s")]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    opts = {"taskset": "reinforge_task",
            "taskset_options": {"reinforge_task": {"source": "file", "path": str(tmp_path / "t.jsonl"), "eval_size": 1},
                                "answer_format": "raw"}}
    task = VerifiersTask(opts, eval_size=1, seed=0)
    examples = list(task.train_examples())
    assert len(examples) == 5 and len(task.eval_examples()) == 1
    by_prompt = {r["prompt"]: r["answer"] for r in rows}
    for e in examples:  # the reinforge example's messages, its answer kept on the task
        vt = e.metadata["verifiers_task"]
        assert vt.data.answer == e.answer == by_prompt[e.messages[-1]["content"]]  # for the guardrails

    def trace(reply):  # the reward reads the last assistant message of the trace
        msg = SimpleNamespace(role="assistant", content=reply)
        return SimpleNamespace(branches=[SimpleNamespace(messages=[msg])])

    vt = examples[0].metadata["verifiers_task"]
    right, wrong = vt.data.answer, "x" if vt.data.answer != "x" else "y"
    assert asyncio.run(vt.correct(trace(f"  {right.upper()} "))) == 1.0  # the file task's normalized match
    assert asyncio.run(vt.correct(trace(wrong))) == 0.0
    tok = make_tokenizer()
    model = eos_biased(tok, bias=3.0)
    agent = VerifiersGenerator(HFGenerator(model, tok), opts, max_tokens=4)
    try:
        torch.manual_seed(1)
        batch = agent.generate_examples(examples, SamplingParams(num_samples=4, temperature=1.0, max_new_tokens=4))
    finally:
        agent.close()
    scores = VerifiersReward(SimpleNamespace(shaping=None)).score(batch, examples)
    for i, ep in enumerate(batch.episodes):
        answer = examples[int(batch.group_index[i])].metadata["verifiers_task"].data.answer
        reply = tok.decode(ep.token_ids, skip_special_tokens=True)
        expected = float(normalize_answer(reply) == normalize_answer(answer))
        assert scores.rewards[i].item() == expected, (reply, answer)
        assert scores.outcomes[i].components == {"correct": scores.rewards[i].item()}
