"""Multi-turn agents: tools and their failures, environments, token-in/token-out trajectories with
the KV cache extended per turn, turn rewards, and training and resuming an agent run."""

from __future__ import annotations

import json
import time

import pytest
import torch

from reinforge.agents import (
    AgentBudgets, AgentGenerator, AgentReward, ChatRenderer, StepResult, Tool, ToolEnv, ToolExecutor, agent_metrics,
    parse_tool_calls, register_env, turn_returns,
)
from reinforge.agents.envs import GuessNumberEnv, calculator
from reinforge.agents.tools import TRUNCATION_MARKER, ToolCall
from reinforge.batch import TrainBatch
from reinforge.config import AlgorithmConfig, ConfigError, LearnerConfig, build_config
from reinforge.learner import Learner
from reinforge.rewards import RewardFunction
from reinforge.rewards.verifiers import ExactMatchVerifier
from reinforge.rollout import HFGenerator, SamplingParams
from reinforge.tasks.base import Example

from conftest import CHAT_TEMPLATE, eos_biased_model, forward_logprobs, make_tokenizer
from tiny_run import sevens as sevens_reward  # configs name it 'test_agents:sevens_reward'
from tiny_run import bias_stop_token, tiny_run_overrides, write_task


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one torch thread (a second only adds synchronisation, which on a loaded 2-core
    machine made each small matmul 100x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- tools -------------------------------------------------------------------------------------
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b


def explode(x: str) -> str:
    """Always fails.

    Args:
        x: anything
    """
    raise ZeroDivisionError("no")


def hang(x: str) -> str:
    """Never returns in time.

    Args:
        x: anything
    """
    time.sleep(5)
    return "late"


def chatty(n: int) -> str:
    """Returns a long text.

    Args:
        n: how many characters
    """
    return "x" * n


def test_tool_schema_is_transformers_json_schema():
    from transformers.utils import get_json_schema

    tool = Tool.from_function(add)
    assert tool.name == "add"
    assert tool.schema["function"]["parameters"] == get_json_schema(add)["function"]["parameters"]
    assert tool.schema["function"]["parameters"]["required"] == ["a", "b"]

    def undocumented(a: int) -> int:
        return a

    with pytest.raises(ValueError, match="docstring"):
        Tool.from_function(undocumented)


def test_parse_tool_calls_reports_what_is_wrong():
    calls = parse_tool_calls('ok <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call> then '
                             '<tool_call>{"name": add}</tool_call><tool_call>[1]</tool_call>'
                             '<tool_call>{"name": "add", "arguments": 3}</tool_call><tool_call>{"name": "a')
    assert [c.name for c in calls] == ["add", None, None, "add", None]
    assert calls[0].arguments == {"a": 1, "b": 2} and calls[0].error is None
    assert "not valid JSON" in calls[1].error
    assert "JSON object" in calls[2].error
    assert "'arguments' must be a JSON object" in calls[3].error
    assert "not closed" in calls[4].error
    assert parse_tool_calls("no calls here") == []


def test_every_failing_call_becomes_an_error_observation_and_is_counted():
    ex = ToolExecutor([add, explode, hang, chatty], timeout_s=0.3, max_output_chars=80)
    ok = ex.run(ToolCall("add", {"a": 2, "b": 3}, ""))
    assert (ok.content, ok.error) == ("5", None)
    cases = {
        "malformed": ToolCall(None, None, "{", "the tool call is not valid JSON (x)"),
        "unknown_tool": ToolCall("mul", {"a": 1}, ""),
        "bad_arguments": ToolCall("add", {"a": 1}, ""),  # missing b
    }
    for kind, call in cases.items():
        r = ex.run(call)
        assert r.error == kind and r.content.startswith("Error:"), (kind, r)
    assert "available tools: add, chatty, explode, hang" in ex.run(cases["unknown_tool"]).content
    extra = ex.run(ToolCall("add", {"a": 1, "b": 2, "c": 3}, ""))
    assert extra.error == "bad_arguments" and "c" in extra.content
    raised = ex.run(ToolCall("explode", {"x": "1"}, ""))
    assert raised.error == "raised" and "ZeroDivisionError: no" in raised.content
    t0 = time.perf_counter()
    late = ex.run(ToolCall("hang", {"x": "1"}, ""))
    assert late.error == "timeout" and "0.3 s" in late.content
    assert time.perf_counter() - t0 < 3  # the caller is free at the deadline, not when the tool returns
    long = ex.run(ToolCall("chatty", {"n": 100}, ""))
    assert long.truncated and long.content.startswith("x" * 80)
    assert long.content[80:] == TRUNCATION_MARKER.format(dropped=20, total=100)
    assert not ex.run(ToolCall("chatty", {"n": 80}, "")).truncated
    # Errors are observations too: cut the same way, whatever the model or the tool put in them.
    for call in (ToolCall("m" * 10_000, {}, ""), ToolCall("explode", {"x": "1", "y" * 10_000: 1}, ""),
                 ToolCall(None, None, "{", "the tool call is not valid JSON (" + "z" * 10_000 + ")")):
        r = ex.run(call)
        assert r.error is not None and r.truncated and r.content.startswith("Error:")
        assert r.content[80:].startswith("\n...[output truncated:") and len(r.content) < 160


def test_tool_env_counts_invalid_calls_and_tool_errors():
    env = ToolEnv([add, explode], max_turns=3, timeout_s=1.0)
    env.reset(Example("e", [{"role": "user", "content": "2+3?"}], "5"))
    obs, reward, done, info = env.step({"role": "assistant", "content":
                                        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
                                        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
                                        '<tool_call>{"name": "explode", "arguments": {"x": "y"}}</tool_call>'})
    assert not done and [o["role"] for o in obs] == ["tool"] * 3
    assert obs[0]["content"] == "5"
    assert (info["tool_calls"], info["invalid_calls"], info["tool_errors"]) == (3, 1, 1)
    _, _, done, info = env.step({"role": "assistant", "content": "<answer>5</answer>"})
    assert done and info == {"final": True}


def test_calculator_is_exact_and_refuses_anything_but_arithmetic():
    assert calculator("123456789 * 987654321") == str(123456789 * 987654321)
    assert calculator("(2 + 3) * 4 - 6 / 3") == "18"
    for bad in ("__import__('os')", "2 ** 99999", "a + 1"):
        with pytest.raises(ValueError):
            calculator(bad)


# -- rendering ---------------------------------------------------------------------------------
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}<|im_end|>\n"
    "{% endif %}" + CHAT_TEMPLATE
)
# A template that rewrites history, as reasoning models' templates drop earlier <think> blocks:
# every assistant turn but the last keeps only its last two characters.
STRIPPING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' and not loop.last %}{{ m['content'][-2:] }}{% else %}{{ m['content'] }}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_tools_go_through_the_template_when_it_renders_them_else_the_fallback():
    tok = make_tokenizer()
    schemas = [Tool.from_function(add).schema]
    msgs = [{"role": "user", "content": "hi"}]
    plain = ChatRenderer(tok)
    shown, tools = plain.prompt_messages(msgs, schemas)
    assert tools is None and shown[0]["role"] == "system" and '"name": "add"' in shown[0]["content"]
    assert "<tool_call>" in shown[0]["content"]
    tok.chat_template = TOOLS_TEMPLATE
    aware = ChatRenderer(tok)
    shown, tools = aware.prompt_messages(msgs, schemas)
    assert tools == schemas and shown == msgs
    assert tok.decode(aware.prompt_ids(msgs, schemas)).startswith("<|im_start|>system\nTOOLS: add")


