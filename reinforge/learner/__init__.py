"""One optimisation step on a batch."""

from .learner import Learner, plan_micro_batches

__all__ = ["Learner", "plan_micro_batches"]
