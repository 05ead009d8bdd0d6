"""Continuous batching for a served policy: the engine behind the loopback endpoint
(reinforge/agents/server.py), where requests arrive one by one from many agents at once.

``HFGenerator.generate`` takes a whole batch of prompts and returns when every row is done: a
server that calls it once per request decodes one row at a time, and prefills every turn of a
conversation from its first token. ``BatchingEngine`` instead runs one thread that owns the model
and keeps a running batch (Orca's iteration-level scheduling, Yu et al., OSDI 2022):

- a request is admitted at the next decode step, whatever the running rows are doing: its prompt
  is prefilled (one forward for that prompt) and its row joins the batch; every step then decodes
  one token for every running row in one forward, and a row leaves when it stops;
- the KV cache of every prompt once prefilled, and of every finished request (its prompt and the
  tokens it fed back), is kept in an LRU store bounded in bytes (``cache_bytes``); a later prompt that starts with the same ids (the next
  turn of a conversation, another sample of the same prompt) takes the longest stored prefix and
  prefills only the rest. Entries computed under other weights (``generator.version``) are dropped;
- each request samples with its own ``torch.Generator``, seeded from the request (``seed``) or, when
  it has none, from torch's global RNG when it is submitted: its tokens then do not depend on which
  other requests shared its decode steps. Greedy requests take the argmax.

Rows of one batch hold KV caches of different lengths: each row's cache is right-aligned to the
batch's length, padding on the left masked out (zeros, so no NaN reaches attention), and positions
are per row. Finished rows stay in the batch, fed padding, until they are a quarter of it or new
rows join (both rebuild the batch's buffers, which copies the cache once).

The log-probs recorded are those of the distribution each token was drawn from
(``sampling_logprobs``), as ``HFGenerator`` records them; batched and one-at-a-time answers agree
to float rounding (tests/test_batching_engine.py). Models whose cache is not plain full attention
(sliding windows, linear attention) are not supported: ``supports_batching`` says so and the server
falls back to one request at a time.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..models import autocast, cache_kwargs, model_device
from .attention import decode_attention
from .base import SamplingParams
from .hf import sample_tokens, sampling_logprobs
from .kv_cache import PreallocatedCache, PreallocatedLayer

MAX_SEED = (1 << 63) - 1


def supports_batching(generator) -> bool:
    """Whether ``generator`` is an in-process HF generator whose model's cache is full attention in
    every layer (what the engine assembles batches of)."""
    model = getattr(generator, "engine", None)
    config = getattr(model, "config", None)
    if config is None or not hasattr(generator, "eos_ids"):
        return False
    try:
        layers = PreallocatedCache(config, 1).layers
        return bool(layers) and all(type(layer) is PreallocatedLayer for layer in layers)
    except Exception:  # noqa: BLE001 - a model transformers' cache cannot describe
        return False


@dataclass(eq=False)
class ServeRequest:
    """One request: ``ids`` in; ``tokens`` and ``logprobs`` out (the stop token included, as
    sampled), ``truncated`` when it ran out of ``max_new_tokens`` first; ``reused``: the prompt
    tokens whose KV came from the store rather than a prefill."""

    ids: list[int]
    params: SamplingParams
    stop_ids: frozenset
    seed: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    truncated: bool = False
    reused: int = 0
    version: int = 0
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)
    rng: torch.Generator | None = None

    def result(self, timeout: float | None = None) -> "ServeRequest":
        if not self.done.wait(timeout):
            raise TimeoutError("the batching engine did not answer in time")
        if self.error is not None:
            raise RuntimeError(f"generation failed: {type(self.error).__name__}: {self.error}") from self.error
        return self


class KVStore:
    """Finished sequences' KV caches (per layer [1, kv_heads, n, head_dim]) keyed by their ids,
    least recently used dropped first once they hold more than ``max_bytes``."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self.version: int | None = None
        self.entries: OrderedDict[int, tuple[torch.Tensor, list]] = OrderedDict()
        self._next = 0

    def clear(self, version: int | None = None) -> None:
        self.entries.clear()
        self.bytes = 0
        self.version = version

    def put(self, ids: torch.Tensor, kv: list, version: int) -> None:
        if version != self.version:
            self.clear(version)
        size = sum(k.nbytes + v.nbytes for k, v in kv)
        if size > self.max_bytes or len(ids) < 2:
            return
        self.entries[self._next] = (ids, kv)
        self._next += 1
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, old) = self.entries.popitem(last=False)
            self.bytes -= sum(k.nbytes + v.nbytes for k, v in old)

    def lookup(self, ids: torch.Tensor, version: int, extra=()) -> tuple[list | None, int]:
        """The stored KV sharing the longest head with ``ids`` (also among ``extra``: (ids, kv)
        pairs not in the store), and that head's length."""
        if version != self.version:
            self.clear(version)
        best, best_n, best_key = None, 0, None
        candidates = [(key, e) for key, e in self.entries.items()] + [(None, e) for e in extra]
        for key, (stored, kv) in candidates:
            m = min(len(stored), len(ids))
            if m <= best_n or stored[0] != ids[0]:
                continue
            diff = (stored[:m] != ids[:m]).nonzero()
            n = int(diff[0]) if len(diff) else m
            if n > best_n:
                best, best_n, best_key = kv, n, key
        if best_key is not None:
            self.entries.move_to_end(best_key)
        return best, best_n


