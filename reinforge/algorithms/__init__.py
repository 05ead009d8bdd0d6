"""Pure tensor functions of RL post-training: advantage estimators, policy losses, KL and entropy
terms and loss aggregation. Imports only torch, like verl's ``core_algos.py``: a recipe from a
paper is a composition of these functions, and a new one is a small addition here.

Advantage estimators, policy losses and off-policy corrections are registered by their config
name, each with the :class:`Needs` it declares (``register_advantage``, ``register_policy_loss``,
``register_off_policy``); ``needs_of`` tells
the trainer and the memory guard what a whole ``algorithm`` config needs.
"""

from reinforge.algorithms.advantages import (
    SCALE_MODES,
    gae_advantages,
    gpg_advantages,
    greedy_baseline_advantages,
    group_normalized_advantages,
    informative_groups,
    leave_one_out_advantages,
    masked_whiten,
    optimal_baseline_advantages,
    passk_advantages,
    reinforce_pp_advantages,
    scale_mode,
    token_level_rewards,
)
from reinforge.algorithms.aggregation import LOSS_AGG_MODES, aggregate_loss
from reinforge.algorithms.estimators import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    Advantages,
    compute_advantages,
    is_group_relative,
    register_advantage,
)
from reinforge.algorithms.losses import (
    K3_MAX,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    cispo_loss,
    clipped_surrogate_loss,
    entropy_from_logits,
    gpg_loss,
    gspo_loss,
    is_advantage_weighted,
    kl_penalty,
    policy_loss,
    policy_loss_options,
    register_policy_loss,
    reinforce_loss,
    truncated_importance_weights,
    value_loss,
)
from reinforge.algorithms.clip_alternatives import dppo_kl_loss, dppo_tv_loss, dro_loss, gmpo_loss, sapo_loss
from reinforge.algorithms.covariance import (
    COV_PENALTIES,
    apply_cov_penalty,
    clip_cov_candidates,
    covariance_token_selection,
    kl_cov_loss,
    tokens_with_gradient,
)
from reinforge.algorithms.credit import (
    CREDIT_RULES,
    credit_options,
    implicit_prm_loss,
    implicit_process_rewards,
    min_form_credit,
    outcome_process_mixture,
    register_credit,
    step_returns,
    sum_form_credit,
)
from reinforge.algorithms.needs import needs_of
from reinforge.algorithms.off_policy import (
    OFF_POLICY_CORRECTIONS,
    TIS_LEVELS,
    Correction,
    mismatch_stats,
    off_policy_correction,
    register_off_policy,
)
from reinforge.algorithms.registry import Needs, Registry

__all__ = [
    "ADVANTAGE_ESTIMATORS", "SCALE_MODES", "LOSS_AGG_MODES", "KL_ESTIMATORS", "K3_MAX", "POLICY_LOSSES",
    "COV_PENALTIES", "OFF_POLICY_CORRECTIONS", "TIS_LEVELS", "Correction", "register_off_policy",
    "off_policy_correction", "mismatch_stats",
    "Needs", "Registry", "needs_of", "register_advantage", "register_policy_loss", "is_advantage_weighted",
    "is_group_relative",
    "AdvantageInputs", "Advantages", "compute_advantages", "scale_mode",
    "group_normalized_advantages", "leave_one_out_advantages",
    "greedy_baseline_advantages", "reinforce_pp_advantages", "gae_advantages", "passk_advantages",
    "token_level_rewards", "masked_whiten", "informative_groups", "optimal_baseline_advantages", "gpg_advantages",
    "policy_loss", "policy_loss_options", "clipped_surrogate_loss", "gspo_loss", "cispo_loss", "reinforce_loss",
    "gpg_loss", "sapo_loss", "gmpo_loss", "dppo_tv_loss", "dppo_kl_loss", "dro_loss", "value_loss",
    "kl_penalty", "entropy_from_logits", "truncated_importance_weights", "covariance_token_selection",
    "tokens_with_gradient", "clip_cov_candidates", "kl_cov_loss", "apply_cov_penalty",
    "aggregate_loss",
    "CREDIT_RULES", "register_credit", "credit_options", "step_returns", "sum_form_credit", "min_form_credit",
    "outcome_process_mixture", "implicit_process_rewards", "implicit_prm_loss",
]
