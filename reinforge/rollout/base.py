"""The generator interface: token prompts and sampling parameters in, tokens with their log-probs
out; weights in as a state dict with a version.

Weights arrive as tensors, never as a live module, so a generator may hold its own copy in another
dtype, on another device or in another process (a Ray worker, a vLLM engine), and every row it
samples records the version of the weights that sampled it: the learner can then tell how stale a
sample is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from ..batch import RolloutBatch


@dataclass
class SamplingParams:
    num_samples: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    greedy: bool = False

    @classmethod
    def from_rollout(cls, rollout) -> "SamplingParams":
        """The training samples' parameters, from the config's ``rollout`` section (the one place
        they are read, for this process and for Ray rollout workers alike)."""
        return cls(num_samples=rollout.num_samples, temperature=rollout.temperature, top_p=rollout.top_p,
                   max_new_tokens=rollout.max_new_tokens)


@runtime_checkable
class Generator(Protocol):
    """What the trainer, the evaluation and (next) agent loops and rollout workers use.

    pad_id:      the padding token id of the batches it returns.
    needs_sync:  True when it samples from weights of its own, which ``sync_weights`` refreshes;
                 False when it samples from the learner's live module (in-process, nothing to
                 copy: ``sync_weights`` then only records the version).
    version:     the weight version it samples with now; every row of ``generate`` records it.
    """

    pad_id: int
    needs_sync: bool
    version: int

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> RolloutBatch:
        """``params.num_samples`` completions for each token prompt; rows of one prompt are
        contiguous, ``versions`` is ``self.version`` for every row."""
        ...

    def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Load the policy's weights (Hugging Face names, LoRA merged: ``models.merged_state_dict``)
        and sample with them from now on, as ``version``."""
        ...

    def close(self) -> None:
        """Free what the generator holds (engine, copies, processes). Idempotent."""
        ...