class BatchingEngine:
    """Serves ``submit``-ted requests from ``generator``'s model (an ``HFGenerator``) on a thread of
    its own, batching the decode steps of every request in flight.

    max_batch:    rows decoded together at most; more requests wait for a row to finish.
    cache_bytes:  the KV store's bound (0: no reuse, every prompt prefilled in full).
    join_running: False admits new requests only when the batch is empty (static batching: the
                  requests waiting at the same moment run together), for comparison.

    ``forward_calls``, ``decode_steps``, ``prefill_tokens``, ``reused_tokens``, ``rows_decoded`` and
    ``busy_s`` count what the engine did (what the tests and benchmarks read)."""

    def __init__(self, generator, *, max_batch: int = 64, cache_bytes: int = 512 << 20, join_running: bool = True):
        if not supports_batching(generator):
            raise ValueError("the batching engine needs an in-process HF generator whose model has full attention "
                             "in every layer")
        self.generator = generator
        self.max_batch = max(1, int(max_batch))
        self.join_running = bool(join_running)
        self.store = KVStore(cache_bytes)
        self.forward_calls = self.decode_steps = self.prefill_tokens = self.reused_tokens = self.rows_decoded = 0
        self.busy_s = 0.0  # seconds spent prefilling and decoding
        self.on_step = None  # called on the engine's thread after each decode step (tests)
        self._cond = threading.Condition()
        self._pending: list[ServeRequest] = []
        self._closed = False
        self._clear = False
        self._hold = False
        self._reset_batch()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="reinforge-batching")
        self._thread.start()

    # -- the caller's side ------------------------------------------------------------------------
    def submit(self, ids: list[int], params: SamplingParams, *, stop_ids=(), seed: int | None = None) -> ServeRequest:
        """Queue one completion of ``ids`` (``params.num_samples`` must be 1); ``stop_ids`` stop it
        besides the model's EOS ids. Returns at once; ``request.result()`` waits for it."""
        if params.num_samples != 1:
            raise ValueError("the batching engine samples one completion per request")
        if seed is None:
            seed = int(torch.randint(0, MAX_SEED, (1,)))
        req = ServeRequest(list(ids), params, frozenset(self.generator.eos_ids) | frozenset(stop_ids), int(seed))
        if not params.greedy:
            req.rng = torch.Generator().manual_seed(req.seed)
        with self._cond:
            if self._closed:
                raise RuntimeError("the batching engine is closed")
            self._pending.append(req)
            self._cond.notify()
        return req

    def submit_many(self, requests: list[tuple[list[int], SamplingParams, dict]]) -> list[ServeRequest]:
        """``submit`` each (ids, params, keyword arguments) at the same moment: the engine admits
        them at the same step (up to ``max_batch``)."""
        with self._cond:  # (reentrant: each submit takes it again)
            return [self.submit(ids, params, **kw) for ids, params, kw in requests]

    @contextmanager
    def hold(self):
        """Within the block the engine admits nothing: requests submitted meanwhile are admitted
        together when it ends (a caller that wants them batched from the first step)."""
        with self._cond:
            self._hold = True
        try:
            yield self
        finally:
            with self._cond:
                self._hold = False
                self._cond.notify()

    def clear_cache(self) -> None:
        """Empty the KV store (on the engine's thread, between steps)."""
        with self._cond:
            self._clear = True
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout=60)
        self.store.clear()

    # -- the engine's thread ----------------------------------------------------------------------
    def _reset_batch(self) -> None:
        self._rows: list[ServeRequest | None] = []  # None: a finished row still in the buffers
        self._cache: PreallocatedCache | None = None
        self._base: list = []  # per layer: the (keys, values) buffers whose first rows the cache uses
        self._length = 0  # filled slots of every row's cache
        self._pos = torch.zeros(0, dtype=torch.long)  # real tokens in each row's cache
        self._logits: torch.Tensor | None = None  # [rows, V]: each row's next-token logits

    def _serve(self) -> None:
        while True:
            with self._cond:
                while (not self._pending or self._hold) and not self._closed:
                    self._cond.wait()
                if self._closed:
                    for req in self._pending:
                        req.error = RuntimeError("the batching engine closed")
                        req.done.set()
                    self._pending.clear()
                    return
            model = self.generator.engine
            was_training = model.training
            model.eval()
            try:
                amp = autocast(model_device(model), getattr(self.generator, "autocast_dtype", None))
                with torch.no_grad(), decode_attention(model), amp:
                    self._busy(model)
            except BaseException as err:  # noqa: BLE001 - every waiting caller hears of it
                for req in [r for r in self._rows if r is not None] + self._take(len(self._pending) + 1, force=True):
                    req.error = err
                    req.done.set()
                self._reset_batch()
            finally:
                model.train(was_training)

    def _take(self, room: int, force: bool = False) -> list[ServeRequest]:
        with self._cond:
            if not force and (self._closed or self._hold or (not self.join_running and self._rows)):
                return []
            new, self._pending = self._pending[:room], self._pending[room:]
            return new

    def _busy(self, model) -> None:
        """Admit and decode until nothing is running or waiting."""
        while True:
            live = sum(r is not None for r in self._rows)
            new = self._take(self.max_batch - live) if live < self.max_batch else []
            t0 = time.perf_counter()
            if new:
                self._admit(model, new)
            if not self._rows:
                with self._cond:
                    if not self._pending or self._closed or self._hold:
                        return  # (to wait in _serve)
                continue
            self._step(model)
            self.busy_s += time.perf_counter() - t0

    def _prefill(self, model, req: ServeRequest, prefix, reuse: int):
        """req's prompt through the model on top of ``reuse`` stored tokens: (the KV per layer
        [1, kv_heads, n, head_dim], the logits of its first token)."""
        n = len(req.ids)
        device = model_device(model)
        cache = PreallocatedCache(model.config, n)
        if reuse:
            for layer, (k, v) in zip(cache.layers, prefix):
                layer.update(k[:, :, :reuse], v[:, :, :reuse])
        ids = torch.tensor([req.ids[reuse:]], dtype=torch.long, device=device)
        self.forward_calls += 1
        logits = model(input_ids=ids, position_ids=torch.arange(reuse, n, device=device)[None], logits_to_keep=1,
                       **cache_kwargs(model, cache)).logits[0, -1]
        self.prefill_tokens += n - reuse
        self.reused_tokens += reuse
        req.reused = reuse
        return [(layer.keys, layer.values) for layer in cache.layers], logits

    def _admit(self, model, new: list[ServeRequest]) -> None:
        version = int(self.generator.version)
        if self._clear:
            self._clear = False
            self.store.clear(version)
        fresh = []
        for req in new:
            req.version = version
            ids = torch.tensor(req.ids, dtype=torch.long)
            # This admission's own prefills count too: G samples of one prompt prefill it once.
            prefix, n = self.store.lookup(ids, version, extra=[(f[1], f[2]) for f in fresh])
            kv, logits = self._prefill(model, req, prefix, min(n, len(req.ids) - 1))
            fresh.append((req, ids, kv, logits))
            if self.store.max_bytes > 0 and n < len(req.ids) - 1:
                # The prompt's cache now, not only when the request finishes: the other samples of
                # this prompt arrive while it decodes (a group's episodes run concurrently).
                self.store.put(ids, kv, version)
        self._rebuild(model, fresh)

    def _append(self, fresh: list) -> bool:
        """Write ``fresh`` rows into the free rows of the batch's buffers, right-aligned to its
        length, without copying the running rows; False when they do not fit (a prompt longer than
        the batch's length, too few free rows or slots)."""
        if self._cache is None or not fresh or self._cache.layers[0]._keys.data_ptr() != self._base[0][0].data_ptr():
            return False  # (a layer outgrew its slots and moved to a buffer of its own)
        base = self._base[0][0]
        rows = len(self._rows)
        need = max(f[0].params.max_new_tokens for f in fresh)
        if (rows + len(fresh) > base.shape[0] or any(len(f[0].ids) > self._length for f in fresh)
                or self._length + need > base.shape[2]):
            return False
        length = self._length
        for li, (layer, (keys, values)) in enumerate(zip(self._cache.layers, self._base)):
            for j, f in enumerate(fresh):
                r, p = rows + j, len(f[0].ids)
                keys[r, :, : length - p].zero_()
                values[r, :, : length - p].zero_()
                keys[r, :, length - p : length] = f[2][li][0][0]
                values[r, :, length - p : length] = f[2][li][1][0]
            layer.adopt(keys[: rows + len(fresh)], values[: rows + len(fresh)], length)
        self._rows = self._rows + [f[0] for f in fresh]
        self._pos = torch.cat([self._pos, torch.tensor([len(f[0].ids) for f in fresh], dtype=torch.long)])
        self._logits = torch.cat([self._logits] + [f[3][None] for f in fresh])
        return True

    def _rebuild(self, model, fresh: list) -> None:
        """New buffers holding the running rows that are still live, then ``fresh`` ones (request,
        ids, kv, logits), each row's cache right-aligned to the longest. The buffers have spare rows
        and slots, so that requests arriving later join by ``_append`` without a copy."""
        if self._append(fresh):
            return
        keep = [i for i, r in enumerate(self._rows) if r is not None]
        pos = [int(self._pos[i]) for i in keep] + [len(f[0].ids) for f in fresh]
        rows = [self._rows[i] for i in keep] + [f[0] for f in fresh]
        if not rows:
            self._reset_batch()
            return
        # New rows: a quarter more slots on the left than the longest row needs (masked padding),
        # so that somewhat longer prompts can join later without moving every row; compacting
        # keeps the alignment (one copy of the surviving rows).
        length = max(pos) + max(pos) // 4 if fresh else self._length
        # Slots for the longest answer still to come, plus room for prompts a little longer than
        # these to join; rows for twice as many requests (up to max_batch).
        room = max(max(r.params.max_new_tokens - len(r.tokens) for r in rows), max(r.params.max_new_tokens for r in rows))
        slots = length + room + length // 8
        row_cap = max(len(rows), min(self.max_batch, 2 * len(rows)))
        cache = PreallocatedCache(model.config, slots)
        old = self._cache.layers if self._cache is not None else [None] * len(cache.layers)
        keep_t = torch.tensor(keep, dtype=torch.long)
        base = []
        for li, (layer, prev) in enumerate(zip(cache.layers, old)):
            ref = fresh[0][2][li][0] if fresh else prev._keys
            shape = (row_cap, ref.shape[1], slots, ref.shape[3])
            keys, values = ref.new_zeros(shape), ref.new_zeros(shape)
            if keep and length == self._length:  # the running rows keep their alignment: one copy
                keys[: len(keep), :, :length] = prev._keys[keep_t.to(ref.device), :, :length]
                values[: len(keep), :, :length] = prev._values[keep_t.to(ref.device), :, :length]
            else:
                for r, i in enumerate(keep):
                    p = pos[r]
                    keys[r, :, length - p : length] = prev._keys[i, :, self._length - p : self._length]
                    values[r, :, length - p : length] = prev._values[i, :, self._length - p : self._length]
            for j, f in enumerate(fresh):
                r, p = len(keep) + j, pos[len(keep) + j]
                keys[r, :, length - p : length] = f[2][li][0][0]
                values[r, :, length - p : length] = f[2][li][1][0]
            base.append((keys, values))
            layer.adopt(keys[: len(rows)], values[: len(rows)], length)
        logits = [self._logits[keep]] if keep else []
        logits += [f[3][None] for f in fresh]
        self._rows, self._cache, self._length, self._base = rows, cache, length, base
        self._pos = torch.tensor(pos, dtype=torch.long)
        self._logits = torch.cat(logits)

    def _sample(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each live row's next token and its log-prob, rows grouped by sampling parameters."""
        n = len(self._rows)
        picks = torch.full((n,), int(self.generator.pad_id), dtype=torch.long)
        lps = torch.zeros(n, dtype=torch.float32)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(self._rows):
            if r is not None:
                p = r.params
                groups.setdefault((p.greedy, p.temperature, p.top_p), []).append(i)
        for idx in groups.values():
            params = self._rows[idx[0]].params
            at = torch.tensor(idx)
            lp = sampling_logprobs(self._logits[at.to(self._logits.device)], params)
            if params.greedy:
                pick = lp.argmax(dim=-1)
            else:
                u = torch.cat([torch.rand(1, 1, dtype=torch.float64, generator=self._rows[i].rng) for i in idx])
                pick = sample_tokens(lp, u)
            picks[at] = pick.cpu()
            lps[at] = lp.gather(1, pick[:, None]).squeeze(1).float().cpu()
        return picks, lps

    def _finish(self, i: int, req: ServeRequest, truncated: bool) -> None:
        req.truncated = truncated
        p = int(self._pos[i])  # the prompt and every sampled token but the last were fed back
        if self.store.max_bytes > 0:
            kv = [(layer._keys[i : i + 1, :, self._length - p : self._length].clone(),
                   layer._values[i : i + 1, :, self._length - p : self._length].clone()) for layer in self._cache.layers]
            self.store.put(torch.tensor(req.ids + req.tokens[:-1], dtype=torch.long), kv, req.version)
        self._rows[i] = None
        req.done.set()

    def _step(self, model) -> None:
        picks, lps = self._sample()
        for i, req in enumerate(self._rows):
            if req is None:
                continue
            t = int(picks[i])
            req.tokens.append(t)
            req.logprobs.append(float(lps[i]))
            self.rows_decoded += 1
            if t in req.stop_ids:
                self._finish(i, req, truncated=False)
            elif len(req.tokens) >= req.params.max_new_tokens:
                self._finish(i, req, truncated=True)
        live = [i for i, r in enumerate(self._rows) if r is not None]
        if not live:
            self._reset_batch()
            return
        if len(live) * 4 <= 3 * len(self._rows):  # finished rows are a quarter of the batch: drop them
            self._rebuild(model, [])  # (keeps the live rows in order)
            picks = picks[live]
        device = model_device(model)
        attend = torch.arange(self._length + 1)[None, :] >= (self._length - self._pos)[:, None]
        self.forward_calls += 1
        self.decode_steps += 1
        self._logits = model(input_ids=picks[:, None].to(device), attention_mask=attend.long().to(device),
                             position_ids=self._pos[:, None].to(device), **cache_kwargs(model, self._cache)).logits[:, -1]
        self._length += 1
        self._pos = self._pos + 1
        if self.on_step is not None:
            self.on_step(self)
