"""Helpers shared by the command handlers (reinforge/cli/eval.py, reinforge/cli/runs.py).

Standard library only: the handler modules import this at module level, and the package imports
them before its signal handlers are installed (reinforge/cli/__init__.py).
"""

from __future__ import annotations

from pathlib import Path


def _split_items(items: list[str]) -> tuple[list[str], list[str]]:
    """(targets, key=value overrides) from the positional words."""
    overrides = [i for i in items if "=" in i and not Path(i).exists()]
    return [i for i in items if i not in overrides], overrides
