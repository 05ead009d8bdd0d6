"""What an algorithm config needs the run to provide: the one place that says it.

The trainer (which forwards to run, which models to load, what to generate) and the memory guard
(which copies to count) read ``needs_of`` instead of repeating rules about component names.
"""

from __future__ import annotations

from reinforge.algorithms.estimators import ADVANTAGE_ESTIMATORS
from reinforge.algorithms.losses import POLICY_LOSSES
from reinforge.algorithms.off_policy import OFF_POLICY_CORRECTIONS
from reinforge.algorithms.registry import Needs

__all__ = ["needs_of"]


def needs_of(algo) -> Needs:
    """The needs of an ``AlgorithmConfig`` (read by attribute, so ``algorithms`` stays free of the
    config module): the declarations of its advantage estimator, policy loss and off-policy
    correction (every one but "none" reads the proximal log-probs), plus what its other settings
    imply:

    - ``kl_coef > 0`` (KL in the loss) or ``kl_reward_coef > 0`` (KL in the reward): a reference.
    - rollout-time log-probs from a separate forward whenever the policy moves before a token is
      trained on (``epochs > 1`` or ``mini_batches > 1``), or a piece reads them before the
      update: truncated importance sampling (``tis_cap``), the covariance penalties
      (``cov_penalty``), the KL in the reward (computed once per batch from them). Otherwise the
      single update's own forward gives them.
    """
    declared = (ADVANTAGE_ESTIMATORS.needs(algo.advantage) | POLICY_LOSSES.needs(algo.policy_loss)
                | OFF_POLICY_CORRECTIONS.needs(getattr(algo, "off_policy", "none")))
    return declared | Needs(
        reference=algo.kl_coef > 0 or algo.kl_reward_coef > 0,
        old_logprobs=(
            algo.epochs > 1 or algo.mini_batches > 1 or algo.tis_cap is not None
            or algo.cov_penalty != "none" or algo.kl_reward_coef > 0
        ),
    )
