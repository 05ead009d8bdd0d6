"""Warm starts: supervised fine-tuning on demonstrations (a user's file, or made from a task's
answers and worked solutions), the SFT stage `reinforge train` runs before RL, and expert
iteration (rejection-sampling fine-tuning). docs/sft.md."""

from .data import Demo, DemoError, TokenizedDemo, collate, demos_from_file, demos_from_task, format_response, tokenize_demo
from .expert import select_accepted
from .runner import SFTResult, SFTRunner, batch_positions

__all__ = ["Demo", "DemoError", "TokenizedDemo", "collate", "demos_from_file", "demos_from_task", "format_response",
           "tokenize_demo", "select_accepted", "SFTResult", "SFTRunner", "batch_positions"]
