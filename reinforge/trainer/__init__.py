"""The controller loop, checkpoints and resume."""

from .trainer import RunResult, Trainer

__all__ = ["RunResult", "Trainer"]
