"""A KV cache for reinforge's decode loops that writes each step's keys and values in place.

transformers' ``DynamicCache`` grows every layer's keys and values with ``torch.cat`` at each
decode step: a fresh allocation and a copy of the whole cache per layer and token (11.8% of decode
with SmolLM2-135M on a 2-core CPU, more where large allocations page-fault). ``PreallocatedCache``
is a ``DynamicCache`` whose full-attention layers are ``PreallocatedLayer``: one buffer per layer,
[rows, kv_heads, capacity, head_dim], sized for the prompt and the tokens to come; each update
writes its tokens into the next free slots and attention reads a view of the filled length, so the
mask sizes and the values attention sees are the ones ``DynamicLayer`` gives. Other layer kinds
(sliding windows, linear attention) stay as ``DynamicCache`` builds them.
"""

from __future__ import annotations

import functools

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer over buffers of ``capacity`` slots, allocated at the first
    update; past the capacity (an agent's observations) the buffers double."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = int(capacity)
        self.length = 0
        self._keys: torch.Tensor | None = None
        self._values: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        capacity = max(self.capacity, key_states.shape[-2])
        self._keys = key_states.new_empty((*key_states.shape[:2], capacity, key_states.shape[-1]))
        self._values = value_states.new_empty((*value_states.shape[:2], capacity, value_states.shape[-1]))
        self.length = 0
        self._expose()
        self.is_initialized = True

    def _expose(self) -> None:
        self.keys = self._keys[:, :, : self.length]
        self.values = self._values[:, :, : self.length]

    def _resized(self, buffer: torch.Tensor, rows: int, capacity: int) -> torch.Tensor:
        return buffer.new_empty((rows, buffer.shape[1], capacity, buffer.shape[3]))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._keys.shape[2]:
            capacity = max(end, 2 * self._keys.shape[2])
            for name in ("_keys", "_values"):
                old = getattr(self, name)
                new = self._resized(old, old.shape[0], capacity)
                new[:, :, : self.length] = old[:, :, : self.length]
                setattr(self, name, new)
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Make ``keys`` and ``values`` ([rows, kv_heads, capacity, head_dim]) this layer's buffers,
        their first ``length`` slots filled (the batching engine assembles rows of different
        caches into one batch this way)."""
        self.device = keys.device
        self._keys, self._values, self.length = keys, values, int(length)
        self.is_initialized = True
        self._expose()

    def get_max_length(self) -> int:
        return -1  # (it grows past its capacity when it must)

    def overwrite(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Make ``keys`` and ``values`` (same rows) the whole cached content, in the same buffers."""
        self.length = 0
        self.update(keys, values)

    def reset(self) -> None:
        self._keys = self._values = None
        self.length = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes the negative number of tokens to remove")
        if self.is_initialized:
            self.length = max(0, self.length + tokens_to_remove)
            self._expose()

    def batch_repeat_interleave(self, repeats: int) -> None:
        if not self.is_initialized:
            return
        rows, n = self._keys.shape[0], self.length
        for name in ("_keys", "_values"):
            old = getattr(self, name)
            new = self._resized(old, rows * repeats, old.shape[2])
            # One copy of the filled slots, each row written to its ``repeats`` consecutive rows.
            new[:, :, :n].unflatten(0, (rows, repeats)).copy_(old[:, None, :, :n])
            setattr(self, name, new)
        self._expose()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if not self.is_initialized:
            return
        indices = indices.to(self._keys.device)
        # Whole rows (free slots too): one gather, and the free slots are the steps still to come.
        self._keys = self._keys.index_select(0, indices)
        self._values = self._values.index_select(0, indices)
        self._expose()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx)


class PreallocatedCache(DynamicCache):
    """``DynamicCache(config=config)`` with its full-attention layers preallocated for
    ``capacity`` tokens per row (prompt and new tokens)."""

    def __init__(self, config, capacity: int):
        super().__init__(config=config)
        self.capacity = int(capacity)
        if self.layer_class_to_replicate is not None:  # layers made as they are first used
            self.layer_class_to_replicate = functools.partial(PreallocatedLayer, self.capacity)
        self.layers = [PreallocatedLayer(self.capacity) if type(layer) is DynamicLayer else layer
                       for layer in self.layers]


def merge_rows(cache: DynamicCache, attn: torch.Tensor, other: DynamicCache, other_attn: torch.Tensor) -> torch.Tensor:
    """Append ``other``'s rows to ``cache`` (in place) and return the merged attention mask: both
    are left-padded with masked, zero-filled slots to the wider one's length (cached keys carry
    their rotary positions, so a row's real slots need not line up with another's). Used when rows
    join a decode batch late (agents/loop.py: a seat whose first turn comes after another seat's
    move). Full-attention ``PreallocatedLayer`` caches only."""
    la_len, lb_len = attn.shape[1], other_attn.shape[1]
    width = max(la_len, lb_len)
    for a, b in zip(cache.layers, other.layers, strict=True):
        if not (isinstance(a, PreallocatedLayer) and isinstance(b, PreallocatedLayer)):
            raise TypeError("rows can join a running decode batch only with full-attention layers "
                            f"(got {type(a).__name__}): games of several seats need such a model")
        capacity = max(a._keys.shape[2], b._keys.shape[2], width)
        merged = []
        for x, y in ((a._keys, b._keys), (a._values, b._values)):
            buf = x.new_zeros((x.shape[0] + y.shape[0], x.shape[1], capacity, x.shape[3]))
            buf[: x.shape[0], :, width - la_len : width] = x[:, :, :la_len]
            buf[x.shape[0]:, :, width - lb_len : width] = y[:, :, :lb_len]
            merged.append(buf)
        a.adopt(merged[0], merged[1], width)
    pad = torch.nn.functional.pad
    return torch.cat([pad(attn, (width - la_len, 0)), pad(other_attn, (width - lb_len, 0))])
