"""math-verify scores in worker processes that are stopped at the limit, from any thread
(reinforge/rewards/isolated.py IsolatedMath, scorer_worker.py). In the trainer, sympy evaluating
\\boxed{9^{9^{9}}} is one C integer operation that holds the GIL: from a thread no in-process
deadline stops it and the whole process stalls. Real math-verify, real sandbox, real workers.

Bounds on time here are generous "the limit plus a margin" checks, never speed targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from reinforge.rewards import MathVerifyVerifier, RewardFunction, VerifierTimeout
from reinforge.rewards.isolated import _MATH_GRACE_S, IsolatedMath
from reinforge.rewards.scorer_worker import math_score
from reinforge.tasks import Example

ROOT = Path(__file__).resolve().parents[1]
LIMIT_S = 1.0
MARGIN_S = 20.0  # a busy 2-core machine; a worker restart imports sympy and math-verify
BOMBS = [  # each runs for minutes to hours in math-verify, in one C call or in Python
    r"9^{9^{9}}",  # one integer power, over a billion bits
    r"1e999999999",  # read as 1 \times 10^{999999999}
    r"(10^{7})!",
    r"2^{2^{2^{2^{2^{2}}}}}",
    "+".join(["1"] * 20000),  # a long sum: sympy's simplification
]
HONEST = [  # (reference, answer, correct)
    ("1/2", "0.5", True), ("0.5", r"\frac{1}{2}", True), (r"\frac12", "0.5", True), ("3", "3.0", True),
    ("x+1", "1+x", True), (r"\sqrt{2}", "2^{1/2}", True), ("{1,2}", "{2,1}", True), ("100000", "1e5", True),
    ("0.00025", "2.5E-4", True), ("1234", "1,234", True), ("18", "18", True), ("-7", "7", False),
    ("1/2", "1/3", False), (r"\frac{\sqrt{3}}{2}", r"\sqrt{3}/2", True), (r"2\pi", "6.283185", True),
    ("(1,2)", "(2,1)", False), (r"[0, \infty)", r"[0,\infty)", True), ("x=2", "2", True),
    (r"x^2+2x+1", "(x+1)^2", True), (r"3+4i", r"4i+3", True), ("50\\%", "0.5", True),
    (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix}1\\2\end{pmatrix}", True),
    (r"\frac{3}{4}", "0.75", True), (r"6\sqrt{2}", r"\sqrt{72}", True), ("1000000", "10^6", True),
    (r"\frac{1}{3}", "0.33", False), (r"\text{Monday}", "Monday", True), ("2^{10}", "1024", True),
    ("5!", "120", True), ("1.5", r"\frac32", True), ("12", "12.00", True), ("7", "seven", False),
]


def _ex(answer: str | None, id_: str = "x") -> Example:
    return Example(id_, [{"role": "user", "content": "q"}], answer, {})


@pytest.fixture(scope="module")
def mv():
    return MathVerifyVerifier(timeout_s=LIMIT_S)


def _children() -> set[int]:
    """This process's child processes (each pool worker is one: its sandbox's launcher)."""
    out = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
            except OSError:
                continue
            if stat[stat.rindex(")") + 2:].split()[1] == str(os.getpid()) and stat[stat.rindex(")") + 2] != "Z":
                out.add(int(d))
    return out


def test_a_bomb_scored_from_a_worker_thread_stops_at_the_limit():
    # In a child process: before the pool, this froze the whole process (the GIL held by one
    # integer power), so only a process of its own can show the hang.
    code = f"""
import json, sys, threading, time
from reinforge.rewards import MathVerifyVerifier, RewardFunction
from reinforge.tasks import Example
fn = RewardFunction([(MathVerifyVerifier(timeout_s={LIMIT_S}), 1.0)])
ex = Example("x", [], "1", {{}})
out = {{}}
def score():
    t = time.monotonic()
    o = fn(["<answer>9^{{9^{{9}}}}</answer>", "<answer>1</answer>"], [ex, ex])
    out.update(elapsed=time.monotonic() - t, rewards=[x.reward for x in o], errors=o[0].errors)
th = threading.Thread(target=score)
th.start()
th.join()
print(json.dumps(out))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       timeout=LIMIT_S + _MATH_GRACE_S + 120)  # start-up included
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["rewards"] == [0.0, 1.0]
    assert "VerifierTimeout" in out["errors"][0]
    assert out["elapsed"] < LIMIT_S + _MATH_GRACE_S + MARGIN_S


