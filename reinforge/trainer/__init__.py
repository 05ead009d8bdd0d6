"""The RL controller loop (trainer.py) and what it saves, logs and reports (state.py, step_log.py,
outcome.py)."""

from .outcome import RunResult
from .trainer import Trainer

__all__ = ["RunResult", "Trainer"]
