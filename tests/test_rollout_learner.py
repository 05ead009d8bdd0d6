"""HF rollout and the learner on a tiny real Llama built in the test."""

from __future__ import annotations

import copy

import pytest
import torch

from reinforge.batch import TrainBatch
from reinforge.config import AlgorithmConfig, LearnerConfig
from reinforge.learner import Learner, plan_micro_batches
from reinforge.rollout import HFGenerator, SamplingParams

from conftest import chat_prompts as _prompts
from conftest import forward_logprobs as _forward_logprobs


def test_rollout_shapes_masks_and_sampler_logprobs(tiny_model, tiny_tokenizer):
    torch.manual_seed(0)
    gen = HFGenerator(tiny_model, tiny_tokenizer, batch_size=5)  # 3 chunks: exercises chunk padding
    prompts = _prompts(tiny_tokenizer, ["a", "what is 12+7?", "xyz"])
    out = gen.generate(prompts, SamplingParams(num_samples=4, temperature=0.7, max_new_tokens=12))
    assert len(out) == 12 and out.completion_ids.shape == out.sampler_logprobs.shape
    assert out.group_index.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    eos = tiny_tokenizer.eos_token_id
    for i in range(12):
        n = int(out.completion_mask[i].sum())
        real = out.completion_ids[i, :n].tolist()
        assert out.completion_mask[i, :n].all() and not out.completion_mask[i, n:].any()
        if out.truncated[i]:
            assert eos not in real and n == 12
        else:
            assert real[-1] == eos and eos not in real[:-1]  # stop token kept, once, at the end
        assert (out.sampler_logprobs[i, n:] == 0).all()
        assert (out.sampler_logprobs[i, :n] <= 0).all()
    # prompts are left-padded copies of the originals
    assert out.prompt_ids[0][out.prompt_mask[0]].tolist() == prompts[0]
    # the recorded log-probs are those of the sampling distribution (logits / temperature)
    ref = _forward_logprobs(tiny_model, out, 0.7)
    diff = (ref - out.sampler_logprobs)[out.completion_mask].abs().max()
    assert diff < 1e-4


def test_greedy_generation_is_deterministic(tiny_model, tiny_tokenizer):
    gen = HFGenerator(tiny_model, tiny_tokenizer)
    prompts = _prompts(tiny_tokenizer, ["hello", "2+2"])
    a = gen.generate(prompts, SamplingParams(max_new_tokens=8, greedy=True))
    b = gen.generate(prompts, SamplingParams(max_new_tokens=8, greedy=True))
    assert torch.equal(a.completion_ids, b.completion_ids) and a.texts == b.texts


def test_micro_batch_plan_respects_budget_and_covers_rows():
    p = torch.tensor([5, 30, 7, 12, 3, 30])
    c = torch.tensor([10, 40, 2, 12, 1, 5])
    plan = plan_micro_batches(p, c, token_budget=80)
    rows = sorted(torch.cat(plan).tolist())
    assert rows == list(range(6))
    for mb in plan:
        width = int(p[mb].max() + c[mb].max())
        assert len(mb) == 1 or len(mb) * width <= 80
    # a row bigger than the budget still gets trained, alone
    assert [len(mb) for mb in plan_micro_batches(p, c, token_budget=10)] == [1] * 6


def _batch(gen, tok, seed=0):
    torch.manual_seed(seed)
    prompts = _prompts(tok, ["a", "bb", "what is 3*4?"])
    out = gen.generate(prompts, SamplingParams(num_samples=4, temperature=1.0, max_new_tokens=10))
    adv = torch.linspace(-1.5, 1.5, len(out))
    return out, adv


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_update_does_not_depend_on_micro_batch_split(tiny_model, tiny_tokenizer, agg):
    gen = HFGenerator(tiny_model, tiny_tokenizer)
    rollout, adv = _batch(gen, tiny_tokenizer)
    algo = AlgorithmConfig(loss_agg=agg)
    results = []
    for budget in (10_000, 40):  # one micro-batch vs many
        model = copy.deepcopy(tiny_model)
        learner = Learner(model, LearnerConfig(lr=1e-2, micro_batch_tokens=budget, grad_clip=1e9), algo)
        stats = learner.step(TrainBatch(rollout=rollout, advantages=adv, old_logprobs=None))
        results.append((stats, [p.detach().clone() for p in model.parameters()]))
    (s1, p1), (s2, p2) = results
    assert s1["loss"] == pytest.approx(s2["loss"], abs=1e-5)
    assert s1["grad_norm"] == pytest.approx(s2["grad_norm"], rel=1e-4)
    # Adam divides by sqrt(v): float noise on near-zero gradients is amplified, hence the atol.
    for a, b in zip(p1, p2):
        torch.testing.assert_close(a, b, atol=5e-4, rtol=1e-3)


