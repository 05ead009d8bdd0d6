"""The HF backend's own decode loop: inverse-CDF sampling, rows leaving the batch when they stop,
and the bf16 generation copy refreshed from the learner."""

from __future__ import annotations

import copy

import pytest
import torch

from reinforge.batch import TrainBatch
from reinforge.config import AlgorithmConfig, LearnerConfig
from reinforge.learner import Learner
from reinforge.models import merged_state_dict
from reinforge.rollout import Generator, HFGenerator, SamplingParams, build_generator
from reinforge.rollout.hf import left_pad, sample_tokens, sampling_logprobs

from conftest import chat_prompts as _prompts
from conftest import forward_logprobs as _forward_logprobs


def test_inverse_cdf_sampling_matches_the_distribution():
    torch.manual_seed(0)
    probs = torch.tensor([0.5, 0.0, 0.3, 1e-12, 0.2 - 1e-12, 0.0])
    logprobs = probs.clamp(min=1e-45).log().float().masked_fill(probs == 0, float("-inf"))
    draws = sample_tokens(logprobs.expand(200_000, -1).contiguous())
    freq = torch.bincount(draws, minlength=6).float() / len(draws)
    assert freq[1] == 0 and freq[5] == 0  # zero-probability tokens are never drawn
    # within 5 standard errors of the true frequencies
    se = (probs * (1 - probs) / len(draws)).sqrt()
    assert ((freq - probs).abs() <= 5 * se + 1e-6).all(), freq


def test_top_p_and_temperature_in_the_recorded_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    lp = sampling_logprobs(logits, SamplingParams(temperature=0.5, top_p=0.8))
    p = torch.softmax(logits / 0.5, -1)[0]  # [0.867, 0.117, 0.016, 0.002]: top-0.8 keeps one token
    assert p[0] > 0.8 and lp[0, 0] == 0 and torch.isinf(lp[0, 1:]).all()
    greedy = sampling_logprobs(logits, SamplingParams(temperature=0.5, greedy=True))
    assert torch.allclose(greedy, torch.log_softmax(logits, -1))  # greedy records temperature 1


@pytest.fixture
def peaked_model(tiny_model):
    """The tiny model with larger weights: its greedy continuations differ from prompt to prompt
    (the freshly initialised one repeats a single token)."""
    model = copy.deepcopy(tiny_model)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model


def _stop_tokens(model, tok, prompts):
    """Extra stop tokens taken from the greedy continuations at different steps, so rows stop at
    different steps (the random model almost never emits its real EOS)."""
    ids, mask = left_pad(prompts, tok.pad_token_id)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=12, do_sample=False,
                             pad_token_id=tok.pad_token_id, eos_token_id=None)
    gen = out[:, ids.shape[1]:]
    return {int(gen[i, 2 + 3 * i]) for i in range(min(3, len(prompts)))}


def test_greedy_loop_equals_hf_generate_with_rows_stopping_early(peaked_model, tiny_tokenizer):
    """Rows that stop leave the batch (their KV cache rows dropped); the others must decode
    exactly as Hugging Face ``generate`` does."""
    tok, model = tiny_tokenizer, peaked_model
    prompts = _prompts(tok, ["a", "what is 12+7?", "xyz", "hello there", "q", "bb", "what is 3*4?"])
    gen = HFGenerator(model, tok)
    gen.eos_ids = {tok.eos_token_id, *_stop_tokens(model, tok, prompts)}
    out = gen.generate(prompts, SamplingParams(max_new_tokens=12, greedy=True))
    lengths = out.completion_mask.sum(1)
    assert len(set(lengths.tolist())) >= 3  # rows stopped at different steps
    ids, mask = left_pad(prompts, tok.pad_token_id)
    with torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=12, do_sample=False,
                                  pad_token_id=tok.pad_token_id, eos_token_id=sorted(gen.eos_ids))
    ref = ref[:, ids.shape[1]:]
    for i in range(len(prompts)):
        n = int(lengths[i])
        assert out.completion_ids[i, :n].tolist() == ref[i, :n].tolist()
        assert bool(out.truncated[i]) == (n == 12 and int(ref[i, n - 1]) not in gen.eos_ids)
    assert (_forward_logprobs(model, out) - out.sampler_logprobs).abs().max() < 1e-4