def test_observation_tokens_are_what_the_template_appends():
    tok = make_tokenizer()
    r = ChatRenderer(tok)
    obs = [{"role": "tool", "content": "5"}]
    assert r.observation_text(obs, "<|im_end|>") == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    # A turn that stopped on another token: the template's own end-of-turn is observation.
    assert r.observation_text(obs, "!").startswith("<|im_end|>\n<|im_start|>tool")


# -- the agent loop on a tiny model ------------------------------------------------------------


class EchoEnv:
    """Replies to every turn with a numbered observation (a random delay, so replies arrive out of
    order); done after ``turns`` turns; per-turn reward 0.25."""

    tools: list = []

    def __init__(self, turns: int = 3, role: str = "tool", delay: float = 0.0):
        self.turns, self.role, self.delay, self.max_turns = turns, role, delay, None

    def reset(self, example):
        self.n = 0
        return [dict(m) for m in example.messages]

    def step(self, message):
        self.n += 1
        if self.delay:
            time.sleep(self.delay * ((self.n * 7 + len(message["content"])) % 4))
        if self.n >= self.turns:
            return StepResult([], 0.25, True, {})
        return StepResult([{"role": self.role, "content": f"obs {self.n}"}], 0.25, False, {})


def _examples(n=3):
    return [Example(f"e{i}", [{"role": "user", "content": f"question {i}"}], "1") for i in range(n)]


def _agent(model, tok, make_env, **kw):
    budgets = kw.pop("budgets", AgentBudgets(max_turns=4, max_tokens_per_turn=12, max_tokens=96))
    return AgentGenerator(HFGenerator(model, tok, batch_size=kw.pop("batch_size", 16)), make_env, budgets, **kw)


