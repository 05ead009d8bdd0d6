"""Continuous batching for a served policy: the engine behind the loopback endpoint
(reinforge/agents/server.py), where requests arrive one by one from many agents at once.

``HFGenerator.generate`` takes a whole batch of prompts and returns when every row is done: a
server that calls it once per request decodes one row at a time, and prefills every turn of a
conversation from its first token. ``BatchingEngine`` instead runs one thread that owns the model
and keeps a running batch (Orca's iteration-level scheduling, Yu et al., OSDI 2022):

- requests are admitted between decode steps, whatever the running rows are doing. The prompts
  that arrived together are prefilled in one forward (each on top of its cached head, padded to
  the longest), their first tokens sampled, and their rows join the batch; every step then
  decodes one token for every running row in one forward, and a row leaves when it stops;
- the KV cache of every prompt once prefilled, and of every finished request (its prompt and the
  tokens it fed back), is kept in an LRU store bounded in bytes (``cache_bytes``); a later prompt
  that starts with the same ids (the next turn of a conversation, another sample of the same
  prompt) takes the longest stored prefix and prefills only the rest. A prompt whose whole head but
  its last token is stored needs no prefill forward at all: its row joins with that token as its
  first decode input. Requests of one admission that share a head longer than what the store
  holds wait for the first of them to be prefilled (G samples of one prompt: one prefill). Entries
  computed under other weights (``generator.version``) are dropped;
- each request samples with its own ``torch.Generator``, seeded from the request (``seed``) or, when
  it has none, from torch's global RNG when it is submitted: its tokens then do not depend on which
  other requests shared its decode steps. Greedy requests take the argmax.

Running rows live in place in one set of buffers (kv_slots.py: each row left-aligned in its own
slot, each writing its new token at its own column, masked to its own length): a joining request
is written into the next free row, a finished row's place is taken by the last running row (one
row copied, not the batch), and the buffers grow geometrically when rows or columns run out. They
are released when the engine has been idle for ``idle_release_s``.

The log-probs recorded are those of the distribution each token was drawn from
(``sampling_logprobs``), as ``HFGenerator`` records them; batched and one-at-a-time answers agree
to float rounding (tests/test_batching_engine.py, tests/test_batching_slots.py). Models whose cache
is not plain full attention (sliding windows, linear attention) are not supported:
``supports_batching`` says so and the server falls back to one request at a time.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from ..models import autocast, cache_kwargs, model_device
from .attention import decode_attention
from .base import SamplingParams
from .hf import _MIN_SHARED_PREFIX, sample_tokens, sampling_logprobs
from .kv_cache import PreallocatedCache, PreallocatedLayer
from .kv_slots import KVStore, SlotBuffers, prefill_rows, shared_head

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


class BatchingEngine:
    """Serves ``submit``-ted requests from ``generator``'s model (an ``HFGenerator``) on a thread of
    its own, batching the decode steps of every request in flight.

    max_batch:      rows decoded together at most; more requests wait for a row to finish.
    cache_bytes:    the KV store's bound (0: no reuse, every prompt prefilled in full).
    join_running:   False admits new requests only when the batch is empty (static batching: the
                    requests waiting at the same moment run together), for comparison.
    idle_release_s: the running rows' buffers are freed after this long with nothing to do.

    ``forward_calls``, ``decode_steps``, ``prefill_calls``, ``prefill_tokens``, ``reused_tokens``,
    ``rows_decoded``, ``row_moves`` and ``busy_s`` count what the engine did (what the tests and
    benchmarks read); ``time_s`` splits ``busy_s`` into prefill, decode forwards, sampling and the
    rest (bookkeeping, copies)."""

    def __init__(self, generator, *, max_batch: int = 64, cache_bytes: int = 512 << 20, join_running: bool = True,
                 idle_release_s: float = 5.0):
        if not supports_batching(generator):
            raise ValueError("the batching engine needs an in-process HF generator whose model has full attention "
                             "in every layer")
        self.generator = generator
        self.max_batch = max(1, int(max_batch))
        self.join_running = bool(join_running)
        self.idle_release_s = float(idle_release_s)
        self.store = KVStore(cache_bytes)
        self.slots = SlotBuffers(generator.engine.config)
        self.forward_calls = self.decode_steps = self.prefill_calls = self.prefill_tokens = 0
        self.reused_tokens = self.rows_decoded = self.row_moves = 0
        self.busy_s = 0.0  # seconds spent prefilling and decoding
        self.time_s = {"prefill": 0.0, "decode": 0.0, "sample": 0.0}
        self.on_step = None  # called on the engine's thread after each decode step (tests)
        self._cond = threading.Condition()
        self._pending: list[ServeRequest] = []
        self._closed = False
        self._clear = False
        self._hold = False
        self._reset_batch()
        self._expect = (0, 0)  # rows and columns the requests being admitted need
        self._thread = threading.Thread(target=self._serve, daemon=True, name="reinforge-batching")
        self._thread.start()

    # -- the caller's side ------------------------------------------------------------------------
    def submit(self, ids: list[int], params: SamplingParams, *, stop_ids=(), seed: int | None = None) -> ServeRequest:
        """Queue one completion of ``ids`` (``params.num_samples`` must be 1); ``stop_ids`` stop it
        besides the model's EOS ids. Returns at once; ``request.result()`` waits for it."""
        if params.num_samples != 1:
            raise ValueError("the batching engine samples one completion per request")
        if not ids:
            raise ValueError("the batching engine needs a prompt of at least one token")
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
        self.slots.release()

    # -- the engine's thread ----------------------------------------------------------------------
    def _reset_batch(self) -> None:
        self._rows: list[ServeRequest] = []  # the running rows, in their slots' order
        self._pos: list[int] = []  # tokens in each row's cache: the column its next input goes to
        self._inp: list[int] = []  # each row's next input token

    def _serve(self) -> None:
        while True:
            with self._cond:
                while (not self._pending or self._hold) and not self._closed:
                    if self.slots.kv is not None and not self._rows:
                        if not self._cond.wait(self.idle_release_s):
                            self.slots.release()  # idle: the buffers go back until the next request
                    else:
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
                for req in self._rows + self._take(len(self._pending) + 1, force=True):
                    req.error = err
                    req.done.set()
                self._reset_batch()
                self.slots.release()
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
            room = self.max_batch - len(self._rows)
            new = self._take(room) if room > 0 else []
            t0 = time.perf_counter()
            if new:
                self._admit(model, new)
            if self._rows:
                self._step(model)
            self.busy_s += time.perf_counter() - t0
            if not self._rows:
                with self._cond:
                    if not self._pending or self._closed or self._hold:
                        return  # (to wait in _serve)

    # -- admission --------------------------------------------------------------------------------
    def _admit(self, model, new: list[ServeRequest]) -> None:
        """Prefill ``new`` in waves of one forward each and add their rows. A request whose prompt
        shares a longer head with one prefilled in this wave than with anything stored waits for
        the next wave, when that head is in the store."""
        version = int(self.generator.version)
        if self._clear:
            self._clear = False
            self.store.clear(version)
        store = self.store.max_bytes > 0
        # Room for every request of this admission at once (one reallocation at most).
        self._expect = (len(self._rows) + len(new), max(len(r.ids) + r.params.max_new_tokens for r in new))
        waiting = new
        while waiting:
            wave, later, joins = [], [], []
            for req in waiting:
                req.version = version
                ids = torch.tensor(req.ids, dtype=torch.long)
                kv, n = self.store.lookup(ids, version) if store else (None, 0)
                a = min(n, len(req.ids) - 1)
                if store and any(self._worth_waiting(ids, w[1], a) for w in wave):
                    later.append(req)
                elif a and a == len(req.ids) - 1:
                    joins.append((req, ids, kv, a))  # every token but the last is cached: no prefill
                else:
                    wave.append((req, ids, kv, a))
            for req, ids, kv, a in joins:
                req.reused = a
                self.reused_tokens += a
                self._add_row(req, kv[:, :, :, :a], a, req.ids[-1])
            if wave:
                self._prefill(model, wave, version)
            waiting = later

    @staticmethod
    def _worth_waiting(ids: torch.Tensor, other: torch.Tensor, cached: int) -> bool:
        """Whether ``ids`` (``cached`` tokens of it in the store) would reuse enough more of
        ``other``'s cache, once that is prefilled, to wait a wave for it: a head of at least
        ``_MIN_SHARED_PREFIX`` more tokens, or every token but its last (no prefill at all)."""
        gain = min(shared_head(ids, other), len(ids) - 1) - cached
        return gain >= _MIN_SHARED_PREFIX or (gain > 0 and cached + gain == len(ids) - 1)

    def _prefill(self, model, wave: list, version: int) -> None:
        t0 = time.perf_counter()
        self.forward_calls += 1
        self.prefill_calls += 1
        seqs, logits = prefill_rows(model, self.generator.pad_id, [(r.ids, kv, a) for r, _, kv, a in wave])
        self.time_s["prefill"] += time.perf_counter() - t0
        picks, lps = self._sample([r for r, *_ in wave], logits)
        for (req, ids, _, a), seq, t, lp in zip(wave, seqs, picks.tolist(), lps.tolist()):
            req.reused = a
            self.reused_tokens += a
            self.prefill_tokens += len(req.ids) - a
            if self.store.max_bytes > 0:
                # The prompt's cache now, not only when the request finishes: the other samples of
                # this prompt arrive while it decodes (a group's episodes run concurrently).
                self.store.put(ids, seq, version)
            if self._record(req, t, lp):
                req.done.set()  # (its cache, the prompt, is stored already)
            else:
                self._add_row(req, seq, len(req.ids), t)

    def _add_row(self, req: ServeRequest, seq: torch.Tensor, pos: int, token: int) -> None:
        """Row ``len(self._rows)`` holds ``seq`` (the cache of ``pos`` tokens); ``token`` is its next input."""
        n = len(self._rows)
        rows, cols = self._expect
        cols = max(cols, len(req.ids) + req.params.max_new_tokens)  # every column a row can fill
        self.slots.reserve(min(self.max_batch, max(n + 1, rows)), cols + cols // 8, seq, self._pos, self.max_batch)
        self.slots.write(n, seq)
        self._rows.append(req)
        self._pos.append(pos)
        self._inp.append(token)

    # -- decoding ---------------------------------------------------------------------------------
    def _sample(self, reqs: list[ServeRequest], logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each request's next token and its log-prob (``logits`` [len(reqs), V]), rows grouped by
        sampling parameters, each sampled row drawing from its own generator."""
        t0 = time.perf_counter()
        n = len(reqs)
        picks = torch.zeros(n, dtype=torch.long)
        lps = torch.zeros(n, dtype=torch.float32)
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(reqs):
            p = r.params
            groups.setdefault((p.greedy, p.temperature, p.top_p), []).append(i)
        for idx in groups.values():
            params = reqs[idx[0]].params
            at = torch.tensor(idx)
            lp = sampling_logprobs(logits if len(idx) == n else logits[at.to(logits.device)], params)
            if params.greedy:
                pick = lp.argmax(dim=-1)
            else:
                u = torch.cat([torch.rand(1, 1, dtype=torch.float64, generator=reqs[i].rng) for i in idx])
                pick = sample_tokens(lp, u)
            picks[at] = pick.cpu()
            lps[at] = lp.gather(1, pick[:, None]).squeeze(1).float().cpu()
        self.time_s["sample"] += time.perf_counter() - t0
        return picks, lps

    def _record(self, req: ServeRequest, token: int, logprob: float) -> bool:
        """Append a sampled token; True when it ends the request (a stop token or the cap)."""
        req.tokens.append(token)
        req.logprobs.append(logprob)
        self.rows_decoded += 1
        if token in req.stop_ids:
            req.truncated = False
            return True
        req.truncated = len(req.tokens) >= req.params.max_new_tokens
        return req.truncated

    def _step(self, model) -> None:
        n = len(self._rows)
        device = model_device(model)
        pos = torch.tensor(self._pos, dtype=torch.long)
        cache = self.slots.decode_cache(n, pos.to(device))
        attend = torch.arange(int(pos.max()) + 1)[None, :] <= pos[:, None]  # row r: its columns [0, pos[r]]
        t0 = time.perf_counter()
        self.forward_calls += 1
        self.decode_steps += 1
        logits = model(input_ids=torch.tensor(self._inp, dtype=torch.long)[:, None].to(device),
                       attention_mask=attend.long().to(device), position_ids=pos[:, None].to(device),
                       **cache_kwargs(model, cache)).logits[:, -1]
        self.time_s["decode"] += time.perf_counter() - t0
        picks, lps = self._sample(self._rows, logits)
        finished = []
        for i, (req, t, lp) in enumerate(zip(self._rows, picks.tolist(), lps.tolist())):
            self._pos[i] += 1
            self._inp[i] = t
            if self._record(req, t, lp):
                finished.append(i)
        for i in finished:
            req = self._rows[i]
            if self.store.max_bytes > 0:  # the prompt and every sampled token but the last were fed
                self.store.put(torch.tensor(req.ids + req.tokens[:-1], dtype=torch.long),
                               self.slots.read(i, self._pos[i]), req.version)
            req.done.set()
        if finished:
            self._drop(set(finished))
        if self.on_step is not None:
            self.on_step(self)

    def _drop(self, finished: set[int]) -> None:
        """Remove finished rows: the last running rows move into their slots (one row copy each)."""
        keep = len(self._rows) - len(finished)
        holes = [i for i in sorted(finished) if i < keep]
        movers = [i for i in range(keep, len(self._rows)) if i not in finished]
        for hole, src in zip(holes, movers):
            self.slots.move(src, hole, self._pos[src])
            self.row_moves += 1
            self._rows[hole], self._pos[hole], self._inp[hole] = self._rows[src], self._pos[src], self._inp[src]
        del self._rows[keep:], self._pos[keep:], self._inp[keep:]
