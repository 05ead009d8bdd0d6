"""Every parser of model-written text in the trainer costs time linear in its input.

A completion is written by the policy, so one made of what a parser handles worst (blank lines
after a code fence, "\\boxed{" thousands of times, a fence line that never ends) must cost what an
ordinary completion of its length costs: a quadratic parser stalls a training step for seconds
(the red team's 16384 newlines took extract_code 9 s).

No absolute times: each parser runs on an adversarial input of size n and of size 10n, repeated
until the runs at n take at least 20 ms of CPU time (time.process_time, best of 3), and the
ratio must stay under 30 (linear: ~10; quadratic: ~100). Where the work can be counted exactly
(token_ends counts the tokens it decodes) the count is checked instead.
"""

from __future__ import annotations

import gc
import time

import pytest
from conftest import make_tokenizer

from reinforge.batch import Trajectory
from reinforge.rewards.code import extract_code
from reinforge.rewards.extract import MAX_PARSE_CHARS, extract_answer, is_well_formed
from reinforge.rewards.models.steps import (
    StepSplitter,
    _token_ends_by_prefix,
    token_ends,
)
from reinforge.rewards.models.verifiers import place_on_tokens
from reinforge.tasks.base import normalize_answer

LIMIT = 30.0  # t(10n) / t(n): linear ~10, quadratic ~100
MIN_CPU_S = 0.02  # the runs at n take at least this much CPU time, for a stable ratio


def _cpu(fn, arg, reps: int, budget: float = float("inf")) -> float:
    """CPU seconds of ``reps`` calls, stopping once past ``budget`` (then a lower bound)."""
    start = time.process_time()
    for _ in range(reps):
        fn(arg)
        if time.process_time() - start > budget:
            break
    return time.process_time() - start


def growth(fn, make, n: int, tries: int = 3) -> float:
    """CPU time of ``fn(make(10 n))`` over that of ``fn(make(n))``, each run ``reps`` times with
    ``reps`` doubled until the runs at n take MIN_CPU_S; best of 3 at n, best of ``tries`` at 10n,
    stopping at the first try under LIMIT. A try stops once over LIMIT (a quadratic parser
    need not run to the end; its ratio is then a lower bound)."""
    small_in, big_in = make(n), make(10 * n)
    assert len(big_in) < MAX_PARSE_CHARS, "the 10n input would be cut: it would test the bound, not the parser"
    gc.disable()
    try:
        reps = 1
        while (small := _cpu(fn, small_in, reps)) < MIN_CPU_S:
            reps *= 2
        small = min([small] + [_cpu(fn, small_in, reps) for _ in range(2)])
        ratio = float("inf")
        for _ in range(tries):
            ratio = min(ratio, _cpu(fn, big_in, reps, budget=LIMIT * small) / small)
            if ratio < LIMIT:
                break
    finally:
        gc.enable()
    return ratio


def _guess_step(text: str):
    from reinforge.agents.envs import GuessNumberEnv

    env = GuessNumberEnv()
    env.target = 7
    return env.step({"role": "assistant", "content": text})


def _tool_calls(text: str):
    from reinforge.agents.tools import parse_tool_calls

    return parse_tool_calls(text)


def _strip_calls(text: str):
    from reinforge.agents.tools import strip_tool_calls

    return strip_tool_calls(text)


def _scientific(text: str):
    from reinforge.rewards.scorer_worker import _SCIENTIFIC  # math-verify's answer rewriting

    return _SCIENTIFIC.fullmatch(text)