@pytest.mark.parametrize("template", ["chatml", "stripping"])
def test_trajectory_ids_are_the_sampled_tokens_then_the_observation_tokens(template):
    tok = make_tokenizer()
    if template == "stripping":
        tok.chat_template = STRIPPING_TEMPLATE
    model = eos_biased_model(tok)
    agent = _agent(model, tok, lambda: EchoEnv(turns=3, delay=0.005))
    torch.manual_seed(0)
    batch = agent.generate_examples(_examples(), SamplingParams(num_samples=2, temperature=1.0))
    renderer = ChatRenderer(tok)
    multi = 0
    for i, ep in enumerate(batch.episodes):
        expect, mask = [], []
        for t in ep.turns:
            sampled = ep.token_ids[t.start:t.end]
            assert tok.decode(sampled, skip_special_tokens=True) == t.text
            expect += sampled
            mask += [True] * len(sampled)
            if t.obs_end > t.obs_start:
                obs = renderer.observation_ids(t.observations, tok.decode(sampled[-1:]))
                expect += obs
                mask += [False] * len(obs)
        assert ep.token_ids == expect and ep.action_mask == mask
        n = len(ep.token_ids)
        assert batch.completion_ids[i, :n].tolist() == expect
        assert batch.action_mask[i, :n].tolist() == mask and not batch.completion_mask[i, n:].any()
        multi += len(ep.turns) > 1
    assert multi >= 3  # the check covered several multi-turn trajectories
    # The recorded log-probs are the model's on the whole trajectory: the KV cache extended with
    # holes and observations gives what one forward over the appended ids gives.
    ref = forward_logprobs(model, batch)
    assert torch.allclose(batch.sampler_logprobs[batch.action_mask], ref[batch.action_mask], atol=1e-4)
    assert (batch.sampler_logprobs[~batch.action_mask] == 0).all()
    if template == "stripping":
        # Re-rendering the conversation would not give the sampled ids (history was rewritten):
        # appending is what keeps training on what was sampled.
        ep = next(e for e in batch.episodes if len(e.turns) > 1 and e.turns[0].end - e.turns[0].start > 3)
        rerendered = tok.apply_chat_template(ep.messages, tokenize=True, return_dict=False)
        assert rerendered[len(ep.prompt_ids):] != ep.token_ids[: len(rerendered) - len(ep.prompt_ids)]
    else:
        # With a template that does not rewrite history, appending gives the template's text.
        ep = next(e for e in batch.episodes if e.done)
        whole = tok.decode(ep.prompt_ids + ep.token_ids)
        assert whole + "\n" == tok.apply_chat_template(ep.messages, tokenize=False)


def test_kv_extension_decodes_the_same_tokens_as_reprefilling_every_turn():
    tok = make_tokenizer()
    model = eos_biased_model(tok, seed=1)
    out = {}
    for kv in (True, False):
        agent = _agent(model, tok, lambda: EchoEnv(turns=4, delay=0.003), kv_reuse=kv)
        torch.manual_seed(0)
        out[kv] = agent.generate_examples(_examples(4), SamplingParams(num_samples=2, greedy=True))
    a, b = out[True], out[False]
    assert [e.token_ids for e in a.episodes] == [e.token_ids for e in b.episodes]
    assert max(len(e.turns) for e in a.episodes) >= 3
    assert torch.allclose(a.sampler_logprobs, b.sampler_logprobs, atol=1e-4)


def test_sampling_does_not_depend_on_when_tools_return():
    tok = make_tokenizer()
    model = eos_biased_model(tok, seed=2)
    runs = []
    for delay, overlap in ((0.0, False), (0.01, True)):
        agent = _agent(model, tok, lambda d=delay: EchoEnv(turns=3, delay=d), overlap_tools=overlap)
        torch.manual_seed(5)
        runs.append(agent.generate_examples(_examples(3), SamplingParams(num_samples=3)))
    assert [e.token_ids for e in runs[0].episodes] == [e.token_ids for e in runs[1].episodes]


def test_budgets_truncate_and_say_which():
    tok = make_tokenizer()
    model = eos_biased_model(tok, bias=2.5)
    params = SamplingParams(num_samples=4)
    torch.manual_seed(0)
    turns = _agent(model, tok, lambda: EchoEnv(turns=10),
                   budgets=AgentBudgets(max_turns=2, max_tokens_per_turn=40, max_tokens=400))
    eps = turns.generate_examples(_examples(2), params).episodes
    assert all(len(e.turns) <= 2 for e in eps)
    assert {e.truncation for e in eps} <= {"max_turns", "max_tokens_per_turn"} and any(e.truncation == "max_turns" for e in eps)
    per_turn = _agent(eos_biased_model(tok, bias=-5.0), tok, lambda: EchoEnv(),
                      budgets=AgentBudgets(max_turns=3, max_tokens_per_turn=5, max_tokens=400))
    batch = per_turn.generate_examples(_examples(1), params)
    assert all(e.truncation == "max_tokens_per_turn" and len(e.token_ids) == 5 for e in batch.episodes)
    assert batch.truncated.all()
    total = _agent(model, tok, lambda: EchoEnv(turns=50),
                   budgets=AgentBudgets(max_turns=50, max_tokens_per_turn=40, max_tokens=30))
    eps = total.generate_examples(_examples(2), params).episodes
    assert all(len(e.token_ids) <= 30 and e.truncated for e in eps)
    assert any(e.truncation == "max_tokens" for e in eps)


