"""One optimisation step on a batch, and the forward passes it shares with the critic."""

from .forward import plan_micro_batches
from .learner import Learner

__all__ = ["Learner", "plan_micro_batches"]
