"""What a verifier may return as a score: a finite real number within ``reward.max_abs_score``.

Anything else is a reward error (:class:`InvalidScore`, scored 0 and counted in ``reward_errors``
with its reason, as a verifier that raises): a string such as ``"0.75"`` is not converted
silently, because a reward function that returns text usually has a bug (a parsed field, a
forgotten conversion), and a score such as ``1e39`` is finite in Python but overflows float32, so
one such sample would turn its group's advantages into NaN and stop the run. ``True``/``False``
count as 1/0: correctness checks commonly return them, and their meaning is not in doubt.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np

# The largest |score| a verifier may return by default (reward.max_abs_score): far above any
# reward scale in use (rewards are usually in [0, 1] or [-1, 1]), far below float32's 3.4e38.
DEFAULT_MAX_ABS_SCORE = 1e6
# The largest float32: a weighted sum past it becomes inf in the reward tensor.
FLOAT32_MAX = 3.4028234663852886e38


class InvalidScore(ValueError):
    """A verifier's score that is not a finite real number within the bound."""


def _describe(value: Any) -> str:
    text = repr(value)
    return f"the {type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _as_number(value: Any) -> float:
    if isinstance(value, (bool, np.bool_)):  # numpy's bool too: 1 or 0
        return float(bool(value))
    if isinstance(value, (numbers.Real, Decimal)):
        return float(value)
    # A one-element numpy array or torch tensor of a real (or bool) dtype: its number.
    if hasattr(value, "item") and getattr(value, "ndim", None) is not None and _size(value) == 1:
        if "complex" not in str(getattr(value, "dtype", "")):
            return _as_number(value.item())
    if isinstance(value, str):
        raise InvalidScore(f"returned {_describe(value)}, not a number: return float(...) of it "
                           "(a score must be a finite real number; bool counts as 1/0)")
    if value is None:
        raise InvalidScore("returned None, not a number (a missing `return`?); a score must be a finite real "
                           "number (bool counts as 1/0)")
    raise InvalidScore(f"returned {_describe(value)}, not a real number; a score must be a finite real "
                       "number (bool counts as 1/0)")


def _size(value: Any) -> int:
    numel = getattr(value, "numel", None)  # torch
    return int(numel()) if callable(numel) else int(getattr(value, "size", 0))


def checked_score(value: Any, max_abs: float = DEFAULT_MAX_ABS_SCORE) -> float:
    """``value`` as a float, or :class:`InvalidScore` saying what is wrong and the fix."""
    try:
        score = _as_number(value)
    except OverflowError:  # an int too large for a float
        raise InvalidScore(f"score {_describe(value)} is too large for a float; the bound is "
                           f"±{max_abs:g} (reward.max_abs_score)") from None
    if not math.isfinite(score):
        raise InvalidScore(f"non-finite score {score}; a score must be a finite real number")
    if abs(score) > max_abs:
        raise InvalidScore(f"score {score:g} is outside ±{max_abs:g} (reward.max_abs_score): rescale the "
                           "verifier's score, or raise reward.max_abs_score if it is meant")
    return score


def checked_token_rewards(values: Sequence[Any], max_abs: float = DEFAULT_MAX_ABS_SCORE) -> list[float]:
    """Every token reward checked as a score; the first bad one names its position."""
    out = []
    for i, v in enumerate(values):
        try:
            out.append(checked_score(v, max_abs))
        except InvalidScore as err:
            raise InvalidScore(f"token reward {i}: {err}") from None
    return out