class RaisingEnv(EchoEnv):
    def step(self, message):
        raise RuntimeError("env bug")


class BadRewardEnv(EchoEnv):
    def __init__(self, reward):
        super().__init__(turns=2)
        self.bad = reward

    def step(self, message):
        observations, _, done, info = super().step(message)
        return observations, self.bad, done, info


@pytest.mark.parametrize("bad_env, says", [
    (RaisingEnv, "env bug"),
    (lambda: BadRewardEnv(float("nan")), "reward nan; it must be a finite number"),
    (lambda: BadRewardEnv(float("-inf")), "reward -inf; it must be a finite number"),
    (lambda: BadRewardEnv(None), "reward None (NoneType); it must be a number"),
])
def test_a_raising_environment_ends_its_trajectory_not_the_batch(bad_env, says):
    tok = make_tokenizer()
    model = eos_biased_model(tok, bias=4.0)
    envs = iter([bad_env(), EchoEnv(turns=2)] * 4)
    agent = _agent(model, tok, lambda: next(envs))
    torch.manual_seed(0)
    eps = agent.generate_examples(_examples(2), SamplingParams(num_samples=2)).episodes
    bad, good = eps[0::2], eps[1::2]
    assert all(e.truncation == "env_error" and says in e.env_error for e in bad), [e.env_error for e in bad]
    assert all(e.env_error is None for e in good)
    assert agent_metrics(eps)["agent/env_errors"] == 2


class ScriptedToolEnv(ToolEnv):
    """A ToolEnv fed scripted assistant texts instead of the tiny model's (random characters never
    form a tool call): every malformed and failing call goes through the real loop."""

    SCRIPT = [
        '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>',
        '<tool_call>{"name": add}</tool_call><tool_call>{"name": "mul", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'
        '<tool_call>{"name": "explode", "arguments": {"x": "1"}}</tool_call>'
        '<tool_call>{"name": "hang", "arguments": {"x": "1"}}</tool_call>',
        "<answer>5</answer>",
    ]

    def __init__(self):
        super().__init__([add, explode, hang], max_turns=None, timeout_s=0.2, max_calls_per_turn=4)
        self.n = 0

    def step(self, message):
        self.n += 1
        return super().step({"role": "assistant", "content": self.SCRIPT[self.n - 1]})


def test_malformed_and_failing_calls_are_observed_counted_and_the_run_goes_on():
    tok = make_tokenizer()
    model = eos_biased_model(tok, bias=5.0)
    agent = _agent(model, tok, ScriptedToolEnv,
                   budgets=AgentBudgets(max_turns=6, max_tokens_per_turn=20, max_tokens=2000))
    torch.manual_seed(0)
    batch = agent.generate_examples(_examples(1), SamplingParams(num_samples=2))
    for ep in batch.episodes:
        assert ep.done and len(ep.turns) == 4, (ep.truncation, len(ep.turns))
        shown = [m["content"] for m in ep.messages if m["role"] == "tool"]
        assert shown[0] == "5"
        assert "not valid JSON" in shown[1] and "unknown tool 'mul'" in shown[2]
        assert "wrong arguments for add" in shown[3] and "ZeroDivisionError" in shown[4]
        assert "did not return within 0.2 s" in shown[5]
        # The model saw these error observations: they are in its context tokens.
        assert "unknown tool 'mul'" in tok.decode(ep.token_ids)
    m = agent_metrics(batch.episodes)
    assert m["agent/tool_calls_total"] == 12 and m["agent/invalid_calls"] == 6 and m["agent/tool_errors"] == 4
    assert m["agent/valid_call_rate"] == pytest.approx(0.5)
    record = json.loads(json.dumps(batch.episodes[0].to_record()))
    assert [t["info"]["tool_calls"] for t in record["turns"][:3]] == [1, 2, 3]
    assert record["turns"][2]["info"]["tool_results"][2]["error"] == "timeout"


def test_guess_number_env_gives_hints_and_ends_on_the_right_guess():
    env = GuessNumberEnv()
    env.reset(Example("g", [{"role": "user", "content": "guess"}], "42", {"target": 42}))
    assert env.step({"content": "<answer>50</answer>"}).observations[0]["content"] == "My number is lower than 50."
    assert env.step({"content": "<answer>7</answer>"}).observations[0]["content"] == "My number is higher than 7."
    r = env.step({"content": "I don't know"})
    assert not r.done and r.info == {"invalid_guess": 1}
    assert env.step({"content": "<answer>42</answer>"}).done


