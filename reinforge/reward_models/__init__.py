"""``reinforge train-rm`` (``train``; its config in ``config``, its held-out measurement in
``metrics``), which trains an outcome RM from verifier labels or a PRM from Monte-Carlo step labels
(Math-Shepherd) and measures it on held-out prompts. The reward models in the loop (outcome RMs,
PRMs, generative judges, PRIME's implicit PRM as verifiers) and the reward-hacking guard live in
``reinforge.rewards.models``; the names below are re-exported from there."""

from reinforge.rewards.models.guard import RewardHackingGuard
from reinforge.rewards.models.steps import StepSplitter, token_ends

__all__ = ["RewardHackingGuard", "StepSplitter", "token_ends"]
