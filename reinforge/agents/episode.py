"""A trajectory as the agent loop records it (``Episode``, one ``TurnRecord`` per model turn) and
the trainer's padded tensors of a batch of them (``pad_trajectories``), shared by the agent loop
(loop.py), the OpenAI-compatible endpoint (server.py) and the verifiers source, and the base of
their generators (``WrappedGenerator``: the trainer's batch of Episodes)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from reinforge.batch import RolloutBatch, Segment
from reinforge.rollout.hf import left_pad


@dataclass
class TurnRecord:
    """One model turn and what the environment answered. Spans index the trajectory's tokens after
    the prompt: the turn's sampled tokens are ``[start, end)``, the observation's ``[obs_start,
    obs_end)`` (equal when none was appended)."""

    start: int
    end: int
    text: str
    tool_calls: list[dict] = field(default_factory=list)
    observations: list[dict] = field(default_factory=list)
    obs_start: int = 0
    obs_end: int = 0
    reward: float = 0.0
    info: dict = field(default_factory=dict)


@dataclass
class Episode:
    """A whole trajectory as the environment and the model lived it.

    messages:    the opening messages (with the fallback tool prompt when used), then each
                 assistant turn and its observations, in order; ``tools``: the schemas given to the
                 template as ``tools=`` (empty with the fallback).
    token_ids:   every token after the prompt; ``action_mask`` True on the ones the model sampled
                 (the only ones trained on), ``logprobs`` their sampling log-probs (0 elsewhere).
    truncated:   a budget ended it (``truncation``: "max_turns", "max_tokens_per_turn", "max_tokens";
                 "env_error": the environment's step raised; "env": its own limit, StepResult.truncated).
    success:     the environment's verdict (the last ``info["success"]`` it gave), None if none.
    seat:        in a game of several seats (agents/seats.py), the seat this trajectory played.
    """

    example_id: str
    messages: list[dict]
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    action_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[TurnRecord] = field(default_factory=list)
    done: bool = False
    truncated: bool = False
    truncation: str | None = None
    env_error: str | None = None
    tools: list[dict] = field(default_factory=list)
    success: bool | None = None
    seat: int | None = None

    @property
    def final_text(self) -> str:
        """The last assistant turn's text (what the outcome verifiers score)."""
        return self.turns[-1].text if self.turns else ""

    def count(self, key: str) -> int:
        return int(sum(t.info.get(key, 0) for t in self.turns))

    @property
    def tool_calls(self) -> int:
        return self.count("tool_calls")

    @property
    def invalid_calls(self) -> int:
        return self.count("invalid_calls")

    @property
    def tool_errors(self) -> int:
        return self.count("tool_errors")

    def to_record(self, tokenizer=None) -> dict[str, Any]:
        """JSON-ready: messages, turns (text, parsed tool calls, tool results, observations,
        per-turn reward), and the token ids with the mask of those trained on."""
        turns = []
        for i, t in enumerate(self.turns):
            info = {k: v for k, v in t.info.items() if _jsonable(v)}
            turns.append({"turn": i, "text": t.text, "action_span": [t.start, t.end],
                          "observation_span": [t.obs_start, t.obs_end], "tool_calls": t.tool_calls,
                          "observations": t.observations, "reward": t.reward, "info": info})
        return {
            "example_id": self.example_id, "messages": self.messages, "tools": self.tools, "turns": turns,
            "num_turns": len(self.turns), "tool_calls": self.tool_calls, "invalid_calls": self.invalid_calls,
            "tool_errors": self.tool_errors, "done": self.done, "truncated": self.truncated,
            "truncation": self.truncation, "env_error": self.env_error, "success": self.success,
            **({"seat": self.seat} if self.seat is not None else {}),
            "prompt_ids": self.prompt_ids, "token_ids": self.token_ids,
            "trained_mask": [int(a) for a in self.action_mask],
            "logprobs": [round(x, 6) for x in self.logprobs],
        }


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def pad_trajectories(trajectories, pad_id: int) -> dict[str, torch.Tensor]:
    """RolloutBatch's tensors for rows with ``prompt_ids``, ``token_ids`` (everything after the
    prompt, appended turn by turn), ``action_mask`` and ``logprobs``: prompts left-padded, the
    rest right-padded; the agent loop and the OpenAI endpoint both build their batches here."""
    prompt_ids, prompt_mask = left_pad([t.prompt_ids for t in trajectories], pad_id)
    width = max((len(t.token_ids) for t in trajectories), default=0)
    n = len(trajectories)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    cmask = torch.zeros((n, width), dtype=torch.bool)
    amask = torch.zeros((n, width), dtype=torch.bool)
    lps = torch.zeros((n, width), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        k = len(t.token_ids)
        ids[i, :k] = torch.tensor(t.token_ids, dtype=torch.long)
        cmask[i, :k] = True
        amask[i, :k] = torch.tensor(t.action_mask, dtype=torch.bool)
        lps[i, :k] = torch.tensor(t.logprobs, dtype=torch.float32)
    return dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=cmask,
                action_mask=amask, sampler_logprobs=lps)


class WrappedGenerator:
    """A generator for the trainer that samples from examples through a wrapped ``HFGenerator``
    (``base``): the Generator protocol (``pad_id``, ``needs_sync``, ``version``, ``eos_ids``,
    ``sync_weights``) is the base's; ``pop_recorded`` hands out what ``generate_examples(...,
    record=True)`` kept in ``recorded``; ``_batch`` turns Episodes into the trainer's batch."""

    base: Any
    tokenizer: Any
    recorded: list

    @property
    def pad_id(self) -> int:
        return self.base.pad_id

    @property
    def needs_sync(self) -> bool:
        return self.base.needs_sync

    @property
    def version(self) -> int:
        return self.base.version

    @property
    def eos_ids(self):
        return self.base.eos_ids

    def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self.base.sync_weights(state_dict, version)

    def generate(self, prompts, params):  # pragma: no cover - a guard
        raise TypeError(f"{type(self).__name__} samples from examples (the environment renders the prompt): "
                        "call generate_examples(examples, params)")

    def pop_recorded(self) -> list:
        """What was recorded since the last call (``generate_examples(record=True)``)."""
        out, self.recorded = self.recorded, []
        return out

    def _batch(self, episodes: list, group_index: torch.Tensor) -> RolloutBatch:
        """The trainer's RolloutBatch of whole trajectories (Episodes): tensors from
        ``pad_trajectories``, one segment per assistant turn and per observation."""
        n = len(episodes)
        tensors = pad_trajectories(episodes, self.pad_id)
        segments = []
        for e in episodes:
            segs = []
            for t in e.turns:
                segs.append(Segment("assistant", t.start, t.end, t.text))
                if t.obs_end > t.obs_start:
                    role = t.observations[0].get("role", "environment") if t.observations else "environment"
                    segs.append(Segment(role, t.obs_start, t.obs_end,
                                        self.tokenizer.decode(e.token_ids[t.obs_start:t.obs_end])))
            segments.append(segs)
        texts = self.tokenizer.batch_decode([e.token_ids for e in episodes], skip_special_tokens=True)
        return RolloutBatch(
            **tensors, truncated=torch.tensor([e.truncated for e in episodes]),
            group_index=group_index, texts=texts,
            versions=torch.full((n,), self.version, dtype=torch.long), segments=segments,
        )
