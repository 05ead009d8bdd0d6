"""KV memory for the continuous-batching engine (serving.py): the rows of the running batch, kept in
place in one set of buffers, the batched prefill of arriving prompts, and the store of finished
sequences' caches that later prompts continue from.

A sequence's KV cache travels as one tensor [layers, 2 (keys, values), kv_heads, tokens, head_dim],
so moving a row or storing a finished one is one copy, not one per layer.

``SlotBuffers`` holds the running rows, each row **left-aligned** in its own slot (its token t at
column t). A decode step writes every row's new key and value at that row's own column
(``SlotLayer.update``) and masks each row to its own columns, so rows of different lengths share a
step without being shifted into a common alignment: a request joins by writing its prompt's cache
into a free row, a finished row's place is taken by the last row (one row copied), and the buffers
are reallocated only when rows or columns run out, growing geometrically. The unfilled columns of a
row hold zeros or a finished row's old values (finite: masked attention gives them weight exactly 0).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from ..models import cache_kwargs, model_device
from .kv_cache import PreallocatedCache, PreallocatedLayer


class KVStore:
    """Finished sequences' KV caches ([layers, 2, kv_heads, n, head_dim]) keyed by their ids, least
    recently used dropped first once they hold more than ``max_bytes``."""

    def __init__(self, max_bytes: int):
        self.max_bytes = int(max_bytes)
        self.bytes = 0
        self.version: int | None = None
        self.entries: OrderedDict[int, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        self._next = 0

    def clear(self, version: int | None = None) -> None:
        self.entries.clear()
        self.bytes = 0
        self.version = version

    def put(self, ids: torch.Tensor, kv: torch.Tensor, version: int) -> None:
        if version != self.version:
            self.clear(version)
        if kv.nbytes > self.max_bytes or len(ids) < 2:
            return
        self.entries[self._next] = (ids, kv)
        self._next += 1
        self.bytes += kv.nbytes
        while self.bytes > self.max_bytes:
            _, (_, old) = self.entries.popitem(last=False)
            self.bytes -= old.nbytes

    def lookup(self, ids: torch.Tensor, version: int) -> tuple[torch.Tensor | None, int]:
        """The stored KV sharing the longest head with ``ids``, and that head's length."""
        if version != self.version:
            self.clear(version)
        best, best_n, best_key = None, 0, None
        for key, (stored, kv) in self.entries.items():
            n = shared_head(stored, ids)
            if n > best_n:
                best, best_n, best_key = kv, n, key
        if best_key is not None:
            self.entries.move_to_end(best_key)
        return best, best_n


def shared_head(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading ids ``a`` and ``b`` have in common."""
    m = min(len(a), len(b))
    if m == 0 or a[0] != b[0]:
        return 0
    diff = (a[:m] != b[:m]).nonzero()
    return int(diff[0]) if len(diff) else m


class SlotLayer(PreallocatedLayer):
    """One layer's view of ``SlotBuffers``: a decode step over rows [0, n) writes row r's new key
    and value at column ``cols[r]`` and exposes the first ``length + 1`` columns (``prepare`` sets
    n, length and cols before each step)."""

    def prepare(self, n: int, length: int, cols: torch.Tensor) -> None:
        self._n, self._cols, self._row_ids = n, cols, torch.arange(n, device=cols.device)
        self.length = int(length)
        self._expose()

    def _expose(self) -> None:
        n = getattr(self, "_n", self._keys.shape[0])
        self.keys = self._keys[:n, :, : self.length]
        self.values = self._values[:n, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if key_states.shape[-2] != 1 or key_states.shape[0] != self._n:
            raise RuntimeError("slot rows take one token per row per step")
        self._keys[self._row_ids, :, self._cols] = key_states[:, :, 0]
        self._values[self._row_ids, :, self._cols] = value_states[:, :, 0]
        self.length += 1
        self._expose()
        return self.keys, self.values


class SlotBuffers:
    """The running rows' KV caches: ``kv`` [layers, 2, rows, kv_heads, columns, head_dim], row r's
    tokens at columns [0, its length). Allocated at the first row (dtype and device of that row's
    cache), grown when rows or columns run out, released by ``release``."""

    def __init__(self, config):
        self.config = config
        self.kv: torch.Tensor | None = None
        self.cache: PreallocatedCache | None = None
        self.reallocations = 0

    @property
    def rows(self) -> int:
        return 0 if self.kv is None else self.kv.shape[2]

    @property
    def columns(self) -> int:
        return 0 if self.kv is None else self.kv.shape[4]

    def release(self) -> None:
        self.kv = self.cache = None

    def reserve(self, rows: int, columns: int, like: torch.Tensor, live: list[int], max_rows: int) -> None:
        """At least ``rows`` rows of ``columns`` columns; the ``live`` rows' lengths kept (their
        rows [0, len(live)) copied over when the buffers grow). Growth is geometric (rows doubled up
        to ``max_rows``, columns by half again), so a stream of arrivals reallocates rarely."""
        if self.kv is not None and rows <= self.rows and columns <= self.columns:
            return
        if self.kv is None:
            new_rows, new_cols = rows, columns
        else:
            new_rows = rows if rows <= self.rows else min(max(rows, 2 * self.rows), max(rows, max_rows))
            new_cols = max(columns, self.columns) if columns <= self.columns else max(columns, self.columns * 3 // 2)
        layers, _, heads, _, dim = like.shape
        kv = like.new_zeros((layers, 2, max(new_rows, self.rows), heads, new_cols, dim))
        if self.kv is not None and live:
            width = max(live)
            kv[:, :, : len(live), :, :width] = self.kv[:, :, : len(live), :, :width]
            self.reallocations += 1
        self.kv = kv
        self.cache = PreallocatedCache(self.config, 1)
        self.cache.layers = [SlotLayer(new_cols) for _ in range(layers)]
        for li, layer in enumerate(self.cache.layers):
            layer.adopt(kv[li, 0], kv[li, 1], 0)

    def write(self, row: int, seq: torch.Tensor) -> None:
        """Row ``row`` holds ``seq`` ([layers, 2, kv_heads, n, head_dim]) at columns [0, n)."""
        self.kv[:, :, row, :, : seq.shape[3]] = seq

    def read(self, row: int, n: int) -> torch.Tensor:
        """A copy of row ``row``'s first ``n`` columns."""
        return self.kv[:, :, row, :, :n].clone()

    def move(self, src: int, dst: int, n: int) -> None:
        self.kv[:, :, dst, :, :n] = self.kv[:, :, src, :, :n]

    def decode_cache(self, n: int, lengths: torch.Tensor):
        """The cache for a decode step of rows [0, n), row r writing its token at column lengths[r]."""
        length = int(lengths.max())
        for layer in self.cache.layers:
            layer.prepare(n, length, lengths)
        return self.cache