def test_sampled_rows_stopping_early_keep_exact_logprobs(peaked_model, tiny_tokenizer):
    tok, model = tiny_tokenizer, peaked_model
    prompts = _prompts(tok, ["a", "bb", "what is 3*4?"])
    gen = HFGenerator(model, tok, batch_size=8)  # two chunks
    gen.eos_ids = {tok.eos_token_id, *_stop_tokens(model, tok, prompts)}
    torch.manual_seed(1)
    out = gen.generate(prompts, SamplingParams(num_samples=4, temperature=0.8, max_new_tokens=16))
    lengths = out.completion_mask.sum(1)
    assert (~out.truncated).sum() >= 2 and lengths.min() < 16
    for i in range(len(out)):
        n = int(lengths[i])
        real = out.completion_ids[i, :n].tolist()
        assert not any(t in gen.eos_ids for t in real[:-1])
        assert (real[-1] in gen.eos_ids) == (not out.truncated[i])
    assert (_forward_logprobs(model, out, 0.8) - out.sampler_logprobs).abs().max() < 1e-4
    # the same seed draws the same completions
    torch.manual_seed(1)
    again = gen.generate(prompts, SamplingParams(num_samples=4, temperature=0.8, max_new_tokens=16))
    assert torch.equal(again.completion_ids, out.completion_ids)


def test_bf16_copy_generates_from_its_own_weights_and_syncs_after_an_update(tiny_model, tiny_tokenizer):
    tok = tiny_tokenizer
    model = copy.deepcopy(tiny_model)
    gen = HFGenerator(model, tok, copy_dtype=torch.bfloat16)
    assert gen.needs_sync and gen.engine is not model
    assert next(gen.engine.parameters()).dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.float32
    # tied embeddings stay tied in the copy (one tensor, not two)
    assert sum(p.numel() for p in gen.engine.parameters()) == sum(p.numel() for p in model.parameters())
    prompts = _prompts(tok, ["a", "bb", "what is 3*4?"])
    torch.manual_seed(0)
    rollout = gen.generate(prompts, SamplingParams(num_samples=4, max_new_tokens=10))
    # the recorded log-probs are the bf16 copy's (up to bf16 rounding between its decode steps and
    # one full forward), and close to the fp32 learner's
    assert (_forward_logprobs(gen.engine, rollout) - rollout.sampler_logprobs).abs().max() < 1e-2
    learner_lp = _forward_logprobs(model, rollout)
    assert (learner_lp - rollout.sampler_logprobs).abs().max() < 0.1

    learner = Learner(model, LearnerConfig(lr=5e-2), AlgorithmConfig())
    learner.step(TrainBatch(rollout=rollout, advantages=torch.linspace(-1, 1, len(rollout))))
    moved = (_forward_logprobs(model, rollout) - learner_lp).abs().max()
    stale = (_forward_logprobs(gen.engine, rollout) - _forward_logprobs(model, rollout)).abs().max()
    assert moved > 0.1 and stale > 0.1  # the update moved the learner, not the copy
    assert rollout.versions.tolist() == [0] * len(rollout)
    # Synced from a state dict (tensors, not the live module: what crosses a process boundary).
    state = {k: v.clone() for k, v in merged_state_dict(model).items()}
    gen.sync_weights(state, version=1)
    synced = (_forward_logprobs(gen.engine, rollout) - _forward_logprobs(model, rollout)).abs().max()
    assert synced < 0.1 and synced < stale / 3
    for name, p in model.state_dict().items():
        assert torch.equal(gen.engine.state_dict()[name], p.to(torch.bfloat16)), name
    with torch.no_grad():  # the copy holds its own tensors: changing the source changes nothing
        for v in state.values():
            v.zero_()
    assert all(torch.equal(gen.engine.state_dict()[n], p.to(torch.bfloat16)) for n, p in model.state_dict().items())
    after = gen.generate(prompts, SamplingParams(num_samples=2, max_new_tokens=4))
    assert after.versions.tolist() == [1] * len(after)  # every row records the weights that sampled it
    assert isinstance(gen, Generator)


