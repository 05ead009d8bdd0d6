"""The batching engine's rows in place (reinforge/rollout/kv_slots.py, serving.py): a request that
takes a finished row's slot, a row moved into a hole, rows that outgrow the buffers and a batched
prefill of several prompts all give what one request alone, or one prompt alone, gets. Real tiny
HF models."""

from __future__ import annotations

import time

import pytest
import torch

from reinforge.rollout import HFGenerator, SamplingParams
from reinforge.rollout.kv_slots import prefill_rows
from reinforge.rollout.serving import BatchingEngine

from conftest import chat_prompts, eos_biased_model, make_tokenizer

SAMPLED = SamplingParams(num_samples=1, temperature=0.9, max_new_tokens=8)


@pytest.fixture(scope="module")
def parts():
    tok = make_tokenizer()
    model = eos_biased_model(tok, bias=1.0)
    model.eval()
    return tok, model


def _alone(tok, model, prompt, params, seed, no_stop=False):
    """``prompt`` served by a fresh engine with nothing else in it (and no stored KV)."""
    engine = BatchingEngine(HFGenerator(model, tok), max_batch=1, cache_bytes=0)
    if no_stop:
        engine.generator.eos_ids = {-1}
    try:
        r = engine.submit(prompt, params, seed=seed).result(60)
    finally:
        engine.close()
    return r.tokens, torch.tensor(r.logprobs)


def _same(req, ref):
    assert req.tokens == ref[0]
    assert torch.allclose(torch.tensor(req.logprobs), ref[1], atol=1e-5)


def test_a_request_takes_a_finished_rows_slot_in_place_and_samples_as_alone(parts):
    tok, model = parts
    long_p, short_p, late_p = chat_prompts(tok, ["Say something long about the sea and the sky, please.",
                                                 "Hi", "Ok"])
    a_params = SamplingParams(num_samples=1, temperature=0.9, max_new_tokens=14)
    b_params = SamplingParams(num_samples=1, temperature=0.9, max_new_tokens=2)
    engine = BatchingEngine(HFGenerator(model, tok), max_batch=2, cache_bytes=0)
    engine.generator.eos_ids = {-1}  # (nobody stops early: the schedule below is fixed)
    late, seen = [], []

    def on_step(e):
        if e.decode_steps == 1:  # B has finished (2 tokens): its row is free, C arrives
            assert len(e._rows) == 1
            late.append(e.submit(late_p, SAMPLED, seed=7))
        if late and late[0] in e._rows:
            seen.append((e._rows.index(late[0]), e.slots.kv.data_ptr()))

    engine.on_step = on_step
    try:
        # B is the longer prompt in row 1: C (shorter) reuses that row over B's stale keys.
        a, b = engine.submit_many([(short_p, a_params, {"seed": 5}), (long_p, b_params, {"seed": 6})])
        a, b, c = a.result(60), b.result(60), late[0].result(60)
    finally:
        engine.close()
    assert len(b.tokens) == 2 and len(c.tokens) == 8 and len(a.tokens) == 14
    assert {row for row, _ in seen} == {1} and len({ptr for _, ptr in seen}) == 1  # row 1, the same buffers
    assert engine.slots.reallocations == 0 and engine.row_moves == 0
    _same(c, _alone(tok, model, late_p, SAMPLED, 7, no_stop=True))
    _same(a, _alone(tok, model, short_p, a_params, 5, no_stop=True))


def test_a_finished_row_is_replaced_by_the_last_row_which_keeps_its_samples(parts):
    tok, model = parts
    prompts = chat_prompts(tok, ["What is 2+3?", "Hi", "Name a colour."])
    caps = [10, 3, 10]  # the middle row finishes first: the last row moves into its slot
    params = [SamplingParams(num_samples=1, temperature=0.9, max_new_tokens=c) for c in caps]
    engine = BatchingEngine(HFGenerator(model, tok), cache_bytes=0)
    engine.generator.eos_ids = {-1}
    try:
        reqs = [r.result(60) for r in engine.submit_many([(p, sp, {"seed": 20 + i})
                                                          for i, (p, sp) in enumerate(zip(prompts, params))])]
    finally:
        engine.close()
    assert engine.row_moves == 1 and engine.decode_steps == max(caps) - 1
    for i, (r, p, sp) in enumerate(zip(reqs, prompts, params)):
        _same(r, _alone(tok, model, p, sp, 20 + i, no_stop=True))


