"""Pure tensor functions of RL post-training: advantage estimators, policy losses, KL and entropy
terms and loss aggregation. Imports only torch, like verl's ``core_algos.py``: a recipe from a
paper is a composition of these functions, and a new one is a small addition here.
"""

from reinforge.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    SCALE_MODES,
    compute_advantages,
    gae_advantages,
    greedy_baseline_advantages,
    group_normalized_advantages,
    informative_groups,
    leave_one_out_advantages,
    masked_whiten,
    passk_advantages,
    reinforce_pp_advantages,
    token_level_rewards,
)
from reinforge.algorithms.aggregation import LOSS_AGG_MODES, aggregate_loss
from reinforge.algorithms.losses import (
    COV_PENALTIES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    cispo_loss,
    clipped_surrogate_loss,
    covariance_token_selection,
    entropy_from_logits,
    gspo_loss,
    kl_penalty,
    policy_loss,
    reinforce_loss,
    truncated_importance_weights,
    value_loss,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS", "SCALE_MODES", "LOSS_AGG_MODES", "KL_ESTIMATORS", "POLICY_LOSSES", "COV_PENALTIES",
    "compute_advantages", "group_normalized_advantages", "leave_one_out_advantages",
    "greedy_baseline_advantages", "reinforce_pp_advantages", "gae_advantages", "passk_advantages",
    "token_level_rewards", "masked_whiten", "informative_groups",
    "policy_loss", "clipped_surrogate_loss", "gspo_loss", "cispo_loss", "reinforce_loss", "value_loss",
    "kl_penalty", "entropy_from_logits", "truncated_importance_weights", "covariance_token_selection",
    "aggregate_loss",
]
