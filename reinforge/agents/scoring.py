"""Rewards over trajectories, the agent metrics of a step, and the trajectory files of a run.

A trajectory's reward (docs/agents.md):

- the outcome: ``reward.verifiers`` on the final assistant turn's text (the answer), as for a
  single-turn completion;
- per-turn rewards ``r_t`` (what ``Env.step`` returned), discounted per turn by
  ``env.turn_discount`` (gamma): the return from turn t is ``G_t = r_t + gamma * G_{t+1}``, the
  outcome counting as part of the last turn's reward. ``env.turn_rewards``:
  "sum": the scalar reward is ``G_0`` (for sequence-level estimators: GRPO, RLOO, ...);
  "tokens": the outcome stays the scalar (on the last action token) and each turn gets a token
  reward on its last action token, chosen so that the undiscounted returns-to-go of the token-level
  estimators (REINFORCE++, GAE with algorithm.gamma=1) equal ``G_t`` on turn t's tokens:
  ``x_t = r_t - (1 - gamma) * G_{t+1}``;
- a truncated trajectory (a budget ended it) is not correct, and with ``env.truncated_reward`` set
  its whole reward is that value (and its turn rewards 0); an episode the environment itself cut
  short (truncation "env") keeps the environment's rewards, and is not correct either;
- correct: the environment's own verdict (``Episode.success``, from ``info["success"]``) when it
  gave one, else the outcome verifiers'. This is held-out accuracy for environments such as games.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from reinforge.agents.reward_checks import RewardChecks
from reinforge.rewards.compose import RewardFunction, RewardOutcome, Scores


def turn_returns(turn_rewards: Sequence[float], outcome: float, gamma: float) -> list[float]:
    """``G_t`` for every turn: ``r_t + gamma * G_{t+1}``, the outcome added to the last turn."""
    g, out = 0.0, []
    rs = list(turn_rewards)
    if not rs:
        return []
    rs[-1] += outcome
    for r in reversed(rs):
        g = r + gamma * g
        out.append(g)
    return out[::-1]


class WrappedReward:
    """A trajectory reward around the run's ``RewardFunction`` (``reward_fn``): its error count,
    reward-model keys and state are the wrapped function's; nothing learns from agent rollouts
    (an implicit PRM stays fixed in agent runs)."""

    reward_fn: RewardFunction

    @property
    def error_count(self) -> int:
        return self.reward_fn.error_count

    @property
    def reward_model_keys(self):
        return self.reward_fn.reward_model_keys

    def learn(self, rollout, examples, outcomes) -> None:
        pass

    def state_dict(self):
        return self.reward_fn.state_dict()

    def load_state_dict(self, state) -> None:
        self.reward_fn.load_state_dict(state)


class AgentReward(WrappedReward):
    """Scores agent rollouts (their ``episodes``) with a ``RewardFunction`` on the final answers
    plus the environment's per-turn rewards; the same interface as RewardFunction.score."""

    def __init__(self, reward_fn: RewardFunction, *, turn_rewards: str = "sum", turn_discount: float = 1.0,
                 truncated_reward: float | None = None):
        if turn_rewards not in ("sum", "tokens"):
            raise ValueError(f"env.turn_rewards={turn_rewards!r}; accepted: sum, tokens")
        self.reward_fn = reward_fn
        self.turn_rewards = turn_rewards
        self.gamma = float(turn_discount)
        self.truncated_reward = truncated_reward
        self.checks = RewardChecks(truncated_reward)  # warnings the first trajectories reveal

    def score(self, rollout, examples: Sequence) -> Scores:
        episodes = getattr(rollout, "episodes", None)
        if episodes is None or len(episodes) != len(rollout):
            raise ValueError("agent rewards score rollouts from AgentGenerator.generate_examples (rows with episodes)")
        trajectories = [rollout.trajectory(i) for i in range(len(rollout))]
        outcomes = self.reward_fn([e.final_text for e in episodes], examples, trajectories)
        self.checks.observe(episodes, outcomes, self.reward_fn)
        rewards = torch.zeros(len(rollout), dtype=torch.float32)
        token = torch.zeros(rollout.completion_ids.shape, dtype=torch.float32) if self.turn_rewards == "tokens" else None
        final: list[RewardOutcome] = []
        for i, (ep, o) in enumerate(zip(episodes, outcomes)):
            per_turn = [t.reward for t in ep.turns]
            if ep.success is not None:  # the environment's verdict, not the verifiers', says correct
                o = dataclasses.replace(o, correct=bool(ep.success))
            if ep.truncated and ep.truncation != "env" and self.truncated_reward is not None:
                rewards[i] = self.truncated_reward
                o = RewardOutcome(self.truncated_reward, False, {**o.components, "env": 0.0}, o.errors)
            elif self.turn_rewards == "sum":
                g0 = turn_returns(per_turn, o.reward, self.gamma)
                rewards[i] = g0[0] if g0 else o.reward
                o = RewardOutcome(float(rewards[i]), o.correct and not ep.truncated,
                                  {**o.components, "env": float(rewards[i]) - o.reward}, o.errors)
            else:
                rewards[i] = o.reward
                returns = turn_returns(per_turn, o.reward, self.gamma)
                for t, turn in enumerate(ep.turns):
                    if turn.end > turn.start:
                        last = t + 1 == len(ep.turns)
                        x = per_turn[t] if last else per_turn[t] - (1.0 - self.gamma) * returns[t + 1]
                        token[i, turn.end - 1] += x
                o = RewardOutcome(o.reward, o.correct and not ep.truncated,
                                  {**o.components, "env": float(sum(per_turn))}, o.errors)
            final.append(o)
        shaping = self.reward_fn.shaping
        shaped = rewards if shaping is None else rewards + shaping(rollout.action_lengths)
        if token is not None:
            token = token.masked_fill(~rollout.action_mask, 0.0)
        return Scores(outcomes=final, rewards=rewards, shaped=shaped, token_rewards=token)


