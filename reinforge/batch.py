"""The typed objects that cross part boundaries.

Shapes use N = number of trajectories in the batch (prompts x samples per prompt),
P = longest prompt, T = longest continuation after the prompt. Prompts are LEFT-padded,
continuations RIGHT-padded, so ``cat([prompt_ids, completion_ids], dim=1)`` puts every
continuation right after its prompt.

A row is a trajectory: the prompt, then everything that followed it. In a single-turn completion
every token after the prompt was written by the model. In a multi-turn trajectory the model's
turns are interleaved with tokens it did not write (tool output, environment messages), which are
context for the next turn but are never trained on. Two masks say which is which:

- ``completion_mask`` (the attention mask after the prompt): True on every real token, model's or
  not. It is a contiguous prefix of each row (padding only at the right).
- ``action_mask``: True on the tokens the model sampled. A subset of ``completion_mask`` that may
  have holes. Losses, log-prob ratios, KL and entropy terms, advantages and token rewards live on
  it; nothing may assume it is a prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class Segment:
    """A span of one row's tokens after the prompt, ``[start, end)``: who wrote it (``role``:
    "assistant" for the model's own tokens, "tool"/"user"/"environment" for observations) and its
    text. Single-turn rows have one assistant segment."""

    role: str
    start: int
    end: int
    text: str = ""


@dataclass(frozen=True)
class Trajectory:
    """One row of a RolloutBatch as a reward sees it: the prompt's tokens, every token after it
    (``token_ids``), which of them the model wrote (``action_mask``), the decoded text, its
    segments and whether it was cut at the token budget. Token positions index ``token_ids``."""

    prompt_ids: list[int]
    token_ids: list[int]
    action_mask: list[bool]
    text: str
    segments: list[Segment]
    truncated: bool

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass
class RolloutBatch:
    """What the experience source returns for one batch of prompts.

    prompt_ids:        [N, P] long, left-padded with the pad id.
    prompt_mask:       [N, P] bool, True on real prompt tokens.
    completion_ids:    [N, T] long, right-padded with the pad id: every token after the prompt.
                       Includes the stop token when a turn stopped (EOS), so the model learns to stop.
    completion_mask:   [N, T] bool, True on real tokens (model's or observation), a prefix per row.
    action_mask:       [N, T] bool, True on the tokens the model sampled (trained on); None at
                       construction means every real token is an action (single turn).
    sampler_logprobs:  [N, T] float32, log-prob of each sampled token under the sampling policy
                       (after temperature); 0 wherever ``action_mask`` is False.
    truncated:         [N] bool, True when the row hit its token budget without stopping.
    group_index:       [N] long, index of the prompt (0..num_prompts-1) each row belongs to.
                       Rows of a group are contiguous.
    texts:             N decoded continuations (special tokens stripped).
    versions:          [N] long, the policy weight version that sampled each row (the
                       generator's version when it ran; 0 = the initial weights).
    last_versions:     [N] long, the version that sampled each row's last token: newer than
                       ``versions`` when the weights changed during its generation
                       (``rollout.partial``); equal to it otherwise.
    segments:          per row, its Segments in order (empty: one assistant span, single turn).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    sampler_logprobs: torch.Tensor
    truncated: torch.Tensor
    group_index: torch.Tensor
    texts: list[str] = field(default_factory=list)
    action_mask: torch.Tensor | None = None
    versions: torch.Tensor | None = None
    segments: list[list[Segment]] = field(default_factory=list)
    last_versions: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.action_mask is None:
            self.action_mask = self.completion_mask.clone()
        elif bool((self.action_mask & ~self.completion_mask).any()):
            raise ValueError("action_mask marks tokens that completion_mask does not: every action is a real token")
        if self.versions is None:
            self.versions = torch.zeros(self.completion_ids.shape[0], dtype=torch.long)
        if self.last_versions is None:
            self.last_versions = self.versions.clone()

    def __len__(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def action_lengths(self) -> torch.Tensor:
        """[N] tokens the model wrote in each row."""
        return self.action_mask.sum(dim=1)

    @property
    def num_groups(self) -> int:
        return int(self.group_index.max()) + 1 if len(self) else 0

    def trajectory(self, i: int) -> Trajectory:
        """Row ``i`` without padding, as lists (what trajectory-aware rewards receive)."""
        n = int(self.completion_mask[i].sum())
        return Trajectory(
            prompt_ids=self.prompt_ids[i][self.prompt_mask[i]].tolist(),
            token_ids=self.completion_ids[i, :n].tolist(),
            action_mask=self.action_mask[i, :n].tolist(),
            text=self.texts[i] if self.texts else "",
            segments=list(self.segments[i]) if self.segments else [Segment("assistant", 0, n, self.texts[i] if self.texts else "")],
            truncated=bool(self.truncated[i]),
        )

    def select(self, rows: torch.Tensor) -> "RolloutBatch":
        """The given rows (whole groups, in order), with group ids renumbered 0..G'-1 and
        padding trimmed to the longest kept prompt and continuation."""
        rows = rows.to(torch.long)
        _, group = torch.unique(self.group_index[rows], return_inverse=True)
        p_mask = self.prompt_mask[rows]
        c_mask = self.completion_mask[rows]
        pw = int(p_mask.sum(dim=1).max()) if len(rows) else 0
        cw = int(c_mask.sum(dim=1).max()) if len(rows) else 0
        p0 = self.prompt_ids.shape[1] - pw
        picked = rows.tolist()
        return RolloutBatch(
            prompt_ids=self.prompt_ids[rows, p0:], prompt_mask=p_mask[:, p0:],
            completion_ids=self.completion_ids[rows, :cw], completion_mask=c_mask[:, :cw],
            action_mask=self.action_mask[rows, :cw],
            sampler_logprobs=self.sampler_logprobs[rows, :cw], truncated=self.truncated[rows],
            group_index=group, texts=[self.texts[i] for i in picked] if self.texts else [],
            versions=self.versions[rows], last_versions=self.last_versions[rows],
            segments=[self.segments[i] for i in picked] if self.segments else [],
        )


def concat_rollouts(batches: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """One batch from several (e.g. the rounds of dynamic sampling): prompts re-left-padded and
    continuations re-right-padded to the widest, group ids offset so they stay distinct."""
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
    with_segments = any(b.segments for b in batches)
    return RolloutBatch(
        prompt_ids=torch.cat([left(b.prompt_ids, pw, pad_id) for b in batches]),
        prompt_mask=torch.cat([left(b.prompt_mask, pw, False) for b in batches]),
        completion_ids=torch.cat([right(b.completion_ids, cw, pad_id) for b in batches]),
        completion_mask=torch.cat([right(b.completion_mask, cw, False) for b in batches]),
        action_mask=torch.cat([right(b.action_mask, cw, False) for b in batches]),
        sampler_logprobs=torch.cat([right(b.sampler_logprobs, cw, 0.0) for b in batches]),
        truncated=torch.cat([b.truncated for b in batches]),
        group_index=torch.cat(groups),
        texts=[t for b in batches for t in b.texts],
        versions=torch.cat([b.versions for b in batches]),
        last_versions=torch.cat([b.last_versions for b in batches]),
        segments=[s for b in batches for s in (b.segments or [[] for _ in range(len(b))])] if with_segments else [],
    )


@dataclass
class TrainBatch:
    """What the learner optimises on: a rollout plus the algorithm's inputs.

    rollout:          the RolloutBatch (see above).
    advantages:       [N] float32 (one per row, broadcast over its action tokens) or [N, T]
                      (token-level estimators: REINFORCE++, GAE).
    old_logprobs:     [N, T] float32 or None: log-probs of the policy that generated the batch,
                      as the learner computes them (no grad), for the importance ratio. None: the
                      batch is fresh, and the current log-probs (detached) stand in, saving a forward.
    ref_logprobs:     [N, T] float32 or None, reference-model log-probs for the KL loss term.
    loss_mask:        [N, T] bool or None: tokens that enter the loss (None: the action mask).
                      Overlong filtering clears the rows of truncated completions. Always a
                      subset of the action mask.
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
        actions = self.rollout.action_mask
        return actions if self.loss_mask is None else self.loss_mask & actions

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