# -- rewards over turns ------------------------------------------------------------------------
def test_turn_returns_discount_per_turn():
    assert turn_returns([1.0, 0.0, 2.0], outcome=4.0, gamma=0.5) == pytest.approx([1 + 0.5 * (0.5 * 6), 0.5 * 6, 6.0])
    assert turn_returns([], 1.0, 0.9) == []


def test_turn_rewards_as_tokens_make_returns_to_go_the_discounted_turn_returns():
    from reinforge.algorithms.advantages import _returns_to_go, token_level_rewards

    tok = make_tokenizer()
    model = eos_biased_model(tok, bias=3.0)
    agent = _agent(model, tok, lambda: EchoEnv(turns=3), budgets=AgentBudgets(max_turns=3, max_tokens_per_turn=30,
                                                                                 max_tokens=400))
    torch.manual_seed(0)
    ex = _examples(2)
    batch = agent.generate_examples(ex, SamplingParams(num_samples=2))
    reward_fn = RewardFunction([(ExactMatchVerifier(answer_format="raw"), 1.0)])
    gamma = 0.5
    scores = AgentReward(reward_fn, turn_rewards="tokens", turn_discount=gamma).score(
        batch, [ex[int(g)] for g in batch.group_index])
    per_token = token_level_rewards(scores.shaped, batch.action_mask, token_rewards=scores.token_rewards)
    rtg = _returns_to_go(per_token, batch.action_mask, 1.0)
    checked = 0
    for i, ep in enumerate(batch.episodes):
        if ep.truncated:
            continue
        g = turn_returns([t.reward for t in ep.turns], float(scores.rewards[i]), gamma)
        for t, turn in enumerate(ep.turns):
            assert float(rtg[i, turn.start]) == pytest.approx(g[t], abs=1e-6)
            checked += 1
    assert checked >= 4
    summed = AgentReward(reward_fn, turn_rewards="sum", turn_discount=gamma).score(
        batch, [ex[int(g)] for g in batch.group_index])
    assert summed.token_rewards is None
    for i, ep in enumerate(batch.episodes):
        assert float(summed.rewards[i]) == pytest.approx(turn_returns([t.reward for t in ep.turns], 0.0, gamma)[0])
    rows = [ex[int(g)] for g in batch.group_index]
    batch.episodes[0].truncated = True  # as if a budget had ended it
    plain = AgentReward(reward_fn).score(batch, rows)
    fixed = AgentReward(reward_fn, truncated_reward=-1.0).score(batch, rows)
    assert float(fixed.rewards[0]) == -1.0 and not fixed.outcomes[0].correct and not plain.outcomes[0].correct
    assert torch.equal(fixed.rewards[1:], plain.rewards[1:])


def test_observation_tokens_get_exactly_zero_gradient():
    tok = make_tokenizer()
    model = eos_biased_model(tok, bias=3.0)
    agent = _agent(model, tok, lambda: EchoEnv(turns=3))
    torch.manual_seed(0)
    batch = agent.generate_examples(_examples(2), SamplingParams(num_samples=2))
    assert (~batch.action_mask & batch.completion_mask).any()
    learner = Learner(model, LearnerConfig(lr=1e-3, logits_chunk_tokens=0, share_prompt_prefix=False),
                      AlgorithmConfig(), temperature=1.0, max_new_tokens=96)
    captured = {}

    def keep(_m, _i, output):
        output.retain_grad()
        captured["logits"] = output

    handle = model.lm_head.register_forward_hook(keep)
    try:
        learner.step(TrainBatch(rollout=batch, advantages=torch.tensor([1.0, -1.0, 0.5, -0.5])))
    finally:
        handle.remove()
    per_token = captured["logits"].grad[:, :-1].abs().sum(-1)
    assert (per_token[~batch.action_mask] == 0).all()
    assert (per_token[batch.action_mask] > 0).all()


# -- config and the trainer --------------------------------------------------------------------
def test_env_config_is_validated_before_anything_loads():
    with pytest.raises(ConfigError, match="task.source=env"):
        build_config({"task": {"source": "env"}})
    with pytest.raises(ConfigError, match="rollout.backend=hf"):
        build_config({"env": {"name": "calculator"}, "rollout": {"backend": "vllm"}})
    with pytest.raises(ConfigError, match="turn_rewards=tokens"):
        build_config({"env": {"name": "calculator", "turn_rewards": "tokens"}})
    build_config({"env": {"name": "calculator", "turn_rewards": "tokens"}, "algorithm": {"advantage": "reinforce_pp"}})
    from reinforge.agents import env_factory

    with pytest.raises(ValueError, match="not a registered environment; registered: .*calculator"):
        env_factory("nope", {}, None)
    with pytest.raises(ValueError, match="env.options for environment 'calculator'"):
        env_factory("calculator", {"colour": "red"}, None)


@register_env("test_sevens")
def sevens_env(task, *, turns: int = 3):
    """Toy multi-turn environment for tests: three turns, each rewarded for its share of '7'."""
    return SevensEnv(turns)


