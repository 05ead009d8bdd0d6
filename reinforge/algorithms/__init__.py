"""Pure tensor functions of RL post-training: advantage estimators, policy losses, KL terms and
loss aggregation. Imports only torch, like verl's ``core_algos.py``: a recipe from a paper is a
composition of these functions, and a new one is a small addition here.
"""

from reinforge.algorithms.advantages import group_normalized_advantages
from reinforge.algorithms.aggregation import LOSS_AGG_MODES, aggregate_loss
from reinforge.algorithms.losses import KL_ESTIMATORS, clipped_surrogate_loss, kl_penalty

__all__ = [
    "group_normalized_advantages",
    "clipped_surrogate_loss",
    "kl_penalty",
    "aggregate_loss",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
]
