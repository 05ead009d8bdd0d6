"""Steps of a solution: where a completion's text splits into steps, and which token ends each.

A step is a span of the completion's text between separators (a literal string, default a
newline) or between matches of a regular expression; empty or all-whitespace steps are dropped.
A process reward model reads its score at a step's last token, and the step's reward is placed
on the policy's token that ends the step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class StepSplitter:
    """separator: a literal string between steps (default "\\n": one step per line).
    pattern:   a regular expression whose matches separate steps (wins over separator), e.g.
               ``\\n\\n+`` for paragraphs or ``(?=Step \\d+:)`` for numbered steps.
    max_steps: the most steps kept; the rest of the text joins the last one (None: all)."""

    separator: str = "\n"
    pattern: str | None = None
    max_steps: int | None = None

    def __post_init__(self) -> None:
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as err:
                raise ValueError(f"step pattern {self.pattern!r} is not a valid regular expression: {err}") from None
        elif not self.separator:
            raise ValueError("the step separator is empty; give a separator string or a pattern")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")

    def spans(self, text: str) -> list[tuple[int, int]]:
        """``[start, end)`` character spans of the non-empty steps of ``text``, stripped of
        surrounding whitespace, in order."""
        if self.pattern is not None:
            cuts = [(m.start(), m.end()) for m in re.finditer(self.pattern, text)]
        else:
            cuts, i = [], text.find(self.separator)
            while i >= 0:
                cuts.append((i, i + len(self.separator)))
                i = text.find(self.separator, i + len(self.separator))
        out, start = [], 0
        for a, b in cuts + [(len(text), len(text))]:
            piece = text[start:a]
            if piece.strip():
                lead = len(piece) - len(piece.lstrip())
                trail = len(piece.rstrip())
                out.append((start + lead, start + trail))
            start = b
        if self.max_steps is not None and len(out) > self.max_steps:
            out = out[: self.max_steps - 1] + [(out[self.max_steps - 1][0], out[-1][1])]
        return out

    def to_dict(self) -> dict:
        return {"separator": self.separator, "pattern": self.pattern, "max_steps": self.max_steps}


def token_ends(tokenizer, token_ids: list[int], char_ends: list[int]) -> list[int]:
    """For each character offset in ``char_ends`` (into ``tokenizer.decode(token_ids,
    skip_special_tokens=True)``), the index of the first token whose decoded prefix reaches it:
    the token that completes that character. Decoding prefixes (binary search per offset) is exact
    for any tokenizer, byte-level ones included."""
    cache: dict[int, int] = {}

    def decoded_len(t: int) -> int:  # characters decoded from tokens [0, t]
        if t not in cache:
            cache[t] = len(tokenizer.decode(token_ids[: t + 1], skip_special_tokens=True))
        return cache[t]

    out = []
    for end in char_ends:
        lo, hi = 0, len(token_ids) - 1
        if hi < 0:
            out.append(-1)
            continue
        while lo < hi:
            mid = (lo + hi) // 2
            if decoded_len(mid) >= end:
                hi = mid
            else:
                lo = mid + 1
        out.append(lo)
    return out