class SevensEnv(EchoEnv):
    def step(self, message):
        r = super().step(message)
        text = message["content"]
        r.reward = text.count("7") / max(len(text), 1)
        return r


def _agent_config(tmp_path, model_dir, *extra):
    data = write_task(tmp_path / "task.jsonl", n=24)
    return build_config({}, tiny_run_overrides(
        tmp_path, None, *extra, reward="test_agents:sevens_reward", model=model_dir, task=data, schedule=(
            "env.name=test_sevens", "env.max_turns=3", "env.max_tokens_per_turn=8", "env.max_tokens=64",
            "env.overlap_tools=false",
            "rollout.num_samples=4", "rollout.max_new_tokens=8", "trainer.prompts_per_step=4", "trainer.steps=4",
            "trainer.eval_every=2", "trainer.checkpoint_every=2", "trainer.seed=3", "learner.lr=3e-3",
            "trainer.num_threads=1")))


@pytest.fixture
def eos_biased_loader(monkeypatch):
    """The tiny model with its stop token made likelier, so that its turns end."""
    bias_stop_token(monkeypatch, 2.5)


def test_agent_run_writes_trajectories_and_resumes_exactly(tmp_path, tiny_model_dir, eos_biased_loader):
    from reinforge.tracking import RunDir
    from reinforge.trainer import Trainer

    straight = Trainer(_agent_config(tmp_path, tiny_model_dir, "tracking.run_name=straight")).run()
    half = Trainer(_agent_config(tmp_path, tiny_model_dir, "tracking.run_name=resumed", "trainer.steps=2")).run()
    rd = RunDir.open(half.run_dir)
    Trainer(build_config(rd.load_config(), ["trainer.steps=4"]), run_dir=rd, resume=True).run()
    a, b = RunDir.open(straight.run_dir).read_metrics(), rd.read_metrics()
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        for key in ("reward_mean", "loss", "grad_norm", "completion_length", "agent/turns", "agent/trajectory_tokens"):
            assert x[key] == y[key], (key, x["step"], x[key], y[key])
    assert max(m["agent/turns"] for m in a) > 1.5
    traj = [json.loads(line) for line in (rd.path / "trajectories" / "step_000004.jsonl").read_text().splitlines()]
    assert len(traj) == 16
    t = traj[0]
    assert len(t["trained_mask"]) == len(t["token_ids"]) and {"messages", "turns", "truncation"} <= set(t)
    assert all(turn["reward"] >= 0 for turn in t["turns"])
    assert (RunDir.open(straight.run_dir).path / "trajectories" / "step_000004.jsonl").read_text() == \
        (rd.path / "trajectories" / "step_000004.jsonl").read_text()
    evals = rd.read_evals()
    assert "agent/turns" in evals[-1]


@pytest.mark.slow
def test_reward_rises_on_a_toy_multi_turn_env(tmp_path, tiny_model_dir, eos_biased_loader):
    from reinforge.tracking import RunDir
    from reinforge.trainer import Trainer

    cfg = _agent_config(tmp_path, tiny_model_dir, "trainer.steps=12", "trainer.eval_every=0",
                        "trainer.checkpoint_every=0", "learner.lr=1e-2", "env.overlap_tools=true")
    result = Trainer(cfg).run()
    rewards = [m["reward_mean"] for m in RunDir.open(result.run_dir).read_metrics()]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert last > first + 0.2, rewards


def test_sampled_eval_over_trajectories(tmp_path, tiny_model_dir):
    """`reinforge eval`'s sampled evaluation with an env: pass@k over whole trajectories, the
    answer read from the final turn, turns used and every trajectory in the rows."""
    from reinforge.evaluation.runner import build_eval_setup, sampled_eval

    cfg = _agent_config(tmp_path, tiny_model_dir)
    setup = build_eval_setup(cfg)
    tok = make_tokenizer()
    model = eos_biased_model(tok)
    summary, rows = sampled_eval(setup, model, tok, samples=4, temperature=1.0, top_p=1.0, max_new_tokens=8,
                                 seed=0, n_resamples=200)
    assert len(rows) == 4 and all(len(r["trajectories"]) == 4 for r in rows)
    assert [p["k"] for p in summary["pass_at_k"]] == [1, 2, 3, 4] and summary["agent/turns"] >= 1
    for r in rows:
        assert r["completions"] == [t["turns"][-1]["text"] for t in r["trajectories"]]
        # The outcome on the final turn plus the turn rewards (turn_rewards: sum, no discount).
        assert r["rewards"] == pytest.approx([sevens_reward(c, None) + sum(tt["reward"] for tt in t["turns"])
                                              for c, t in zip(r["completions"], r["trajectories"])])


