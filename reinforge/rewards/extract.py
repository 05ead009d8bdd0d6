"""Taking the answer out of a completion. Model-written text is data only: it is searched, never
evaluated.

Every parser here is one pass over the text (tests/test_parsers_linear.py checks it): a completion
is written by the policy, so a pathological one ("\\boxed{" ten thousand times) must cost what an
ordinary one of its length costs, not seconds of a training step.
"""

from __future__ import annotations

import re

ANSWER_FORMATS = ("tags", "boxed", "last_line", "raw")

# The most characters of a completion a parser reads: 32768 tokens (the longest max_new_tokens in
# common use) x 32 characters per token (text averages ~4; the longest whitespace tokens ~16), so
# no real completion is ever cut; only a runaway one is. Answers are read from the last
# MAX_PARSE_CHARS characters (the answer comes last), programs from the first (as if generation
# had stopped there: reinforge/rewards/code.py).
MAX_PARSE_CHARS = 1 << 20

_OPEN, _CLOSE = "<answer>", "</answer>"
_BOXED = re.compile(r"\\boxed\s*\{")
# A backslash escapes the next character (\{ and \} are literal braces in LaTeX); otherwise a brace.
_BRACE = re.compile(r"\\.|[{}]", re.DOTALL)


def _closing_braces(text: str, start: int) -> dict[int, int]:
    """For each "{" from ``start`` on that closes, the index of the brace closing it, skipping
    escaped braces: one pass with a stack (scanning from every opener would be quadratic)."""
    stack: list[int] = []
    closes: dict[int, int] = {}
    for m in _BRACE.finditer(text, start):
        c = m.group()
        if c == "{":
            stack.append(m.start())
        elif c == "}" and stack:
            closes[stack.pop()] = m.start()
    return closes


def _boxed_bounds(text: str) -> list[tuple[int, int]]:
    """(start, end) of the contents of every complete \\boxed{...}, in order."""
    opens = [m.end() - 1 for m in _BOXED.finditer(text)]
    if not opens:
        return []
    # The scan starts at the first \boxed's brace; the character before a \boxed brace is never a
    # backslash, so every later one is reached as a brace too, and its match is the one a scan
    # from it alone would find.
    closes = _closing_braces(text, opens[0])
    return [(o + 1, closes[o]) for o in opens if o in closes]


def boxed_spans(text: str) -> list[str]:
    """Contents of every complete \\boxed{...}, in order; an unclosed one (truncated) is skipped.
    (Nested ones overlap, so all of them together can be quadratic in size: the extractors below
    slice only the span they need.)"""
    return [text[a:b] for a, b in _boxed_bounds(text)]


def extract_answer(completion: str, fmt: str) -> str | None:
    """The answer part of a completion, stripped, or None when the format is not found.

    tags:      content of the last complete <answer>...</answer> (an inner <answer> opener, as in
               "<answer>x <answer>y</answer>", starts the content afresh: "y").
    boxed:     content of the last complete \\boxed{...}, braces balanced.
    last_line: the last non-empty line.
    raw:       the whole completion.
    Only the last MAX_PARSE_CHARS characters are searched.
    """
    if fmt != "raw":
        completion = completion[-MAX_PARSE_CHARS:]
    if fmt == "tags":
        close = completion.rfind(_CLOSE)
        if close < 0:
            return None
        open_ = completion.rfind(_OPEN, 0, close)
        if open_ < 0:
            return None
        return completion[open_ + len(_OPEN) : close].strip()
    if fmt == "boxed":
        bounds = _boxed_bounds(completion)
        return completion[bounds[-1][0] : bounds[-1][1]].strip() if bounds else None
    if fmt == "last_line":
        for line in reversed(completion.splitlines()):
            if line.strip():
                return line.strip()
        return None
    if fmt == "raw":
        return completion.strip()
    raise ValueError(f"unknown answer format {fmt!r}; accepted: {', '.join(ANSWER_FORMATS)}")


def is_well_formed(completion: str, fmt: str) -> bool:
    """Exactly one answer in the format, with non-empty content (raw/last_line: any text). Reads
    the whole completion (counts, finds and one brace scan: linear), as "exactly one" needs."""
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
