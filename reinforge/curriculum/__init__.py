"""Which prompts a step samples, and which of their groups it trains on.

The trainer asks its curriculum for the next prompts, generates and scores them, and asks it which
groups to keep; it repeats the round while the curriculum wants more (up to ``max_rounds``). A
strategy is a subclass that changes one of those answers: DAPO's dynamic sampling keeps only
groups whose rewards differ. Strategies that learn from what they see (difficulty filters,
adaptive sample counts) get every round's rewards through ``observe`` and keep what they learn in
``state_dict``, which is part of every checkpoint.
"""

from .base import Curriculum, DynamicSampling, EpochSampler, build_curriculum

__all__ = ["Curriculum", "DynamicSampling", "EpochSampler", "build_curriculum"]
