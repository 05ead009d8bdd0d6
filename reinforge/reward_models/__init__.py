"""Reward models in the loop and made here: outcome RMs, process reward models, generative judges
and PRIME's implicit PRM as verifiers (``verifiers``), the reward-hacking guard (``guard``), and
``reinforge train-rm`` (``train``), which trains an outcome RM from verifier labels or a PRM from
Monte-Carlo step labels (Math-Shepherd) and measures it on held-out prompts."""

from reinforge.reward_models.guard import RewardHackingGuard
from reinforge.reward_models.steps import StepSplitter, token_ends

__all__ = ["RewardHackingGuard", "StepSplitter", "token_ends"]
