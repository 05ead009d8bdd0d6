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

    @property
    def num_groups(self) -> int:
        return int(self.group_index.max()) + 1 if len(self) else 0

    def select(self, rows: torch.Tensor) -> "RolloutBatch":
        """The given rows (whole groups, in order), with group ids renumbered 0..G'-1 and
        padding trimmed to the longest kept prompt and completion."""
        rows = rows.to(torch.long)
        _, group = torch.unique(self.group_index[rows], return_inverse=True)
        p_mask = self.prompt_mask[rows]
        c_mask = self.completion_mask[rows]
        pw = int(p_mask.sum(dim=1).max()) if len(rows) else 0
        cw = int(c_mask.sum(dim=1).max()) if len(rows) else 0
        p0 = self.prompt_ids.shape[1] - pw
        return RolloutBatch(
            prompt_ids=self.prompt_ids[rows, p0:], prompt_mask=p_mask[:, p0:],
            completion_ids=self.completion_ids[rows, :cw], completion_mask=c_mask[:, :cw],
            sampler_logprobs=self.sampler_logprobs[rows, :cw], truncated=self.truncated[rows],
            group_index=group, texts=[self.texts[i] for i in rows.tolist()] if self.texts else [],
        )


def concat_rollouts(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """One batch from several (e.g. the rounds of dynamic sampling): prompts re-left-padded and
    completions re-right-padded to the widest, group ids offset so they stay distinct."""
    if not batches:
        raise ValueError("concat_rollouts needs at least one batch")
    pw = max(b.prompt_ids.shape[1] for b in batches)
    cw = max(b.completion_ids.shape[1] for b in batches)

    def left(x: torch.Tensor, width: int, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x: torch.Tensor, width: int, value) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    groups, offset = [], 0
    for b in batches:
        groups.append(b.group_index + offset)
        offset += b.num_groups
    return RolloutBatch(
        prompt_ids=torch.cat([left(b.prompt_ids, pw, pad_id) for b in batches]),
        prompt_mask=torch.cat([left(b.prompt_mask, pw, False) for b in batches]),
        completion_ids=torch.cat([right(b.completion_ids, cw, pad_id) for b in batches]),
        completion_mask=torch.cat([right(b.completion_mask, cw, False) for b in batches]),
        sampler_logprobs=torch.cat([right(b.sampler_logprobs, cw, 0.0) for b in batches]),
        truncated=torch.cat([b.truncated for b in batches]),
        group_index=torch.cat(groups),
        texts=[t for b in batches for t in b.texts],
    )


@dataclass
class TrainBatch:
    """What the learner optimises on: a rollout plus the algorithm's inputs.

    rollout:          the RolloutBatch (see above).
    advantages:       [N] float32 (one per completion, broadcast over its tokens) or [N, T]
                      (token-level estimators: REINFORCE++, GAE).
    old_logprobs:     [N, T] float32 or None: log-probs of the policy that generated the batch,
                      as the learner computes them (no grad), for the importance ratio. None: the
                      batch is fresh, and the current log-probs (detached) stand in, saving a forward.
    ref_logprobs:     [N, T] float32 or None, reference-model log-probs for the KL loss term.
    loss_mask:        [N, T] bool or None: tokens that enter the loss (None: completion_mask).
                      Overlong filtering clears the rows of truncated completions.
    is_weights:       [N, T] float32 or None: truncated importance weights multiplying the
                      per-token policy loss (generator/learner mismatch correction).
    returns:          [N, T] float32 or None: the critic's regression targets (PPO).
    old_values:       [N, T] float32 or None: the critic's values at rollout time (value clipping).
    """

    rollout: RolloutBatch
    advantages: torch.Tensor
    old_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    loss_mask: torch.Tensor | None = None
    is_weights: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None

    @property
    def effective_loss_mask(self) -> torch.Tensor:
        return self.rollout.completion_mask if self.loss_mask is None else self.loss_mask

    def select(self, rows: torch.Tensor) -> "TrainBatch":
        """The given rows (whole groups), every [N, T] field trimmed like the rollout's."""
        rollout = self.rollout.select(rows)
        cw = rollout.completion_ids.shape[1]

        def cut(x: torch.Tensor | None) -> torch.Tensor | None:
            if x is None:
                return None
            x = x[rows]
            return x[:, :cw] if x.dim() == 2 else x

        return TrainBatch(
            rollout=rollout, advantages=cut(self.advantages), old_logprobs=cut(self.old_logprobs),
            ref_logprobs=cut(self.ref_logprobs), loss_mask=cut(self.loss_mask),
            is_weights=cut(self.is_weights), returns=cut(self.returns), old_values=cut(self.old_values),
        )
