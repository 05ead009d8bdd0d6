"""Environments: the gym-like interface over chat messages and the common tool-using case (the
registry through which a config names an environment is agents/registry.py).

    env = ToolEnv(tools=[add, multiply], max_turns=4)
    messages = env.reset(example)                      # what the model sees first
    observations, reward, done, info = env.step({"role": "assistant", "content": text})

An environment instance holds one trajectory's state: the agent loop makes a fresh one per
trajectory (from the registered factory) and calls ``step`` from a worker thread, so the steps of
a batch's trajectories run concurrently; an instance is never stepped by two threads at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from reinforge.agents.tools import Tool, ToolExecutor, parse_tool_calls
from reinforge.tasks.base import Example

# Failure kinds of a tool call (tools.ToolResult.error) that are the model's fault: the call was
# not a valid call. The others ("raised", "timeout") are the tool's.
INVALID_CALL_KINDS = frozenset({"malformed", "unknown_tool", "bad_arguments"})


@dataclass
class StepResult:
    """What ``Env.step`` returns (it unpacks as the 4-tuple).

    observations: messages appended after the model's turn (tool results, the environment's reply);
                  empty when ``done``.
    reward:       this turn's reward (per-turn rewards; the outcome is usually scored from the
                  final answer by ``reward.verifiers``).
    done:         the episode is over (the model gave its final answer, won, or lost).
    info:         anything to record; the agent loop counts ``tool_calls``, ``invalid_calls`` and
                  ``tool_errors`` and keeps ``tool_results`` in the trajectory file; ``"success"``
                  (a bool) is the environment's verdict on the episode (held-out "correct").
    truncated:    with ``done``: the environment cut the episode short (a time limit), so it is
                  truncated, not finished (gymnasium's ``truncated``); not a success.
    """

    observations: list[dict]
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    truncated: bool = False

    def __iter__(self):
        return iter((self.observations, self.reward, self.done, self.info))


@runtime_checkable
class Env(Protocol):
    """An environment over chat messages. ``tools``: JSON schemas shown to the model (through the
    chat template's ``tools=``, or the fallback format); ``max_turns``: its own turn limit or None
    (the config's ``env.max_turns`` applies too; the smaller wins)."""

    tools: list[dict]
    max_turns: int | None

    def reset(self, example: Example) -> list[dict]:
        """The opening messages (system, user) for ``example``."""
        ...

    def step(self, message: dict) -> StepResult | tuple[list[dict], float, bool, dict]:
        """React to the model's turn ``{"role": "assistant", "content": text}``."""
        ...


class ToolEnv:
    """Answer the task, calling tools as needed: each turn's tool calls are run and their results
    are the next observation (one ``tool`` message per call); a turn without a tool call is the
    final answer and ends the episode.

    tools:              functions (with type hints and docstrings) or ``Tool`` objects.
    max_turns:          model turns at most (the last must be the answer; None: the config's).
    timeout_s:          each tool call's time limit.
    max_output_chars:   tool output longer than this is cut, with a visible marker.
    max_calls_per_turn: calls beyond this in one turn are not run; the model is told so.
    """

    def __init__(self, tools: Sequence[Tool | Callable[..., Any]], *, max_turns: int | None = None,
                 timeout_s: float | None = 10.0, max_output_chars: int | None = 2000,
                 max_calls_per_turn: int = 4):
        self.executor = ToolExecutor(tools, timeout_s=timeout_s, max_output_chars=max_output_chars)
        self.tools = self.executor.schemas
        self.max_turns = max_turns
        self.max_calls_per_turn = max_calls_per_turn
        self.example: Example | None = None

    def reset(self, example: Example) -> list[dict]:
        self.example = example
        return [dict(m) for m in example.messages]

    def step(self, message: dict) -> StepResult:
        calls = parse_tool_calls(str(message.get("content", "")))
        if not calls:
            return StepResult([], 0.0, True, {"final": True})
        results = [self.executor.run(c) for c in calls[: self.max_calls_per_turn]]
        observations = [{"role": "tool", "name": r.name or "", "content": r.content} for r in results]
        skipped = len(calls) - len(results)
        if skipped:
            observations[-1]["content"] += (f"\n(Only {self.max_calls_per_turn} tool calls are run per turn; "
                                            f"{skipped} more were ignored.)")
        return StepResult(observations, 0.0, False, {
            "tool_calls": len(calls),
            "invalid_calls": sum(r.error in INVALID_CALL_KINDS for r in results) + skipped,
            "tool_errors": sum(r.error is not None and r.error not in INVALID_CALL_KINDS for r in results),
            "tool_results": [r.to_dict() for r in results],
        })


def as_step_result(value) -> StepResult:
    """An env's ``step`` return value as a StepResult (a 4-tuple is accepted). A reward that is
    not a finite number is refused: the caller counts it as this episode's environment error
    rather than letting a NaN or inf reach the advantages of the whole group."""
    if isinstance(value, StepResult):
        _reward(value.reward)
        return value
    try:
        observations, reward, done, info = value
    except (TypeError, ValueError):
        raise TypeError(
            f"Env.step must return a StepResult or (observations, reward, done, info); got {type(value).__name__}"
        ) from None
    return StepResult(list(observations or []), _reward(reward), bool(done), dict(info or {}))


def _reward(reward) -> float:
    try:
        r = float(reward)
    except (TypeError, ValueError):
        raise TypeError(f"Env.step returned the reward {reward!r} ({type(reward).__name__}); it must be a "
                        "number") from None
    if not math.isfinite(r):
        raise ValueError(f"Env.step returned the reward {r!r}; it must be a finite number")
    return r