CASES = {
    # extract_code (the code verifier, code_feedback, the guardrails' program checks)
    "code: blank lines after a fence, entry point": (
        lambda s: extract_code(s, "f"), lambda n: "```python\n" + "\n" * n, 2000),
    "code: ' \\n' lines after a fence, entry point": (
        lambda s: extract_code(s, "f"), lambda n: "```python\n" + " \n" * n, 2000),
    "code: newlines, no fence": (lambda s: extract_code(s, "f"), lambda n: "\n" * n, 2000),
    "code: a fence line that never ends": (extract_code, lambda n: "```" + "a" * n, 2000),
    "code: a fence line of spaces that never ends": (extract_code, lambda n: "```" + " " * n, 2000),
    "code: unclosed fences": (lambda s: extract_code(s, "f"), lambda n: "```python\n" * n, 2000),
    "code: many blocks, none defining the entry point": (
        lambda s: extract_code(s, "f"), lambda n: "```python\ndef g():\n\n\n    pass\n```\n" * n, 200),
    # answers: \boxed{}, <answer> tags, the last line; the normalisation every match goes through
    "boxed: unclosed openers": (lambda s: extract_answer(s, "boxed"), lambda n: "\\boxed{" * n, 300),
    "boxed: nested openers, all closed": (
        lambda s: extract_answer(s, "boxed"), lambda n: "\\boxed{" * n + "}" * n, 300),
    "boxed: deep braces": (lambda s: extract_answer(s, "boxed"), lambda n: "\\boxed{" + "{" * n, 2000),
    "boxed: escapes": (lambda s: extract_answer(s, "boxed"), lambda n: "\\boxed{" + "\\{" * n, 2000),
    "well-formed boxed: one opener, deep braces": (
        lambda s: is_well_formed(s, "boxed"), lambda n: "\\boxed{" + "{" * n + "}" * (n + 1), 2000),
    "tags: unclosed openers": (lambda s: extract_answer(s, "tags"), lambda n: "<answer>" * n + "</answer>", 2000),
    "well-formed tags: openers": (lambda s: is_well_formed(s, "tags"), lambda n: "<answer>" * n, 10000),
    "last line: whitespace lines": (lambda s: extract_answer(s, "last_line"), lambda n: " \n" * n, 2000),
    "normalize: final periods": (normalize_answer, lambda n: "." * n, 20000),
    "normalize: final '. '": (normalize_answer, lambda n: ". " * n, 20000),
    # PRM step splitting
    "steps: blank lines": (StepSplitter().spans, lambda n: "\n" * n, 2000),
    "steps: whitespace lines": (StepSplitter().spans, lambda n: " \n" * n, 2000),
    "steps: one-character steps": (StepSplitter().spans, lambda n: "a\n" * n, 2000),
    # tool calls (the agent loop, ToolEnv, the loopback endpoint's chat route)
    "tool calls: unclosed openers": (_tool_calls, lambda n: "<tool_call>" * n, 1000),
    "tool calls: closed calls then unclosed openers": (
        _tool_calls, lambda n: '<tool_call>{"name": "f"}</tool_call>' + "<tool_call>" * n, 1000),
    "tool calls stripped from a message": (_strip_calls, lambda n: "<tool_call>" * n + "</tool_call>x", 1000),
    # math-verify's rewriting of 1e5-style answers (in the scoring worker, under its deadline too)
    "math_verify: digits without an exponent": (_scientific, lambda n: "1" * n + "x", 1000),
    "math_verify: digits, a dot, digits, no exponent": (_scientific, lambda n: "1" * n + "." + "2" * n, 1000),
    # the guess_number environment's <answer>N</answer>
    "guess_number: openers then digits": (_guess_step, lambda n: "<answer>" * n + "1" * n, 2000),
}

@pytest.mark.parametrize("name", list(CASES))
def test_parser_time_grows_linearly(name):
    fn, make, n = CASES[name]
    ratio = growth(fn, make, n)
    assert ratio < LIMIT, f"{name}: t(10n)/t(n) >= {ratio:.0f} at n={n} (linear ~10, quadratic ~100)"


class _CountingTokenizer:
    """The char tokenizer, counting the tokens it is asked to decode (the work of token_ends)."""

    def __init__(self):
        self.tok = make_tokenizer()
        self.decoded = 0

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.tok.decode(ids, **kw)


@pytest.mark.parametrize("step", ["a\n", "ab\n\n", "one step per line\n"])
def test_token_ends_decodes_a_bounded_number_of_tokens_per_token(step):
    """Placing step rewards: every step's end is located with O(1) decoded tokens per token
    (decoding each probed prefix whole was O(steps x tokens): 3.9 s for 2048 steps)."""
    work = []
    for n in (100, 1000):
        tok = _CountingTokenizer()
        text = step * n
        ids = tok.tok.encode(text, add_special_tokens=False)
        ends = [b for _, b in StepSplitter().spans(text)]
        got = token_ends(tok, ids, ends)
        work.append(tok.decoded / len(ids))
        if n == 100:  # the same tokens as decoding every probed prefix whole
            assert got == _token_ends_by_prefix(tok.tok, ids, ends)
    assert work[1] < 2 * work[0] and work[1] < 200, f"decoded tokens per token: {work}"


def test_placing_step_rewards_grows_linearly():
    """Many steps ending inside one long observation: each is moved back to the model's last
    token before it, found in one pass."""
    tok = make_tokenizer()

    def place(text: str):
        ids = tok.encode(text, add_special_tokens=False)
        traj = Trajectory([], ids, [True] + [False] * (len(ids) - 1), text, [], False)
        ends = [b for _, b in StepSplitter().spans(text)]
        return place_on_tokens(tok, traj, ends, [1.0] * len(ends))

    assert growth(place, lambda n: "a\n" * n, 500) < LIMIT
