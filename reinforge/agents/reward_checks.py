"""Warnings about an agent run's reward that only the first trajectories can reveal, each given
once per run with the numbers seen and the key to set (docs/agents.md):

- **rambling pays**: a trajectory the token budget cuts earns ``env.truncated_reward`` (unset: 0
  for the cut turn, keeping what it earned before), while the environment's own rewards for a
  failure go lower (GEM's format error: -0.1). A group-relative estimator then prefers writing
  to the token cap over answering badly.
- **success counted twice**: the environment rewarded an episode's success and an outcome
  verifier in ``reward.verifiers`` rewarded the same final answer too.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

logger = logging.getLogger("reinforge.agents")


class RewardChecks:
    """Reads each scored batch of episodes until each warning was given (or cannot apply)."""

    def __init__(self, truncated_reward: float | None):
        self.truncated_reward = truncated_reward
        self.warned: set[str] = set()

    def observe(self, episodes: Sequence, outcomes: Sequence, reward_fn) -> None:
        """``outcomes``: the outcome verifiers' RewardOutcome per episode (before the environment's
        rewards are added); ``reward_fn``: the run's RewardFunction (its verifiers and weights)."""
        if "rambling" not in self.warned:
            returns = [o.reward + sum(t.reward for t in ep.turns) for ep, o in zip(episodes, outcomes)]
            self._rambling(episodes, returns)
        if "twice" not in self.warned:
            self._twice(episodes, outcomes, reward_fn)

    def _rambling(self, episodes: Sequence, returns: Sequence[float]) -> None:
        cut = self.truncated_reward
        if cut is None:  # the cut turn earns 0; compare with the environment's reward for one turn
            turns = [t.reward for ep in episodes for t in ep.turns]
            worse = [r for r in turns if r < 0.0]
            if not worse:
                return
            self.warned.add("rambling")
            logger.warning(
                "env.truncated_reward is unset: a turn the token budget cuts earns 0, while the environment gave "
                "%d of %d turns a reward below that (as low as %g), so writing to the token cap pays more than "
                "the environment's failures; set env.truncated_reward at or below %g (e.g. env.truncated_reward=%g)",
                len(worse), len(turns), min(worse), min(worse), min(worse))
            return
        ended = [float(r) for ep, r in zip(episodes, returns) if not ep.truncated]
        worse = [r for r in ended if r < cut]
        if not worse:
            return
        self.warned.add("rambling")
        logger.warning(
            "env.truncated_reward=%g: a trajectory the token budget cuts earns more than %d of %d episodes the "
            "environment ended (as low as %g), so writing to the token cap pays more than those failures; set "
            "env.truncated_reward at or below %g", cut, len(worse), len(ended), min(worse), min(worse))

    def _twice(self, episodes: Sequence, outcomes: Sequence, reward_fn) -> None:
        # (key, weight) of the outcome verifiers whose verdict counts as correct and whose score is in the reward
        entries = [(k, w) for k, _, w, is_correct in getattr(reward_fn, "_entries", []) if is_correct and w != 0]
        both: dict[str, list[float]] = {}
        env_rewards: list[float] = []
        for ep, o in zip(episodes, outcomes):
            if ep.truncated or not ep.turns or not o.correct:
                continue
            env_success = ep.turns[-1].reward
            if env_success <= 0:
                continue
            named = [(k, o.components.get(k, 0.0)) for k, _ in entries if o.components.get(k, 0.0) > 0]
            if named:
                env_rewards.append(env_success)
                for k, score in named:
                    both.setdefault(k, []).append(score)
        if not both:
            return
        self.warned.add("twice")
        names = ", ".join(f"{k!r} (score {max(v):g})" for k, v in both.items())
        key = next(iter(both))
        base, _, n = key.rpartition("_")
        first = base if n.isdigit() and base else key  # "task_2" is the second 'task' verifier
        logger.warning(
            "success is rewarded twice in %d of %d trajectories: the environment's own reward on the final turn "
            "(up to %g) and the outcome verifier %s in reward.verifiers; keep one: give the verifier weight 0 "
            "(e.g. reward.verifiers=[{name: %s, weight: 0}], which keeps it measuring accuracy), or have the "
            "environment not reward success", len(env_rewards), len(episodes), max(env_rewards), names, first)
