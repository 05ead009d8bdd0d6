"""Taking the answer out of a completion. Model-written text is data only: it is searched, never
evaluated."""

from __future__ import annotations

import re

ANSWER_FORMATS = ("tags", "boxed", "last_line", "raw")

_OPEN, _CLOSE = "<answer>", "</answer>"
_BOXED = re.compile(r"\\boxed\s*\{")


def _balanced_from(text: str, start: int) -> int | None:
    """Index of the brace closing the one opened just before `start`, skipping escaped braces
    (\\{ and \\} are literal braces in LaTeX); None when it never closes."""
    depth = 1
    i = start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def boxed_spans(text: str) -> list[str]:
    """Contents of every complete \\boxed{...}, in order; an unclosed one (truncated) is skipped."""
    out = []
    for m in _BOXED.finditer(text):
        end = _balanced_from(text, m.end())
        if end is not None:
            out.append(text[m.end() : end])
    return out


def extract_answer(completion: str, fmt: str) -> str | None:
    """The answer part of a completion, stripped, or None when the format is not found.

    tags:      content of the last complete <answer>...</answer> (an inner <answer> opener, as in
               "<answer>x <answer>y</answer>", starts the content afresh: "y").
    boxed:     content of the last complete \\boxed{...}, braces balanced.
    last_line: the last non-empty line.
    raw:       the whole completion.
    """
    if fmt == "tags":
        close = completion.rfind(_CLOSE)
        if close < 0:
            return None
        open_ = completion.rfind(_OPEN, 0, close)
        if open_ < 0:
            return None
        return completion[open_ + len(_OPEN) : close].strip()
    if fmt == "boxed":
        spans = boxed_spans(completion)
        return spans[-1].strip() if spans else None
    if fmt == "last_line":
        for line in reversed(completion.splitlines()):
            if line.strip():
                return line.strip()
        return None
    if fmt == "raw":
        return completion.strip()
    raise ValueError(f"unknown answer format {fmt!r}; accepted: {', '.join(ANSWER_FORMATS)}")


def is_well_formed(completion: str, fmt: str) -> bool:
    """Exactly one answer in the format, with non-empty content (raw/last_line: any text)."""
    if fmt == "tags":
        if completion.count(_OPEN) != 1 or completion.count(_CLOSE) != 1:
            return False
        open_, close = completion.find(_OPEN), completion.find(_CLOSE)
        return open_ < close and bool(completion[open_ + len(_OPEN) : close].strip())
    if fmt == "boxed":
        if len(_BOXED.findall(completion)) != 1:
            return False
        spans = boxed_spans(completion)
        return len(spans) == 1 and bool(spans[0].strip())
    if fmt in ("last_line", "raw"):
        return bool(completion.strip())
    raise ValueError(f"unknown answer format {fmt!r}; accepted: {', '.join(ANSWER_FORMATS)}")
