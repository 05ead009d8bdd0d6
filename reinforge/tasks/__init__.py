"""Where prompts come from and how an answer is checked. Knows nothing of models or training."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reinforge.tasks.base import Example, PromptFormat, Task, TaskError, build_messages, normalize_answer
from reinforge.tasks.code_task import CodeProblem, CodeTask
from reinforge.tasks.file_task import FileTask
from reinforge.tasks.prompts import encode_prompt
from reinforge.tasks.reasoning_gym_task import ReasoningGymTask

if TYPE_CHECKING:
    from reinforge.config import TaskConfig

__all__ = [
    "CodeProblem",
    "CodeTask",
    "Example",
    "FileTask",
    "PromptFormat",
    "ReasoningGymTask",
    "Task",
    "TaskError",
    "build_messages",
    "build_task",
    "encode_prompt",
    "normalize_answer",
]


def build_task(cfg: "TaskConfig") -> Task:
    """The task a config describes; raises TaskError (a ValueError) naming the key to fix."""
    common = dict(
        train_size=cfg.train_size,
        eval_size=cfg.eval_size,
        seed=cfg.seed,
        prompt_format=PromptFormat(
            system_prompt=cfg.system_prompt,
            suffix=cfg.prompt_suffix,
            few_shot=tuple(shot.model_dump() for shot in cfg.few_shot),
        ),
    )
    if cfg.source == "reasoning_gym":
        return ReasoningGymTask(cfg.name, options=cfg.options, **common)
    if cfg.source == "file":
        if cfg.path is None:
            raise TaskError("task.source=file needs task.path (a .jsonl, .parquet or .csv file)")
        return FileTask(
            cfg.path,
            eval_path=cfg.eval_path,
            prompt_field=cfg.prompt_field,
            answer_field=cfg.answer_field,
            id_field=cfg.id_field,
            **common,
        )
    if cfg.source == "code":
        return CodeTask(cfg.path, name=cfg.name, eval_path=cfg.eval_path, **common)
    raise TaskError(f"task.source: unknown source {cfg.source!r}; accepted: reasoning_gym, file, code")