def test_learner_logprobs_match_sampler(tiny_model, tiny_tokenizer):
    gen = HFGenerator(tiny_model, tiny_tokenizer)
    rollout, _ = _batch(gen, tiny_tokenizer)
    learner = Learner(tiny_model, LearnerConfig(micro_batch_tokens=50), AlgorithmConfig())
    lp = learner.compute_logprobs(rollout)
    m = rollout.completion_mask
    assert (lp - rollout.sampler_logprobs)[m].abs().max() < 1e-4
    assert (lp[~m] == 0).all()


def test_positive_advantage_raises_logprob(tiny_model, tiny_tokenizer):
    gen = HFGenerator(tiny_model, tiny_tokenizer)
    rollout, _ = _batch(gen, tiny_tokenizer)
    adv = torch.zeros(len(rollout))
    adv[0] = 1.0
    learner = Learner(tiny_model, LearnerConfig(lr=1e-2), AlgorithmConfig())
    before = learner.compute_logprobs(rollout)[0].sum()
    learner.step(TrainBatch(rollout=rollout, advantages=adv, old_logprobs=None))
    after = learner.compute_logprobs(rollout)[0].sum()
    assert after > before


def test_non_finite_loss_skips_update(tiny_model, tiny_tokenizer):
    gen = HFGenerator(tiny_model, tiny_tokenizer)
    rollout, adv = _batch(gen, tiny_tokenizer)
    adv[0] = float("nan")
    learner = Learner(tiny_model, LearnerConfig(lr=1e-2), AlgorithmConfig())
    before = [p.detach().clone() for p in tiny_model.parameters()]
    stats = learner.step(TrainBatch(rollout=rollout, advantages=adv, old_logprobs=None))
    assert stats["skipped"] == 1.0
    for a, p in zip(before, tiny_model.parameters()):
        assert torch.equal(a, p)
    assert all(p.grad is None for p in tiny_model.parameters())


def test_shared_prompt_prefix_equals_full_rows(tiny_model, tiny_tokenizer):
    """Running each prompt once and reusing its KV cache for the group's completions gives the
    same log-probs and the same gradients as running every row in full."""
    gen = HFGenerator(tiny_model, tiny_tokenizer)
    rollout, adv = _batch(gen, tiny_tokenizer)
    grads, logprobs = [], []
    for share in (False, True):
        model = copy.deepcopy(tiny_model)
        cfg = LearnerConfig(lr=1e-2, micro_batch_tokens=60, share_prompt_prefix=share)
        learner = Learner(model, cfg, AlgorithmConfig())
        assert learner.share_prefix == share
        logprobs.append(learner.compute_logprobs(rollout))
        learner.optimizer.step = lambda: None  # keep the gradients to compare them
        learner.optimizer.zero_grad = lambda set_to_none=True: None
        learner.step(TrainBatch(rollout=rollout, advantages=adv, old_logprobs=None))
        grads.append([p.grad.clone() for p in model.parameters()])
    torch.testing.assert_close(logprobs[0], logprobs[1], atol=1e-5, rtol=1e-5)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_shared_prefix_plan_keeps_groups_together():
    p = torch.tensor([50] * 8 + [20] * 8)
    c = torch.tensor([5, 9, 3, 4, 6, 7, 8, 2] + [10] * 8)
    g = torch.tensor([0] * 8 + [1] * 8)
    plan = plan_micro_batches(p, c, token_budget=200, group_index=g)
    assert sorted(torch.cat(plan).tolist()) == list(range(16))
    for mb in plan:
        groups = set(g[mb].tolist())
        # shared cost: one prompt per group plus each row's completion
        width_c = int(c[mb].max())
        assert len(groups) * int(p[mb].max()) + len(mb) * width_c <= 200 or len(mb) == 1
    # 8 rows of group 1 cost 20 + 8*10 = 100: one micro-batch holds the whole group
    assert any(set(mb.tolist()) >= set(range(8, 16)) for mb in plan)


# -- the chunked LM head ------------------------------------------------------------------------
def _assert_grads_close(got: dict, want: dict, rel: float) -> None:
    """Gradients equal up to float rounding: every element within ``rel`` of the largest
    gradient entry of its tensor (summation order differs between the two paths)."""
    assert got.keys() == want.keys()
    for name in want:
        scale = float(want[name].abs().max())
        err = float((got[name] - want[name]).abs().max())
        assert err <= rel * scale, f"{name}: max |diff| {err:.3g} vs max |grad| {scale:.3g}"


