"""Reward models in the loop: outcome RMs, process reward models, generative judges and PRIME's
implicit PRM as verifiers (``verifiers``, from local folders read by ``scorer``), step splitting
(``steps``) and the reward-hacking guard (``guard``). ``reinforge train-rm``, which makes such
models, lives in ``reinforge.reward_models``."""

from reinforge.rewards.models.guard import RewardHackingGuard
from reinforge.rewards.models.scorer import (
    RM_META_FILE,
    ScalarHeadModel,
    load_tokenizer_for,
    render_prompt,
)
from reinforge.rewards.models.steps import StepSplitter, token_ends
from reinforge.rewards.models.verifiers import (
    AGGREGATES,
    ImplicitPRMVerifier,
    JudgeVerifier,
    OutcomeRMVerifier,
    ProcessRewardVerifier,
    aggregate_steps,
    build_reward_model_verifier,
)

__all__ = [
    "AGGREGATES",
    "RM_META_FILE",
    "ImplicitPRMVerifier",
    "JudgeVerifier",
    "OutcomeRMVerifier",
    "ProcessRewardVerifier",
    "RewardHackingGuard",
    "ScalarHeadModel",
    "StepSplitter",
    "aggregate_steps",
    "build_reward_model_verifier",
    "load_tokenizer_for",
    "render_prompt",
    "token_ends",
]