def _post(url: str, body: dict, key: str) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_openai_endpoint_records_token_in_token_out_conversations():
    from reinforge.agents.server import CompletionServer

    tok = make_tokenizer()
    model = eos_biased_model(tok, bias=3.0)
    # The fallback tool prompt in characters is longer than the tiny model's 512 positions.
    with CompletionServer(HFGenerator(model, tok), max_tokens=12, max_model_len=4096) as server, server.episode() as ep:
        assert server.url.startswith("http://127.0.0.1:")
        torch.manual_seed(0)
        first = [{"role": "user", "content": "What is 2+3?"}]
        status, r1 = _post(server.url, {"model": "x", "messages": first, "temperature": 1.0, "logprobs": True,
                                        "tools": [Tool.from_function(add).schema]}, ep.api_key)
        assert status == 200 and r1["object"] == "chat.completion"
        reply = r1["choices"][0]["message"]
        assert len(r1["choices"][0]["logprobs"]["content"]) == r1["usage"]["completion_tokens"]
        # The agent answers with a tool result; the client echoes the assistant message back (with
        # an extra field, as OpenAI clients do).
        second = first + [{**reply, "refusal": None}, {"role": "tool", "tool_call_id": "c1", "content": "5"}]
        status, r2 = _post(server.url, {"model": "x", "messages": second}, ep.api_key)
        assert status == 200
        status, _ = _post(server.url, {"model": "x", "messages": [{"role": "user", "content": "Other."}]}, ep.api_key)
        assert _post(server.url, {"model": "x", "messages": []}, ep.api_key)[0] == 400
        assert _post(server.url, {"model": "x", "messages": first, "stream": True}, ep.api_key)[0] == 400
    convs = server.finished()
    assert len(server.conversations) == 3 and len(convs) == 2
    conv = convs[0]
    s1, s2 = r1["completion_token_ids"], r2["completion_token_ids"]
    renderer = ChatRenderer(tok)
    obs = renderer.observation_ids([{"role": "tool", "content": "5"}], tok.decode(s1[-1:]))
    assert conv.token_ids == s1 + obs + s2  # the sampled ids, never re-tokenized, then the new turn
    assert conv.action_mask == [True] * len(s1) + [False] * len(obs) + [True] * len(s2)
    assert r2["prompt_token_ids"] == conv.prompt_ids + s1 + obs
    assert '"name": "add"' in tok.decode(conv.prompt_ids)  # the tools, in the fallback format
    batch = server.rollout()
    ref = forward_logprobs(model, batch)
    assert torch.allclose(batch.sampler_logprobs[batch.action_mask], ref[batch.action_mask], atol=1e-4)


def test_token_in_token_out_generate_route_samples_from_given_ids():
    """``POST /inference/v1/generate`` (vLLM's route, which verifiers' training client calls):
    token ids in, sampled ids and their log-probs out, per-request stop ids honoured."""
    import urllib.error
    import urllib.request

    from reinforge.agents.server import CompletionServer

    def call(url, body, method="POST", headers=None):
        req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method,
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    tok = make_tokenizer()
    model = eos_biased_model(tok, bias=1.0)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                     tokenize=True, return_dict=False)
    stop = tok.convert_tokens_to_ids("a")
    with CompletionServer(HFGenerator(model, tok), max_tokens=16, max_model_len=200) as server:
        server.open_episode("trace-1")
        root = server.url[: -len("/v1")]
        auth = {"Authorization": f"Bearer {server.api_key}", "X-Session-ID": "trace-1"}
        status, models = call(server.url + "/models", None, method="GET", headers=auth)
        assert status == 200 and models["data"][0]["max_model_len"] == 200
        torch.manual_seed(0)
        status, r = call(root + "/inference/v1/generate", {
            "model": "x", "token_ids": prompt,
            "sampling_params": {"temperature": 1.0, "max_tokens": 16, "logprobs": 1, "stop_token_ids": [stop]}},
            headers=auth)
        assert status == 200
        choice = r["choices"][0]
        ids, lps = choice["token_ids"], [c["logprob"] for c in choice["logprobs"]["content"]]
        assert ids and len(lps) == len(ids) and r["request_id"]
        ended = ids[-1] in (tok.eos_token_id, stop)
        assert choice["finish_reason"] == ("stop" if ended else "length")
        assert all(t not in (tok.eos_token_id, stop) for t in ids[:-1])  # it stopped at the first stop id
        # Greedy (temperature 0) is the argmax at every step.
        status, g = call(root + "/inference/v1/generate", {"token_ids": prompt,
                                                         "sampling_params": {"temperature": 0, "max_tokens": 5}},
                         headers=auth)
        assert status == 200
        assert call(root + "/inference/v1/generate", {"token_ids": []}, headers=auth)[0] == 400
        assert call(root + "/inference/v1/generate", {"token_ids": [10**6]}, headers=auth)[0] == 400
        status, err = call(root + "/inference/v1/generate", {"token_ids": [1] * 200}, headers=auth)
        assert status == 400 and "200 tokens; max_model_len is 200" in err["error"]["message"]
    gen = server.generations[0]
    assert (gen.prompt_ids, gen.token_ids, gen.session_id) == (prompt, ids, "trace-1")
    # The recorded log-probs are the model's: one forward pass over prompt + sample.
    full = torch.tensor([prompt + ids])
    with torch.no_grad():
        ref = torch.log_softmax(model(input_ids=full).logits[0, len(prompt) - 1 : -1].float(), -1)
    assert torch.allclose(torch.tensor(lps), ref.gather(1, torch.tensor(ids)[:, None]).squeeze(1), atol=1e-4)
    greedy = g["choices"][0]["token_ids"]
    with torch.no_grad():
        ctx = list(prompt)
        for t in greedy:
            assert int(model(input_ids=torch.tensor([ctx])).logits[0, -1].argmax()) == t
            ctx.append(t)