def agent_metrics(episodes: Sequence) -> dict[str, float]:
    """A step's agent metrics: turns and tool calls per trajectory, the valid-call rate (calls
    that parsed, named a tool and fit its signature; absent when no call was made), tool errors
    (raised or timed out), environment errors, and how trajectories were truncated."""
    if not episodes:
        return {}
    calls = sum(e.tool_calls for e in episodes)
    invalid = sum(e.invalid_calls for e in episodes)
    out = {
        "agent/turns": float(np.mean([len(e.turns) for e in episodes])),
        "agent/tool_calls": float(np.mean([e.tool_calls for e in episodes])),
        "agent/tool_calls_total": float(calls),
        "agent/invalid_calls": float(invalid),
        "agent/tool_errors": float(sum(e.tool_errors for e in episodes)),
        "agent/env_errors": float(sum(e.env_error is not None for e in episodes)),
        "agent/done_frac": float(np.mean([e.done for e in episodes])),
        "agent/trajectory_tokens": float(np.mean([len(e.token_ids) for e in episodes])),
    }
    if calls:
        out["agent/valid_call_rate"] = 1.0 - invalid / calls
    for why in ("max_turns", "max_tokens_per_turn", "max_tokens", "env_error", "env"):
        out[f"agent/truncated_{why}"] = float(np.mean([e.truncation == why for e in episodes]))
    verdicts = [e.success for e in episodes if e.success is not None]
    if verdicts:  # the environment's own verdicts (games): the success rate over those that gave one
        out["agent/success"] = float(np.mean(verdicts))
    return out


def write_trajectories(path: Path, records: Sequence[dict]) -> None:
    """One JSON line per trajectory, written to a temporary name and renamed (a re-run step after a
    resume replaces its file)."""
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        for r in records:
            f.write(json.dumps(r, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