def _logprob_loss_and_grads(model, rollout, *, chunk, share, temperature=0.7):
    """Log-probs, entropies and the gradients of a loss using both, from one micro-batch."""
    from reinforge.learner.forward import micro_inputs

    learner = Learner(model, LearnerConfig(logits_chunk_tokens=chunk, share_prompt_prefix=share),
                      AlgorithmConfig(), temperature=temperature)
    mi = micro_inputs(rollout, torch.arange(len(rollout)), share_prefix=learner.share_prefix)
    model.zero_grad(set_to_none=True)
    lp, ent = learner._token_logprobs(model, mi, entropy="grad")
    w = torch.linspace(-1.0, 1.0, lp.numel()).reshape(lp.shape)
    ((lp * w).sum() - 0.3 * ent.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach(), ent.detach(), grads


@pytest.mark.parametrize("share", [False, True])
def test_chunked_logprobs_equal_full_logits(tiny_model, tiny_tokenizer, share):
    """The LM head applied a few positions at a time under checkpointing gives the log-probs,
    entropies and gradients of the whole micro-batch's logits at once (temperature included)."""
    gen = HFGenerator(tiny_model, tiny_tokenizer)
    rollout, _ = _batch(gen, tiny_tokenizer)
    lp0, ent0, g0 = _logprob_loss_and_grads(copy.deepcopy(tiny_model), rollout, chunk=0, share=share)
    lp1, ent1, g1 = _logprob_loss_and_grads(copy.deepcopy(tiny_model), rollout, chunk=7, share=share)
    m = rollout.completion_mask[:, : lp0.shape[1]]
    assert (lp1[~m] == 0).all() and (ent1[~m] == 0).all()
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent1, ent0, atol=1e-5, rtol=0)
    assert len(g0) == len(list(tiny_model.parameters()))
    _assert_grads_close(g1, g0, rel=1e-5)


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj", "lm_head"]])
def test_chunked_logprobs_with_lora(tiny_model, tiny_tokenizer, targets):
    """Through a PEFT wrapper: all-linear leaves the LM head alone, an explicit lm_head target
    wraps it; both give the plain path's values and adapter gradients."""
    from peft import LoraConfig, get_peft_model

    from reinforge.learner.forward import body_and_head

    gen = HFGenerator(tiny_model, tiny_tokenizer)
    rollout, _ = _batch(gen, tiny_tokenizer)
    results = []
    for chunk in (0, 5):
        torch.manual_seed(1)
        model = get_peft_model(copy.deepcopy(tiny_model), LoraConfig(r=4, lora_alpha=8, target_modules=targets,
                                                                     init_lora_weights=False))
        body, head = body_and_head(model)
        assert (type(head) is torch.nn.Linear) == (targets == "all-linear")
        results.append(_logprob_loss_and_grads(model, rollout, chunk=chunk, share=True))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent1, ent0, atol=1e-5, rtol=0)
    assert g0 and all("lora_" in n for n in g0)
    _assert_grads_close(g1, g0, rel=1e-5)


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_chunked_learner_step_equals_full_logits(tiny_model, tiny_tokenizer, autocast):
    """A whole update (several micro-batches, entropy bonus, temperature) is the same with the
    chunked head as with full logits: to float32 rounding, and to bf16's under autocast."""
    gen = HFGenerator(tiny_model, tiny_tokenizer)
    rollout, adv = _batch(gen, tiny_tokenizer)
    out = []
    for chunk in (0, 16):
        model = copy.deepcopy(tiny_model)
        cfg = LearnerConfig(lr=1e-2, micro_batch_tokens=60, logits_chunk_tokens=chunk)
        learner = Learner(model, cfg, AlgorithmConfig(entropy_coef=0.01), temperature=0.9, autocast_dtype=autocast)
        learner.optimizer.step = lambda: None  # keep the gradients to compare them
        learner.optimizer.zero_grad = lambda set_to_none=True: None
        stats = learner.step(TrainBatch(rollout=rollout, advantages=adv, old_logprobs=None))
        out.append((stats, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (s0, g0), (s1, g1) = out
    rel = 1e-5 if autocast is None else 1e-2
    for key in ("loss", "entropy", "grad_norm"):
        assert s1[key] == pytest.approx(s0[key], rel=rel, abs=1e-6)
    if autocast is None:  # bf16 matmuls round differently in chunks; their values are checked above
        _assert_grads_close(g1, g0, rel=1e-5)


def _record_grads(learner) -> list[torch.Tensor]:
    """A list that receives the gradients the learner's optimiser steps with."""
    grads: list[torch.Tensor] = []
    step = learner.optimizer.step

    def recording_step(*args, **kwargs):
        grads.extend(p.grad.detach().clone() for p in learner.params)
        return step(*args, **kwargs)

    learner.optimizer.step = recording_step
    return grads


def _rows_seen(model):
    """A list that collects the batch size of every forward through ``model``'s embedding."""
    seen: list[int] = []
    model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(int(o.shape[0])))
    return seen


@pytest.mark.parametrize("agg,loss,stale,share", [
    ("token_mean", "clipped", False, False), ("seq_mean_token_mean", "gspo", True, False),
    ("token_sum_norm", "cispo", True, True), ("token_mean", "reinforce", False, True)])
def test_zero_advantage_skip_equals_the_full_update(tiny_model, tiny_tokenizer, agg, loss, stale, share):
    gen = HFGenerator(tiny_model, tiny_tokenizer)
    rollout, adv = _batch(gen, tiny_tokenizer)
    adv[4:8] = 0.0  # the middle group: all rewards equal, advantage 0
    adv[0] = 0.0    # and one row of another group
    old = None
    if stale:  # a later mini-batch: the ratio is not 1, the clip can bind
        old = Learner(tiny_model, LearnerConfig(), AlgorithmConfig()).compute_logprobs(rollout) - 0.05
    algo = AlgorithmConfig(loss_agg=agg, policy_loss=loss)
    results = []
    for skip in (False, True):
        model = copy.deepcopy(tiny_model)
        seen = _rows_seen(model)
        cfg = LearnerConfig(lr=1e-2, micro_batch_tokens=60, weight_decay=0.1, skip_zero_advantage=skip,
                            share_prompt_prefix=share)
        learner = Learner(model, cfg, algo, max_new_tokens=10)
        grads = _record_grads(learner)
        stats = learner.step(TrainBatch(rollout=rollout, advantages=adv, old_logprobs=old))
        results.append((stats, grads, [p.detach().clone() for p in model.parameters()], sum(seen)))
    (full, g_full, w_full, rows_full), (skipped, g_skip, w_skip, rows_skip) = results
    if not share:  # (with a shared prefix a group's prompt runs once per micro-batch it spans)
        assert rows_full == len(rollout) and rows_skip == len(rollout) - 5  # the 5 rows never ran
    assert skipped["learner_rows_skipped"] == pytest.approx(5 / len(rollout)) and full["learner_rows_skipped"] == 0
    for key in ("loss", "pg_loss"):
        assert skipped[key] == pytest.approx(full[key], rel=1e-5, abs=1e-7), key
    assert skipped["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-5)
    for a, b in zip(g_full, g_skip):  # the gradient the optimiser stepped with
        torch.testing.assert_close(b, a, atol=1e-7, rtol=1e-4)
    # Adam divides by sqrt(v): float noise on near-zero gradients is amplified, hence the atol.
    for a, b in zip(w_full, w_skip):
        torch.testing.assert_close(b, a, atol=5e-4, rtol=1e-3)


def test_all_zero_advantages_run_nothing_and_still_step_the_optimiser(tiny_model, tiny_tokenizer):
    gen = HFGenerator(tiny_model, tiny_tokenizer)
    rollout, _ = _batch(gen, tiny_tokenizer)
    adv = torch.zeros(len(rollout))
    weights = []
    for skip in (False, True):
        model = copy.deepcopy(tiny_model)
        seen = _rows_seen(model)
        learner = Learner(model, LearnerConfig(lr=1e-2, weight_decay=0.1, skip_zero_advantage=skip,
                                               share_prompt_prefix=False), AlgorithmConfig())
        stats = learner.step(TrainBatch(rollout=rollout, advantages=adv, old_logprobs=None))
        assert stats["skipped"] == 0.0 and stats["grad_norm"] == 0.0
        assert (sum(seen) == 0) == skip
        weights.append([p.detach().clone() for p in model.parameters()])
    for a, b, p0 in zip(*weights, tiny_model.parameters()):
        torch.testing.assert_close(b, a)
        assert not torch.equal(b, p0.detach())  # weight decay applied, as in the full update


@pytest.mark.parametrize("change", ["kl_coef", "entropy_coef", "cov_penalty", "critic", "loss"])
def test_zero_advantage_skip_is_off_when_something_reads_those_rows(tiny_model, tiny_tokenizer, change):
    from reinforge.algorithms import POLICY_LOSSES, clipped_surrogate_loss, register_policy_loss
    from reinforge.config import CriticConfig
    from reinforge.learner.critic import Critic

    gen = HFGenerator(tiny_model, tiny_tokenizer)
    rollout, adv = _batch(gen, tiny_tokenizer)
    adv[4:8] = 0.0
    algo = {"kl_coef": AlgorithmConfig(kl_coef=0.1), "entropy_coef": AlgorithmConfig(entropy_coef=0.01),
            "cov_penalty": AlgorithmConfig(cov_penalty="kl_cov"), "critic": AlgorithmConfig(),
            "loss": AlgorithmConfig()}[change]
    critic = Critic(copy.deepcopy(tiny_model), CriticConfig()) if change == "critic" else None
    if change == "loss":  # a user's loss, not declared advantage-weighted
        register_policy_loss("test_user_loss")(clipped_surrogate_loss)
        algo = AlgorithmConfig(policy_loss="test_user_loss")
    try:
        learner = Learner(tiny_model, LearnerConfig(share_prompt_prefix=False), algo, critic=critic)
        batch = TrainBatch(rollout=rollout, advantages=adv, old_logprobs=None,
                           ref_logprobs=torch.zeros(rollout.completion_ids.shape) if change == "kl_coef" else None)
        assert learner.rows_with_gradient(batch) is None
        if change != "critic":  # (the critic's own step needs returns)
            seen = _rows_seen(tiny_model)
            stats = learner.step(batch)
            assert stats["learner_rows_skipped"] == 0 and sum(seen) == len(rollout)
    finally:
        POLICY_LOSSES.unregister("test_user_loss")


def test_a_loaded_learner_state_takes_the_config_settings_at_the_warmup_position(tiny_model, tiny_tokenizer):
    """A checkpoint's optimiser state brings back the rates it was saved with; the learner loading
    it keeps its own config's lr, betas and weight decay, and warm-up goes on from the saved step."""
    from reinforge.config import CriticConfig
    from reinforge.learner.critic import Critic

    gen = HFGenerator(tiny_model, tiny_tokenizer)
    rollout, adv = _batch(gen, tiny_tokenizer)
    batch = TrainBatch(rollout=rollout, advantages=adv, old_logprobs=None)
    algo = AlgorithmConfig()
    saved = Learner(copy.deepcopy(tiny_model),
                    LearnerConfig(lr=0.1, lr_warmup_steps=4, betas=[0.9, 0.99], grad_clip=1e9), algo)
    for _ in range(2):  # two steps into a 4-step warm-up at lr 0.1
        saved.step(batch)
    state = copy.deepcopy(saved.state_dict())  # the optimiser's state_dict holds its live tensors

    same = Learner(copy.deepcopy(tiny_model), LearnerConfig(lr=0.1, lr_warmup_steps=4, betas=[0.9, 0.99], grad_clip=1e9), algo)
    same.load_state_dict(copy.deepcopy(state))
    groups = lambda learner: [dict(g, params=None) for g in learner.optimizer.param_groups]  # noqa: E731
    assert groups(same) == groups(saved)  # unchanged settings: what was saved, bit for bit
    assert same.scheduler.get_last_lr() == saved.scheduler.get_last_lr()
    saved.step(batch)
    same.step(batch)
    assert groups(same) == groups(saved)
    for a, b in zip(saved.params, same.params):
        assert torch.equal(a, b)

    changed = Learner(copy.deepcopy(tiny_model), LearnerConfig(lr=0.01, lr_warmup_steps=4, betas=[0.8, 0.9],
                                                               weight_decay=0.1), algo)
    changed.load_state_dict(copy.deepcopy(state))
    group = changed.optimizer.param_groups[0]
    assert group["lr"] == pytest.approx(0.01 * 3 / 4) and changed.scheduler.get_last_lr() == [group["lr"]]
    assert group["betas"] == (0.8, 0.9) and group["weight_decay"] == 0.1
    changed.step(batch)  # warm-up goes on from its position, at the new rate
    assert changed.optimizer.param_groups[0]["lr"] == pytest.approx(0.01)

    critic = Critic(copy.deepcopy(tiny_model), CriticConfig(lr=1.0))
    resumed = Critic(copy.deepcopy(tiny_model), CriticConfig(lr=0.5), betas=(0.8, 0.9), weight_decay=0.1)
    resumed.load(critic.state())
    assert [(g["lr"], g["betas"], g["weight_decay"]) for g in resumed.optimizer.param_groups] == [(0.5, (0.8, 0.9), 0.1)]