def test_verifiers_env_names_the_extra_to_install_when_verifiers_is_missing(monkeypatch):
    import sys

    from reinforge.agents import build_run_task

    monkeypatch.setitem(sys.modules, "verifiers", None)  # an import of it then fails, installed or not
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)
    with pytest.raises(ConfigError, match="task.source=env"):
        build_config({}, ["env.name=verifiers", "env.options={taskset: my_taskset}"])
    cfg = build_config({}, ["task.source=env", "env.name=verifiers", "env.options={taskset: my_taskset}"])
    with pytest.raises(ImportError, match=r'pip install "reinforge\[verifiers\]"'):
        build_run_task(cfg)


def test_endpoint_tool_calls_round_trip_as_the_model_wrote_them():
    from reinforge.agents.server import _canonical, _plain

    ours = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}
    echoed = {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"b": 2, "a": 1}'}}]}
    assert _canonical(ours) == _canonical(echoed)
    assert parse_tool_calls(_plain(echoed)["content"])[0].arguments == {"a": 1, "b": 2}


def test_squeezing_the_caches_holes_keeps_every_logprob():
    """Many turns arriving at different steps leave holes in the shared cache; gathering each
    row's real slots together (no forward pass) must not change what the model computes."""
    tok = make_tokenizer()
    model = eos_biased_model(tok, bias=2.0)
    agent = _agent(model, tok, lambda: EchoEnv(turns=6, delay=0.002),
                   budgets=AgentBudgets(max_turns=6, max_tokens_per_turn=20, max_tokens=400))
    agent.compact_slack = -10**6  # compact before every forward, whatever the holes
    torch.manual_seed(1)
    batch = agent.generate_examples(_examples(4), SamplingParams(num_samples=2))
    assert agent.compactions >= 1
    ref = forward_logprobs(model, batch)
    assert torch.allclose(batch.sampler_logprobs[batch.action_mask], ref[batch.action_mask], atol=1e-4)
    torch.manual_seed(1)
    again = _agent(model, tok, lambda: EchoEnv(turns=6), kv_reuse=False,
                   budgets=AgentBudgets(max_turns=6, max_tokens_per_turn=20, max_tokens=400)).generate_examples(
        _examples(4), SamplingParams(num_samples=2))
    assert [e.token_ids for e in again.episodes] == [e.token_ids for e in batch.episodes]


def test_observations_wait_to_be_fed_together_instead_of_widening_every_decode_step():
    """A forward costs rows x width: an observation fed beside single sampled tokens pads every
    decoding row to its width. Observations are held until they are at least as many as the
    decoding rows, so every wide forward (an observation in it) feeds at least as many
    observations as it pads decoding rows."""
    tok = make_tokenizer()
    model = eos_biased_model(tok, bias=2.0)
    widths = []
    model.register_forward_pre_hook(lambda _m, args, kwargs: widths.append(
        (kwargs["input_ids"].shape[1], kwargs["attention_mask"][:, -kwargs["input_ids"].shape[1]:].clone())),
        with_kwargs=True)
    agent = _agent(model, tok, lambda: EchoEnv(turns=4), overlap_tools=False,
                   budgets=AgentBudgets(max_turns=4, max_tokens_per_turn=24, max_tokens=300))
    torch.manual_seed(0)
    batch = agent.generate_examples(_examples(6), SamplingParams(num_samples=2))
    observations = sum(max(len(e.turns) - 1, 0) for e in batch.episodes)
    wide = []
    for width, new in widths[1:]:  # the first forward is the prefill
        if width > 1:
            fed = new.sum(dim=1)
            wide.append((int((fed > 1).sum()), int((fed == 1).sum())))
    assert observations >= 10 and wide, (observations, [e.truncation for e in batch.episodes])
    assert all(obs >= dec for obs, dec in wide), wide  # never one observation beside many decoding rows
    assert sum(obs for obs, _ in wide) == observations