def test_bf16_copy_of_a_lora_policy_holds_the_merged_weights(tiny_model, tiny_tokenizer):
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(copy.deepcopy(tiny_model), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # B starts at zero; make the adapters matter
    gen = HFGenerator(model, tiny_tokenizer, copy_dtype=torch.bfloat16)
    merged = copy.deepcopy(model).merge_and_unload()
    for name, p in merged.state_dict().items():
        assert torch.allclose(gen.engine.state_dict()[name].float(), p, atol=2e-2), name
    assert not torch.allclose(gen.engine.state_dict()["model.layers.0.self_attn.q_proj.weight"].float(),
                              tiny_model.state_dict()["model.layers.0.self_attn.q_proj.weight"], atol=2e-2)


@pytest.mark.parametrize("dtype,flag,expect_copy", [
    ("bfloat16", None, True), ("float32", None, False), ("float32", True, True), ("bfloat16", False, False),
])
def test_bf16_copy_follows_model_dtype_unless_set(tiny_model, tiny_tokenizer, dtype, flag, expect_copy):
    from reinforge.config import build_config

    overrides = [f"model.dtype={dtype}"] + ([] if flag is None else [f"rollout.hf_bf16_copy={str(flag).lower()}"])
    cfg = build_config({}, overrides)
    gen = build_generator(cfg.rollout, tiny_model, tiny_tokenizer, model_path="unused", model_dtype=dtype)
    assert gen.needs_sync is expect_copy
    assert (gen.engine is tiny_model) is (not expect_copy)


def test_old_config_key_vllm_sync_every_still_loads():
    from reinforge.config import build_config

    assert build_config({"rollout": {"vllm_sync_every": 3}}, []).rollout.sync_every == 3


def test_trainer_with_bf16_copy_syncs_and_logs_mismatch_without_extra_forward(tmp_path, tiny_model_dir, monkeypatch):
    import test_trainer

    from reinforge.tracking import RunDir
    from reinforge.trainer import Trainer

    calls = []
    original = Learner.compute_logprobs

    def counting(self, rollout, *, reference=False):
        if not reference:  # (the reference's log-probs for the KL term are a separate matter)
            calls.append(1)
        return original(self, rollout, reference=reference)

    monkeypatch.setattr(Learner, "compute_logprobs", counting)
    cfg = test_trainer._config(tmp_path, tiny_model_dir, "model.dtype=bfloat16", "trainer.steps=2",
                               "trainer.eval_every=0", "trainer.eval_at_start=false", "learner.lr=1e-2")
    trainer = Trainer(cfg)
    at_close = {}
    close = HFGenerator.close

    def recording_close(self):  # the run closes its generator at the end: look at the copy first
        at_close.update({k: v.clone() for k, v in self.engine.state_dict().items()})
        close(self)

    monkeypatch.setattr(HFGenerator, "close", recording_close)
    result = trainer.run()
    assert trainer.generator.needs_sync
    assert trainer.generator.engine is None  # the bf16 copy was freed with the run
    assert calls == []  # the mismatch came from the update's own forward pass
    metrics = RunDir.open(result.run_dir).read_metrics()
    for m in metrics:
        assert 0 <= m["logprob_diff_mean"] <= m["logprob_diff_max"] < 0.5
        assert m["time_sync"] >= 0
    for name, p in trainer.model.state_dict().items():  # synced after the last update
        assert torch.equal(at_close[name], p.to(torch.bfloat16)), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_decode_attention_equals_repeated_kv_attention(dtype):
    """One query token per row over a padded KV cache, query heads grouped under their KV head,
    against the reference: KV heads repeated (transformers' repeat_kv) and plain softmax attention."""
    from reinforge.rollout.attention import grouped_decode_attention

    torch.manual_seed(0)
    b, heads, kv_heads, length, dim = 3, 6, 2, 9, 8
    q = torch.randn(b, heads, 1, dim, dtype=dtype)
    k = torch.randn(b, kv_heads, length, dim, dtype=dtype)
    v = torch.randn(b, kv_heads, length, dim, dtype=dtype)
    mask = torch.ones(b, 1, 1, length, dtype=torch.bool)
    mask[1, ..., :4] = False  # left padding
    mask[2, ..., :1] = False
    module = torch.nn.Module()
    out, _ = grouped_decode_attention(module, q, k, v, mask, scaling=0.5)
    rep = heads // kv_heads
    kk, vv = k.repeat_interleave(rep, dim=1).float(), v.repeat_interleave(rep, dim=1).float()
    scores = (q.float() @ kk.transpose(2, 3)) * 0.5
    ref = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ vv  # [b, heads, 1, dim]
    assert out.shape == (b, 1, heads, dim)
    torch.testing.assert_close(out.float(), ref.transpose(1, 2), atol=1e-5 if dtype == torch.float32 else 2e-2, rtol=0)


def test_preallocated_layer_holds_what_a_dynamic_layer_holds():
    """Prefill, repeat per sample, decode steps, rows leaving, a crop, growth past the capacity and
    an overwrite: the preallocated layer's keys and values equal ``DynamicLayer``'s throughout, and
    within its capacity a step writes into the same buffer."""
    from transformers.cache_utils import DynamicLayer

    from reinforge.rollout.kv_cache import PreallocatedLayer

    torch.manual_seed(0)
    ours, ref = PreallocatedLayer(capacity=9), DynamicLayer()

    def both(op, *args):
        out = [getattr(layer, op)(*args) for layer in (ours, ref)]
        assert torch.equal(ours.keys, ref.keys) and torch.equal(ours.values, ref.values), op
        assert ours.get_seq_length() == ref.get_seq_length()
        assert ours.get_mask_sizes(1) == ref.get_mask_sizes(1)
        return out

    def kv(rows, n):
        return torch.randn(rows, 2, n, 4), torch.randn(rows, 2, n, 4)

    both("update", *kv(2, 5))
    both("batch_repeat_interleave", 3)
    buffer = ours._keys.data_ptr()
    for _ in range(2):
        returned, expected = both("update", *kv(6, 1))
        assert torch.equal(returned[0], expected[0]) and torch.equal(returned[1], expected[1])
    assert ours._keys.data_ptr() == buffer  # written in place
    both("batch_select_indices", torch.tensor([0, 2, 5]))
    both("update", *kv(3, 1))
    both("crop", -2)
    both("update", *kv(3, 4))  # 6 + 4 > 9: the buffers grow
    assert ours._keys.shape[2] >= 10
    keys, values = kv(3, 4)
    ours.overwrite(keys, values)
    ref.keys, ref.values = keys, values
    both("update", *kv(3, 1))


def _with_dynamic_cache(monkeypatch, module):
    """Make ``module`` decode with transformers' DynamicCache (the path the preallocated cache
    replaced), as the reference."""
    from transformers import DynamicCache

    monkeypatch.setattr(module, "PreallocatedCache", lambda config, capacity: DynamicCache(config=config))


@pytest.mark.parametrize("greedy,num_samples", [(True, 1), (False, 3)])
def test_preallocated_cache_decodes_the_same_tokens_and_logprobs_as_dynamic_cache(
        peaked_model, tiny_tokenizer, monkeypatch, greedy, num_samples):
    """Left-padded prompts of different lengths, G samples per prompt (the prefilled cache repeated)
    and rows stopping at different steps (cache rows selected away): the preallocated cache must
    give the tokens and log-probs DynamicCache gives, bit for bit in float32."""
    from reinforge.rollout import hf
    from reinforge.rollout.kv_cache import PreallocatedLayer

    tok, model = tiny_tokenizer, peaked_model
    prompts = _prompts(tok, ["a", "what is 12+7?", "xyz", "hello there, how are you today?", "q", "bb"])
    gen = HFGenerator(model, tok)
    gen.eos_ids = {tok.eos_token_id, *_stop_tokens(model, tok, prompts)}
    params = SamplingParams(num_samples=num_samples, temperature=0.9, max_new_tokens=14, greedy=greedy)
    calls = []

    def spy(op):
        original = getattr(PreallocatedLayer, op)

        def recorded(self, arg):
            calls.append(op)
            return original(self, arg)

        monkeypatch.setattr(PreallocatedLayer, op, recorded)

    spy("batch_select_indices")
    spy("batch_repeat_interleave")
    torch.manual_seed(3)
    ours = gen.generate(prompts, params)
    assert "batch_select_indices" in calls and ("batch_repeat_interleave" in calls) == (num_samples > 1)
    lengths = ours.completion_mask.sum(1)
    assert len(set(lengths.tolist())) >= 3 and lengths.max() == 14  # rows stopped at different steps
    monkeypatch.undo()
    _with_dynamic_cache(monkeypatch, hf)
    torch.manual_seed(3)
    ref = gen.generate(prompts, params)
    assert torch.equal(ours.completion_ids, ref.completion_ids)
    assert torch.equal(ours.completion_mask, ref.completion_mask)
    assert torch.equal(ours.truncated, ref.truncated)
    assert torch.equal(ours.sampler_logprobs, ref.sampler_logprobs)  # bit-identical
    temperature = 1.0 if greedy else params.temperature
    assert (_forward_logprobs(model, ours, temperature) - ours.sampler_logprobs).abs().max() < 1e-4


def test_agent_loop_with_preallocated_cache_equals_dynamic_cache(monkeypatch):
    """The agent loop's cache grows past its first size (observations, holes) and is compacted:
    the trajectories and log-probs must be DynamicCache's."""
    import test_agents

    from reinforge.agents import loop
    from reinforge.agents.loop import AgentBudgets

    from conftest import eos_biased_model, make_tokenizer

    from reinforge.rollout.kv_cache import PreallocatedLayer

    tok = make_tokenizer()
    model = eos_biased_model(tok, bias=2.0)
    grew = []
    update = PreallocatedLayer.update

    def recording_update(self, *args, **kwargs):
        out = update(self, *args, **kwargs)
        grew.append(self.length > self.capacity)
        return out

    monkeypatch.setattr(PreallocatedLayer, "update", recording_update)
    runs = []
    for reference in (False, True):
        if reference:
            _with_dynamic_cache(monkeypatch, loop)
        agent = test_agents._agent(model, tok, lambda: test_agents.EchoEnv(turns=5), overlap_tools=False,
                                   budgets=AgentBudgets(max_turns=5, max_tokens_per_turn=8, max_tokens=200))
        agent.compact_slack = -10**6  # compact before every forward
        torch.manual_seed(2)
        runs.append((agent.generate_examples(test_agents._examples(3), SamplingParams(num_samples=2)), agent))
    (ours, agent), (ref, _) = runs
    assert agent.compactions >= 1 and any(grew) and max(len(e.turns) for e in ours.episodes) >= 3
    assert [e.token_ids for e in ours.episodes] == [e.token_ids for e in ref.episodes]
    assert torch.equal(ours.sampler_logprobs, ref.sampler_logprobs)


def test_generation_passes_the_cache_without_the_deprecated_argument(tiny_model, tiny_tokenizer):
    import warnings

    prompts = _prompts(tiny_tokenizer, ["a", "bb"])
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        HFGenerator(tiny_model, tiny_tokenizer).generate(prompts, SamplingParams(num_samples=2, max_new_tokens=3))


def test_grouped_decode_attention_reads_a_strided_cache_view_exactly():
    """The preallocated cache hands attention a view of its buffer's filled slots (strided rows):
    the result must be the same bits as on a contiguous copy."""
    from reinforge.rollout.attention import grouped_decode_attention

    torch.manual_seed(0)
    b, heads, kv_heads, length, dim = 4, 6, 2, 11, 8
    q = torch.randn(b, heads, 1, dim)
    buffer_k, buffer_v = torch.randn(b, kv_heads, length + 7, dim), torch.randn(b, kv_heads, length + 7, dim)
    k, v = buffer_k[:, :, :length], buffer_v[:, :, :length]
    assert not k.is_contiguous()
    mask = torch.ones(b, 1, 1, length, dtype=torch.bool)
    mask[1, ..., :3] = False
    module = torch.nn.Module()
    out, _ = grouped_decode_attention(module, q, k, v, mask, scaling=0.3)
    ref, _ = grouped_decode_attention(module, q, k.contiguous(), v.contiguous(), mask, scaling=0.3)
    assert torch.equal(out, ref)


def test_a_common_prompt_head_is_run_once_and_decodes_as_the_full_prompts(peaked_model, tiny_tokenizer):
    """Prompts that share a long head (a system prompt, few-shot turns) run it once for all of them;
    greedy tokens equal `generate` on the full prompts, and the sampled log-probs a full forward's."""
    from reinforge.rollout.hf import common_prefix_length

    tok, model = tiny_tokenizer, peaked_model
    head = "Answer briefly and only with the result, please. "
    prompts = _prompts(tok, [head + q for q in ["a", "what is 12+7?", "xyz", "hello there", "q", "bb"]])
    assert common_prefix_length(prompts) >= 16
    gen = HFGenerator(model, tok)
    gen.eos_ids = {tok.eos_token_id, *_stop_tokens(model, tok, prompts)}
    shapes = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, i, o: shapes.append(tuple(o.shape[:2])))
    out = gen.generate(prompts, SamplingParams(max_new_tokens=12, greedy=True))
    hook.remove()
    assert shapes[0] == (1, common_prefix_length(prompts))  # the head, once
    assert shapes[1][0] == len(prompts) and shapes[1][1] < max(len(p) for p in prompts)
    lengths = out.completion_mask.sum(1)
    assert len(set(lengths.tolist())) >= 2
    ids, mask = left_pad(prompts, tok.pad_token_id)
    with torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=mask.long(), max_new_tokens=12, do_sample=False,
                             pad_token_id=tok.pad_token_id, eos_token_id=sorted(gen.eos_ids))[:, ids.shape[1]:]
    for i in range(len(prompts)):
        n = int(lengths[i])
        assert out.completion_ids[i, :n].tolist() == ref[i, :n].tolist()
    assert (_forward_logprobs(model, out) - out.sampler_logprobs).abs().max() < 1e-4
    torch.manual_seed(2)
    sampled = gen.generate(prompts, SamplingParams(num_samples=3, temperature=0.8, max_new_tokens=10))
    assert (_forward_logprobs(model, sampled, 0.8) - sampled.sampler_logprobs).abs().max() < 1e-4
