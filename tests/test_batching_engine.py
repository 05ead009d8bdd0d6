"""The continuous-batching engine behind the loopback endpoint (reinforge/rollout/serving.py):
batched answers are the one-at-a-time answers, a request arriving mid-decode joins the running
batch, a continued conversation reuses its KV cache and gets the log-probs of a fresh prefill,
and concurrent HTTP requests share the model's forward calls. Real tiny HF models, real sockets."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request

import pytest
import torch

from reinforge.agents.server import CompletionServer
from reinforge.rollout import HFGenerator, SamplingParams
from reinforge.rollout.serving import BatchingEngine

from conftest import chat_prompts, eos_biased_model, make_tokenizer

GREEDY = SamplingParams(num_samples=1, greedy=True, max_new_tokens=10)
TEXTS = ["Hi", "What is 2+3?", "Name a colour.", "Say something long about the sea and the sky.", "Ok"]


@pytest.fixture(scope="module")
def parts():
    tok = make_tokenizer()
    model = eos_biased_model(tok, bias=1.0)  # sampled answers stop now and then; greedy ones run to the cap
    model.eval()
    forwards = [0]
    model.register_forward_pre_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
    return tok, model, forwards


def _serial(tok, model, prompt, params):
    """One prompt through HFGenerator.generate (the old one-at-a-time path)."""
    out = HFGenerator(model, tok).generate([prompt], params)
    k = int(out.completion_mask[0].sum())
    return out.completion_ids[0, :k].tolist(), out.sampler_logprobs[0, :k]


def test_batched_greedy_answers_are_the_one_at_a_time_answers_with_shared_decode_steps(parts):
    tok, model, forwards = parts
    prompts = chat_prompts(tok, TEXTS)
    # Caps of 4..12 tokens: rows leave the batch at different steps.
    params = [SamplingParams(num_samples=1, greedy=True, max_new_tokens=4 + 2 * i) for i in range(len(prompts))]
    serial = [_serial(tok, model, p, sp) for p, sp in zip(prompts, params)]
    engine = BatchingEngine(HFGenerator(model, tok), cache_bytes=0)
    try:
        before = forwards[0]
        reqs = [r.result(60) for r in engine.submit_many([(p, sp, {}) for p, sp in zip(prompts, params)])]
        used = forwards[0] - before
    finally:
        engine.close()
    lengths = [len(r.tokens) for r in reqs]
    assert lengths == [4, 6, 8, 10, 12]
    for r, (ids, lps) in zip(reqs, serial):
        assert r.tokens == ids
        assert torch.allclose(torch.tensor(r.logprobs), lps, atol=1e-5)
    # One prefill forward for the prompts that arrived together, then one forward per step for
    # every row together: the longest answer's steps, where one at a time would take one per token
    # of every answer.
    assert engine.decode_steps == max(lengths) - 1 and engine.prefill_calls == 1
    assert used == engine.forward_calls == 1 + max(lengths) - 1
    assert used < sum(lengths)


def test_a_request_arriving_mid_decode_joins_the_running_batch(parts):
    tok, model, forwards = parts
    a, b = chat_prompts(tok, ["Say something long about the sea and the sky.", "Hi"])
    long = SamplingParams(num_samples=1, greedy=True, max_new_tokens=16)
    engine = BatchingEngine(HFGenerator(model, tok), cache_bytes=0)
    engine.generator.eos_ids = {-1}  # (no stop token: A decodes all 16 steps)
    rows, late = [], []

    def on_step(e):
        rows.append(sum(r is not None for r in e._rows))
        if e.decode_steps == 3:  # A is decoding: B arrives now
            late.append(e.submit(b, GREEDY))

    engine.on_step = on_step
    try:
        ra = engine.submit(a, long).result(60)
        rb = late[0].result(60)
    finally:
        engine.close()
    ref = HFGenerator(model, tok)
    ref.eos_ids = {-1}
    for r, prompt, params in ((ra, a, long), (rb, b, GREEDY)):
        out = ref.generate([prompt], params)
        assert r.tokens == out.completion_ids[0].tolist()
        assert torch.allclose(torch.tensor(r.logprobs), out.sampler_logprobs[0], atol=1e-5)
    # B's 10 tokens were decoded in A's steps: no step of its own (its first from its prefill, the
    # other 9 in A's steps 4-12; on_step sees it running after 8 of them, it leaves in the 9th).
    assert len(ra.tokens) == 16 and len(rb.tokens) == 10
    assert engine.decode_steps == 15 and max(rows) == 2 and rows.count(2) >= 8
    assert engine.rows_decoded == 16 + 10


def test_seeded_sampling_does_not_depend_on_the_batch(parts):
    tok, model, _ = parts
    prompts = chat_prompts(tok, TEXTS)
    params = SamplingParams(num_samples=1, temperature=0.8, top_p=0.9, max_new_tokens=10)
    answers = []
    for max_batch in (1, 8):  # one at a time, then all together
        engine = BatchingEngine(HFGenerator(model, tok), max_batch=max_batch, cache_bytes=0)
        try:
            reqs = [r.result(60) for r in engine.submit_many([(p, params, {"seed": 100 + i})
                                                              for i, p in enumerate(prompts)])]
        finally:
            engine.close()
        answers.append([(r.tokens, torch.tensor(r.logprobs)) for r in reqs])
        assert engine.decode_steps == (sum(len(r.tokens) - 1 for r in reqs) if max_batch == 1
                                       else max(len(r.tokens) for r in reqs) - 1)
    for (t1, l1), (t8, l8) in zip(*answers):
        assert t1 == t8 and torch.allclose(l1, l8, atol=1e-5)
    assert len({tuple(t) for t, _ in answers[0]}) > 1


def test_a_continued_conversation_reuses_its_kv_cache_with_fresh_prefill_logprobs(parts):
    tok, model, forwards = parts
    prompt = chat_prompts(tok, ["What is 2+3?"])[0]
    obs = tok.encode("\n<|im_start|>user\nAnd 4+4?<|im_end|>\n<|im_start|>assistant\n")
    answers = {}
    for cache_bytes in (0, 64 << 20):
        engine = BatchingEngine(HFGenerator(model, tok), cache_bytes=cache_bytes)
        try:
            first = engine.submit(prompt, GREEDY).result(60)
            context = prompt + first.tokens + obs
            prefilled = engine.prefill_tokens
            second = engine.submit(context, GREEDY).result(60)
            prefilled = engine.prefill_tokens - prefilled
            # Another sample of the same prompt: all but its last token from the store.
            again = engine.submit(prompt, GREEDY).result(60)
        finally:
            engine.close()
        answers[cache_bytes] = (second, again, prefilled, first)
    (fresh, _, full, _), (reused, again, part, first) = answers[0], answers[64 << 20]
    assert full == len(context) and fresh.reused == 0
    # Only the new turn was prefilled: the first turn's prompt and sampled tokens came from its cache.
    assert reused.reused == len(prompt) + len(first.tokens) - 1 and part == len(obs) + 1
    assert reused.tokens == fresh.tokens
    assert torch.allclose(torch.tensor(reused.logprobs), torch.tensor(fresh.logprobs), atol=1e-5)
    assert again.reused == len(prompt) - 1 and again.tokens == first.tokens
    assert torch.allclose(torch.tensor(again.logprobs), torch.tensor(first.logprobs), atol=1e-5)
    # Against one forward pass over the whole conversation.
    full_ids = torch.tensor([context + reused.tokens])
    with torch.no_grad():
        ref = torch.log_softmax(model(input_ids=full_ids).logits[0, len(context) - 1 : -1].float(), -1)
    assert torch.allclose(torch.tensor(reused.logprobs),
                          ref.gather(1, torch.tensor(reused.tokens)[:, None]).squeeze(1), atol=1e-5)


def test_the_kv_store_is_bounded_and_forgets_other_weights(parts):
    tok, model, _ = parts
    prompts = chat_prompts(tok, TEXTS)
    gen = HFGenerator(model, tok)
    small = BatchingEngine(gen, cache_bytes=60_000)  # a few of the tiny model's sequences
    try:
        for p in prompts:
            small.submit(p, GREEDY).result(60)
            assert small.store.bytes <= 60_000
        assert 0 < len(small.store.entries) < len(prompts)  # the least recently used went first
        assert small.submit(prompts[-1], GREEDY).result(60).reused == len(prompts[-1]) - 1
        gen.version += 1  # new weights: nothing stored before is reused
        assert small.submit(prompts[-1], GREEDY).result(60).reused == 0
    finally:
        small.close()


def test_concurrent_http_requests_share_forward_calls_and_record_the_serial_answers(parts):
    tok, model, _ = parts
    prompts = chat_prompts(tok, TEXTS)
    results = {}
    for batching in (False, True):
        server = CompletionServer(HFGenerator(model, tok), max_tokens=10, batching=batching).start()
        try:
            ep = server.open_episode()
            out = [None] * len(prompts)

            def call(i):
                body = json.dumps({"token_ids": prompts[i], "sampling_params": {"temperature": 0}}).encode()
                req = urllib.request.Request(server.url[: -len("/v1")] + "/inference/v1/generate", data=body,
                                             headers={"Authorization": f"Bearer {ep.api_key}",
                                                      "Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=60) as r:
                    out[i] = json.loads(r.read())["choices"][0]

            threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
            with server.batcher.hold() if batching else contextlib.nullcontext():
                for t in threads:  # (held: every request waits until all have arrived)
                    t.start()
                while batching and len(server.batcher._pending) < len(prompts):
                    time.sleep(0.01)
            for t in threads:
                t.join(60)
            results[batching] = (out, {tuple(g.prompt_ids): g for g in server.generations})
            if batching:
                steps = server.batcher.decode_steps
        finally:
            server.close()
    (serial, recorded_serial), (batched, recorded) = results[False], results[True]
    for a, b in zip(serial, batched):
        assert a["token_ids"] == b["token_ids"]
        assert torch.allclose(torch.tensor([c["logprob"] for c in a["logprobs"]["content"]]),
                              torch.tensor([c["logprob"] for c in b["logprobs"]["content"]]), atol=1e-5)
    for p in prompts:  # what is recorded for training is what was answered
        g = recorded[tuple(p)]
        assert g.token_ids == recorded_serial[tuple(p)].token_ids
    assert steps == max(len(b["token_ids"]) for b in batched) - 1
