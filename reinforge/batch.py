"""The typed objects that cross part boundaries.

Shapes use N = number of completions in the batch (prompts x samples per prompt),
P = longest prompt, T = longest completion. Prompts are LEFT-padded, completions RIGHT-padded,
so ``cat([prompt_ids, completion_ids], dim=1)`` puts every completion right after its prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RolloutBatch:
    """What the rollout returns for one batch of prompts.

    prompt_ids:        [N, P] long, left-padded with the pad id.
    prompt_mask:       [N, P] bool, True on real prompt tokens.
    completion_ids:    [N, T] long, right-padded with the pad id. Includes the stop token when the
                       completion stopped (EOS), so the model learns to stop.
    completion_mask:   [N, T] bool, True on generated tokens (the stop token included).
    sampler_logprobs:  [N, T] float32, log-prob of each sampled token under the sampling policy
                       (after temperature); 0 on padding.
    truncated:         [N] bool, True when the completion hit max_new_tokens without stopping.
    group_index:       [N] long, index of the prompt (0..num_prompts-1) each completion belongs to.
                       Rows of a group are contiguous.
    texts:             N decoded completions (special tokens stripped).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    truncated: torch.Tensor
    group_index: torch.Tensor
    texts: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def completion_lengths(self) -> torch.Tensor:
        return self.completion_mask.sum(dim=1)


@dataclass
class TrainBatch:
    """What the learner optimises on: a rollout plus the algorithm's per-sequence inputs.

    rollout:          the RolloutBatch (see above).
    advantages:       [N] float32, one advantage per completion (broadcast over its tokens).
    old_logprobs:     [N, T] float32, log-probs of the policy that generated the batch, as the
                      learner computes them (no grad). Used for the importance ratio.
    ref_logprobs:     [N, T] float32 or None, reference-model log-probs for the KL term.
    """

    rollout: RolloutBatch
    advantages: torch.Tensor
    old_logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None = None
