"""The controller loop, checkpoints and resume."""

from .trainer import PromptSampler, RunResult, Trainer

__all__ = ["PromptSampler", "RunResult", "Trainer"]
