"""Sampling seeds that belong to a request, not to a process.

The HF generator draws tokens from torch's global RNG. Seeding that RNG per generation request,
from the run's seed and the request's key (the step it is for and its round), makes what is
sampled a function of the request alone: the same whether it runs in the trainer's process or in a
Ray rollout worker, after a worker restart, or after a resume. The global RNG outside the request
is left as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch


def request_seed(seed: int, *key: int) -> int:
    """A 63-bit seed from the run's seed and a request key of non-negative ints."""
    state = np.random.SeedSequence([seed % 2**32, *(int(k) for k in key)]).generate_state(2, dtype=np.uint32)
    return int(state[0]) << 31 | int(state[1]) >> 1


@contextmanager
def seeded_sampling(seed: int, *key: int) -> Iterator[None]:
    """Within the block, torch's global RNG (CPU and the current CUDA device) starts from
    ``request_seed(seed, *key)``; after it, the RNG is back where it was."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(request_seed(seed, *key))
        yield