def test_samples_of_one_prompt_arriving_together_prefill_it_once(parts):
    tok, model = parts
    a, b = chat_prompts(tok, ["Tell me about the weather today in some detail.", "And about the weather tomorrow?"])
    engine = BatchingEngine(HFGenerator(model, tok))
    try:
        with engine.hold():
            reqs = engine.submit_many([(p, SAMPLED, {"seed": 40 + i}) for i, p in enumerate([a] * 4 + [b] * 3)])
        reqs = [r.result(60) for r in reqs]
    finally:
        engine.close()
    # The first wave prefills A and B together (they share only the chat template's few tokens);
    # the other samples then find everything but their last token stored and need no prefill.
    assert engine.prefill_calls == 1 and engine.prefill_tokens == len(a) + len(b)
    assert [r.reused for r in reqs] == [0] + [len(a) - 1] * 3 + [0] + [len(b) - 1] * 2
    for i, (r, p) in enumerate(zip(reqs, [a] * 4 + [b] * 3)):
        _same(r, _alone(tok, model, p, SAMPLED, 40 + i))
    assert len({tuple(r.tokens) for r in reqs[:4]}) > 1  # (the samples differ: their seeds do)


def test_rows_that_outgrow_the_buffers_move_once_and_keep_their_tokens(parts):
    tok, model = parts
    short, long_ = chat_prompts(tok, ["Hi", "A much longer prompt than the first one, with many more tokens in it."])
    params = SamplingParams(num_samples=1, greedy=True, max_new_tokens=12)
    engine = BatchingEngine(HFGenerator(model, tok), cache_bytes=0)
    engine.generator.eos_ids = {-1}
    late = []

    def on_step(e):
        if e.decode_steps == 2:
            late.append(e.submit(long_, params))  # more columns and one more row than allocated

    engine.on_step = on_step
    try:
        first = engine.submit(short, params).result(60)
        second = late[0].result(60)
    finally:
        engine.close()
    assert engine.slots.reallocations == 1
    _same(first, _alone(tok, model, short, params, 0, no_stop=True))
    _same(second, _alone(tok, model, long_, params, 0, no_stop=True))


def test_a_batched_prefill_gives_each_prompts_own_logits_and_cache(parts):
    tok, model = parts
    prompts = chat_prompts(tok, ["Hi", "What is 2+3?", "Say something long about the sea and the sky."])
    # Prompt 1 continues from a cached head (its first 9 tokens), the others from nothing.
    with torch.no_grad():
        head, _ = prefill_rows(model, tok.pad_token_id, [(prompts[1][:9], None, 0)])
        items = [(prompts[0], None, 0), (prompts[1], head[0], 9), (prompts[2], None, 0)]
        seqs, logits = prefill_rows(model, tok.pad_token_id, items)
        for (ids, _, _), seq, row in zip(items, seqs, logits):
            one, alone = prefill_rows(model, tok.pad_token_id, [(ids, None, 0)])
            full = model(input_ids=torch.tensor([ids])).logits[0, -1]
            assert seq.shape[3] == len(ids)
            assert torch.allclose(seq, one[0], atol=1e-5)
            assert torch.allclose(torch.log_softmax(row, -1), torch.log_softmax(full, -1), atol=1e-5)
            assert torch.allclose(row, alone[0], atol=1e-5)


def test_idle_buffers_are_released_and_come_back_for_the_next_request(parts):
    tok, model = parts
    prompt = chat_prompts(tok, ["Hi"])[0]
    params = SamplingParams(num_samples=1, greedy=True, max_new_tokens=4)
    engine = BatchingEngine(HFGenerator(model, tok), idle_release_s=0.05)
    try:
        first = engine.submit(prompt, params).result(60)
        deadline = time.monotonic() + 10
        while engine.slots.kv is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.slots.kv is None
        again = engine.submit(prompt, params).result(60)
    finally:
        engine.close()
    assert again.tokens == first.tokens and again.reused == len(prompt) - 1
