"""Steps of a solution: where a completion's text splits into steps, and which token ends each.

A step is a span of the completion's text between separators (a literal string, default a
newline) or between matches of a regular expression; empty or all-whitespace steps are dropped.
A process reward model reads its score at a step's last token, and the step's reward is placed
on the policy's token that ends the step.
"""

from __future__ import annotations

import bisect
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


# token_ends needs the decoded length of token prefixes. Decoding each probed prefix whole costs
# its length, so a step per line made placing step rewards quadratic (2048 steps over 4096 tokens:
# 3.9 s). Decoding is local: a byte-level character spans at most 4 byte tokens, clean-up merges
# neighbours, and the special case of a decode's first token (SentencePiece drops its leading
# space, WordPiece keeps its "##") is the same in two decodes that start at the same token. So a
# prefix's length is summed block by block: a block adds len(decode(context + block)) -
# len(decode(context)), the context being the _CONTEXT tokens before the block. The sum over all
# blocks is checked against the whole text's length; a tokenizer where they differ (decoding not
# local) gets the exact prefix decodes.
_BLOCK, _CONTEXT = 32, 8


def token_ends(tokenizer, token_ids: list[int], char_ends: list[int]) -> list[int]:
    """For each character offset in ``char_ends`` (into ``tokenizer.decode(token_ids,
    skip_special_tokens=True)``), the index of the first token whose decoded prefix reaches it:
    the token that completes that character (the last token when none does). Linear in the
    tokens: prefix lengths come from decoding blocks of ``_BLOCK`` tokens with ``_CONTEXT`` tokens
    before each (exact for byte-level, SentencePiece and WordPiece tokenizers, whose decoding is
    local), checked against the whole decode; prefix by prefix where that check fails."""
    ids = list(token_ids)
    n = len(ids)
    if not n:
        return [-1] * len(char_ends)

    def decoded(a: int, b: int) -> int:  # characters decoded from tokens [a, b)
        return len(tokenizer.decode(ids[a:b], skip_special_tokens=True))

    starts = range(0, n, _BLOCK)
    context = [decoded(max(0, s - _CONTEXT), s) for s in starts]
    block_ends, total = [], 0  # decoded length of the prefix ending with each block
    for s, c in zip(starts, context):
        total += decoded(max(0, s - _CONTEXT), min(s + _BLOCK, n)) - c
        block_ends.append(total)
    if total != decoded(0, n):
        return _token_ends_by_prefix(tokenizer, ids, char_ends)
    cache: dict[int, int] = {}

    def decoded_len(t: int) -> int:  # characters decoded from tokens [0, t]
        if t not in cache:
            k = t // _BLOCK
            before = block_ends[k - 1] if k else 0
            cache[t] = before + decoded(max(0, k * _BLOCK - _CONTEXT), t + 1) - context[k]
        return cache[t]

    out = []
    for end in char_ends:
        k = bisect.bisect_left(block_ends, end)  # the first block whose end reaches it
        if k == len(block_ends):
            out.append(n - 1)
            continue
        lo, hi = k * _BLOCK, min((k + 1) * _BLOCK, n) - 1
        out.append(_first_reaching(decoded_len, lo, hi, end))
    return out


def _first_reaching(decoded_len, lo: int, hi: int, end: int) -> int:
    """The first token t in [lo, hi] whose decoded prefix reaches `end` characters (binary search)."""
    while lo < hi:
        mid = (lo + hi) // 2
        if decoded_len(mid) >= end:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _token_ends_by_prefix(tokenizer, token_ids: list[int], char_ends: list[int]) -> list[int]:
    """token_ends by decoding whole prefixes (binary search per offset): exact for any tokenizer,
    quadratic; for tokenizers whose decoding is not local."""
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
        out.append(_first_reaching(decoded_len, lo, hi, end))
    return out
