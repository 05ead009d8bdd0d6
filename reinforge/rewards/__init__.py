"""Turning a completion into a score: answer extraction, verifiers, and their weighted
composition. Knows nothing of how the score is used."""

from reinforge.rewards._deadline import VerifierTimeout, call_with_deadline
from reinforge.rewards.compose import (
    CORRECTNESS_VERIFIERS,
    RewardFunction,
    RewardOutcome,
    Scores,
    build_reward,
    concat_scores,
)
from reinforge.rewards.registry import register_verifier
from reinforge.rewards.extract import ANSWER_FORMATS, extract_answer, is_well_formed
from reinforge.rewards.verifiers import (
    ExactMatchVerifier,
    FormatVerifier,
    MathVerifyVerifier,
    TaskVerifier,
    Verifier,
    VerifierResult,
)

__all__ = [
    "ANSWER_FORMATS",
    "CORRECTNESS_VERIFIERS",
    "ExactMatchVerifier",
    "FormatVerifier",
    "MathVerifyVerifier",
    "RewardFunction",
    "RewardOutcome",
    "Scores",
    "TaskVerifier",
    "Verifier",
    "VerifierResult",
    "VerifierTimeout",
    "build_reward",
    "concat_scores",
    "call_with_deadline",
    "extract_answer",
    "register_verifier",
    "is_well_formed",
]
