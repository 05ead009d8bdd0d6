"""Which prompts a step samples, how many samples each gets, and which groups it trains on.

The trainer asks its curriculum for the next prompts, generates and scores them, and asks it which
groups to keep; it repeats the round while the curriculum wants more (up to ``max_rounds``). A
strategy is a subclass that changes one of those answers: DAPO's dynamic sampling keeps only
groups whose rewards differ; online difficulty filtering keeps groups whose pass rate lies in a
band; GRESO skips prompts before rollout that its history predicts to be uninformative;
Reinforce-Ada samples a step's prompts again until their groups have both outcomes; a difficulty
schedule and a task mixture choose among several sets of examples. Strategies that learn from
what they see get every round's rewards through ``observe``, log what they did per step from
``finish_step``, and keep what they learn in ``state_dict``, which is part of every checkpoint.
docs/curricula.md has each rule and its paper.
"""

from reinforge.config.curriculum import CurriculumConfig, MixtureEntry

from .adaptive import ReinforceAda
from .base import Curriculum, DynamicSampling, EpochSampler, group_outcomes
from .build import build_curriculum
from .filters import DifficultyFilter, Greso
from .pools import DifficultySchedule, PooledTask, TaskMixture

__all__ = ["Curriculum", "CurriculumConfig", "DifficultyFilter", "DifficultySchedule", "DynamicSampling",
           "EpochSampler", "Greso", "MixtureEntry", "PooledTask", "ReinforceAda", "TaskMixture",
           "build_curriculum", "group_outcomes"]