@pytest.mark.parametrize("bomb", BOMBS, ids=["power", "scientific", "factorial", "tower", "long sum"])
def test_bombs_time_out_in_any_thread_and_score_0(mv, bomb):
    fn = RewardFunction([(mv, 1.0)])

    def score():
        t = time.monotonic()
        out = fn([f"<answer>{bomb}</answer>", "<answer>3</answer>"], [_ex("1"), _ex("3")])
        return out, time.monotonic() - t

    with ThreadPoolExecutor(max_workers=1) as pool:
        in_thread = pool.submit(score).result()
    for out, elapsed in (score(), in_thread):  # main thread, then a worker thread
        assert out[0].reward == 0.0 and out[0].correct is False
        assert "VerifierTimeout" in out[0].errors[0]
        assert out[1].reward == 1.0 and out[1].correct
        assert elapsed < LIMIT_S + _MATH_GRACE_S + MARGIN_S
    assert fn.error_count == 2


def test_honest_answers_score_in_any_thread(mv):
    cases = [(f"<answer>{a}</answer>", _ex(ref)) for ref, a, _ in HONEST]
    expected = [ok for _, _, ok in HONEST]
    assert [r.correct for r in mv.score_batch(*zip(*cases))] == expected
    with ThreadPoolExecutor(max_workers=2) as pool:  # single calls from two threads at once
        assert [r.correct for r in pool.map(lambda c: mv(*c), cases)] == expected
    assert mv("<answer>3</answer>", _ex("3")).score == 1.0  # the main thread, one call
    r = mv("<answer>!!!</answer>", _ex("1/2"))
    assert r.score == 0.0 and r.correct is False
    assert mv("no tags", _ex("1/2")).details == {"extracted": None}
    with pytest.raises(ValueError, match="no reference answer"):
        mv("<answer>1</answer>", _ex(None))


def test_the_pool_gives_the_in_process_scores(mv):
    # math_score is what the verifier ran in the trainer before (moved, unchanged).
    answers = [a for _, a, _ in HONEST] + ["x", r"\sqrt{", "1,2", "-0", "0012", "3,"]
    refs = [ref for ref, _, _ in HONEST] + ["x", "1", "{1,2}", "0", "12", "3"]
    here = [math_score(a, r) for a, r in zip(answers, refs)]
    pooled = mv.scorer.score_batch(answers, refs)
    assert [p["score"] for p in pooled] == [s for s, _ in here]
    assert [bool(p.get("unparsed")) for p in pooled] == [not parsed for _, parsed in here]
    assert [s for s, _ in here[: len(HONEST)]] == [float(ok) for _, _, ok in HONEST]


def test_a_late_worker_answers_timeout_and_lives_on(mv):
    pool = mv.scorer.pool
    mv.score_batch(["<answer>1</answer>"] * pool.size, [_ex("1")] * pool.size)  # all started
    procs = [w.proc for w in pool._workers]
    with pytest.raises(VerifierTimeout, match="no result within 1 s"):
        mv("<answer>9^{9^{9}}</answer>", _ex("1"))
    assert [w.proc for w in pool._workers] == procs  # stopped by its own alarm, not replaced
    assert mv("<answer>2</answer>", _ex("2")).correct


def test_a_silent_worker_is_killed_and_replaced_without_leaks():
    threads, children = threading.active_count(), _children()
    m = IsolatedMath(timeout_s=0.5)
    m.options = m.options[:2] + (None,)  # the worker sets no alarm of its own: the trainer's kill
    t = time.monotonic()
    out = m.score_batch([r"9^{9^{9}}", r"10^{10^{10}}", "2"], ["1", "1", "2"])
    assert [getattr(o, "kind", None) for o in out[:2]] == ["timeout", "timeout"]
    assert "replaced" in str(out[0]) and out[2] == {"score": 1.0}
    assert time.monotonic() - t < 2 * (0.5 + _MATH_GRACE_S) + MARGIN_S
    for _ in range(2):  # more kills and restarts: the process count stays at the pool's size
        m.score_batch([r"9^{9^{9}}"], ["1"])
    assert m.score_batch(["1/2"], ["0.5"]) == [{"score": 1.0}]
    assert threading.active_count() <= threads + m.pool.size  # each worker's stderr reader
    assert len(_children() - children) <= m.pool.size


def test_the_timeout_option_is_honoured():
    assert MathVerifyVerifier(timeout_s=2.5).scorer.options[2] == 2.5
    assert MathVerifyVerifier(timeout_s=None).scorer.options[2] is None  # no limit
    assert MathVerifyVerifier(timeout_s=0).scorer.options[2] is None
    fast = MathVerifyVerifier(timeout_s=0.3)
    t = time.monotonic()
    with pytest.raises(VerifierTimeout, match="0.3 s"):
        fast("<answer>(10^{7})!</answer>", _ex("1"))
    assert time.monotonic() - t < 0.3 + _MATH_GRACE_S + MARGIN_S