def prefill_rows(model, pad_id: int, items: list[tuple[list[int], torch.Tensor | None, int]]):
    """One forward for several prompts, each on top of a cached head: ``items`` are (ids, the
    cached KV of ids[:a] or None, a). Returns each prompt's whole KV ([layers, 2, kv_heads, len(ids),
    head_dim]) and the logits of each one's next token [k, V].

    The heads are right-aligned to the longest head and the rest of each prompt is left-padded to
    the longest rest, so every prompt's last token is in the last column; padding is masked and
    never copied out. Positions are each token's own index in its prompt."""
    device = model_device(model)
    k = len(items)
    a_max = max(a for _, _, a in items)
    rests = [ids[a:] for ids, _, a in items]
    s_max = max(len(r) for r in rests)
    cache = PreallocatedCache(model.config, a_max + s_max)
    if a_max:
        like = next(kv for _, kv, a in items if a)
        heads = like.new_zeros((like.shape[0], 2, k, like.shape[2], a_max, like.shape[4]))
        for i, (_, kv, a) in enumerate(items):
            if a:
                heads[:, :, i, :, a_max - a :] = kv[:, :, :, :a]
        for li, layer in enumerate(cache.layers):
            layer.update(heads[li, 0], heads[li, 1])
    ids = torch.full((k, s_max), int(pad_id), dtype=torch.long)
    pos = torch.zeros((k, s_max), dtype=torch.long)
    mask = torch.zeros((k, a_max + s_max), dtype=torch.long)
    for i, (rest, (_, _, a)) in enumerate(zip(rests, items)):
        s = len(rest)
        ids[i, s_max - s :] = torch.tensor(rest, dtype=torch.long)
        pos[i, s_max - s :] = torch.arange(a, a + s)
        mask[i, a_max - a : a_max] = 1
        mask[i, a_max + s_max - s :] = 1
    padded = not bool(mask.all())
    logits = model(input_ids=ids.to(device), position_ids=pos.to(device), logits_to_keep=1,
                   attention_mask=mask.to(device) if padded else None, **cache_kwargs(model, cache)).logits[:, -1]
    keys = torch.stack([layer._keys for layer in cache.layers])  # [layers, k, kv_heads, columns, head_dim]
    values = torch.stack([layer._values for layer in cache.layers])
    width = a_max + s_max
    out = []
    for i, (rest, (ids_i, kv, a)) in enumerate(zip(rests, items)):
        s = len(rest)
        seq = keys.new_empty((keys.shape[0], 2, keys.shape[2], a + s, keys.shape[4]))
        if a:
            seq[:, :, :, :a] = kv[:, :, :, :a]
        seq[:, 0, :, a:] = keys[:, i, :, width - s :]
        seq[:, 1, :, a:] = values[:, i, :, width - s :]
        out.append(seq)
    return out, logits
