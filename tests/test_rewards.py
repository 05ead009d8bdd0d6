"""Rewards: answer extraction, real math-verify, real reasoning-gym scoring, composition."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from reinforge.config import RewardConfig, VerifierSpec
from reinforge.rewards import (
    ExactMatchVerifier,
    FormatVerifier,
    MathVerifyVerifier,
    RewardFunction,
    TaskVerifier,
    VerifierResult,
    VerifierTimeout,
    build_reward,
    call_with_deadline,
    extract_answer,
    is_well_formed,
)
from reinforge.tasks import Example, ReasoningGymTask


@pytest.fixture(scope="module")
def legs():
    task = ReasoningGymTask("leg_counting", train_size=8, eval_size=2, seed=0)
    return task, task.train_examples()[0]


def _ex(answer: str | None, id_: str = "x") -> Example:
    return Example(id_, [{"role": "user", "content": "q"}], answer, {})


# -- extraction ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("think... <answer> 42 </answer>", "42"),
        ("<answer>1</answer> then <answer>2</answer>", "2"),  # last wins
        ("<answer>1</answer> then <answer>2", "1"),  # an unclosed last answer is ignored
        ("<answer>x <answer>y</answer>", "y"),  # an inner opener restarts the content
        ("<answer>\nmulti\nline\n</answer>", "multi\nline"),
        ("<answer></answer>", ""),
        ("no tags at all", None),
        ("</answer> before <answer>", None),
        ("", None),
    ],
)
def test_extract_tags(completion, expected):
    assert extract_answer(completion, "tags") == expected


@pytest.mark.parametrize(
    "completion, expected",
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{1} or \boxed{ {a}^{2} }", "{a}^{2}"),  # last wins
        (r"\boxed{1} then \boxed{\frac{1}{2}", "1"),  # an unbalanced (truncated) last one is skipped
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are literal
        (r"\boxed {7}", "7"),
        ("no box", None),
        ("", None),
    ],
)
def test_extract_boxed(completion, expected):
    assert extract_answer(completion, "boxed") == expected


def test_extract_last_line_and_raw():
    assert extract_answer("a\n  b  \n\n  \n", "last_line") == "b"
    assert extract_answer("", "last_line") is None
    assert extract_answer("  a b \n", "raw") == "a b"
    assert extract_answer("", "raw") == ""
    with pytest.raises(ValueError, match="accepted: tags, boxed, last_line, raw"):
        extract_answer("x", "xml")


@pytest.mark.parametrize(
    "completion, fmt, ok",
    [
        ("<answer>4</answer>", "tags", True),
        ("<answer>4</answer><answer>5</answer>", "tags", False),
        ("<answer> </answer>", "tags", False),
        ("</answer>4<answer>", "tags", False),
        ("<answer>4", "tags", False),
        (r"\boxed{4}", "boxed", True),
        (r"\boxed{4} \boxed{5}", "boxed", False),
        (r"\boxed{}", "boxed", False),
        (r"\boxed{4", "boxed", False),
        ("x", "raw", True),
        ("  \n", "raw", False),
        ("a\nb", "last_line", True),
        ("", "last_line", False),
    ],
)
def test_format_well_formed(completion, fmt, ok):
    assert is_well_formed(completion, fmt) is ok
    assert FormatVerifier(answer_format=fmt)(completion, _ex("4")).score == float(ok)


# -- verifiers ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reference, answer",
    [
        ("1/2", "0.5"),
        ("0.5", r"\frac{1}{2}"),
        (r"\frac{1}{2}", "1/2"),
        (r"\frac12", "0.5"),
        ("3", "3.0"),
        ("x+1", "1+x"),
        (r"\sqrt{2}", r"2^{1/2}"),
        ("{1,2}", "{2,1}"),
        ("100000", "1e5"),
        ("0.00025", "2.5E-4"),
        ("1234", "1,234"),
    ],
)
def test_math_verify_equivalences(reference, answer):
    result = MathVerifyVerifier()(f"<answer>{answer}</answer>", _ex(reference))
    assert result.score == 1.0 and result.correct is True


def test_math_verify_rejects_wrong_and_unparsable_answers():
    mv = MathVerifyVerifier()
    assert mv("<answer>1/3</answer>", _ex("1/2")).correct is False
    r = mv("<answer>!!!</answer>", _ex("1/2"))
    assert r.score == 0.0 and r.correct is False
    assert mv("no tags", _ex("1/2")).details == {"extracted": None}
    assert MathVerifyVerifier(answer_format="boxed")(r"so \boxed{\frac{2}{4}}", _ex("0.5")).correct


def test_math_verify_works_from_worker_threads():
    mv = MathVerifyVerifier()
    cases = [("<answer>0.5</answer>", _ex("1/2")), ("<answer>3</answer>", _ex("4"))] * 4
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda c: mv(*c), cases))
    assert [r.correct for r in results] == [True, False] * 4


def test_math_verify_timeout_in_main_thread_is_an_error_not_a_hang():
    # sympy would expand 9^(9^(9^9)) for hours; the limit stops it and the batch goes on.
    fn = RewardFunction([(MathVerifyVerifier(timeout_s=0.5), 1.0)])
    out = fn(["<answer>9^{9^{9^{9}}}</answer>", "<answer>3</answer>"], [_ex("3"), _ex("3")])
    assert out[0].reward == 0.0 and out[0].correct is False
    assert "VerifierTimeout" in out[0].errors[0]
    assert out[1].reward == 1.0 and out[1].correct and fn.error_count == 1


def test_deadline_in_worker_thread_and_nested():
    def spin():
        while True:
            pass

    def worker():
        with pytest.raises(VerifierTimeout):
            call_with_deadline(spin, 0.2)
        return call_with_deadline(lambda: 5, 1.0)

    with ThreadPoolExecutor(max_workers=1) as pool:
        assert pool.submit(worker).result() == 5

    def inner():
        try:
            call_with_deadline(spin, 0.1)
        except VerifierTimeout:
            return "inner"

    assert call_with_deadline(inner, 5.0) == "inner"
    with pytest.raises(VerifierTimeout, match="0.2 s"):
        call_with_deadline(lambda: call_with_deadline(spin, 10.0), 0.2)
    assert threading.main_thread() is threading.current_thread()


def test_exact_match():
    em = ExactMatchVerifier()
    assert em("<answer>  Paris. </answer>", _ex("paris")).correct is True
    assert em("<answer>New   York</answer>", _ex("new york")).correct is True
    assert em("<answer>London</answer>", _ex("Paris")).score == 0.0
    cs = ExactMatchVerifier(case_sensitive=True)
    assert cs("<answer>paris</answer>", _ex("Paris")).correct is False
    assert cs("<answer>Paris.</answer>", _ex("Paris")).correct is True


def test_task_verifier_partial_credit_is_not_correct(legs):
    task, ex = legs
    tv = TaskVerifier(task)
    right = tv(f"<answer>{ex.answer}</answer>", ex)
    assert right.score == 1.0 and right.correct is True
    partial = tv(f"<answer>{ex.answer} legs</answer>", ex)  # reasoning-gym gives partial credit
    assert 0.0 < partial.score < 1.0 and partial.correct is False
    assert tv(ex.answer, ex).score == 0.0  # no tags: nothing extracted, nothing scored


# -- composition --------------------------------------------------------------------------------


def test_composition_weights_and_components(legs):
    task, ex = legs
    fn = RewardFunction([(TaskVerifier(task), 1.0), (FormatVerifier(), 0.25)])
    right, partial, no_tags = fn(
        [f"<answer>{ex.answer}</answer>", f"<answer>{ex.answer} legs</answer>", ex.answer], [ex] * 3
    )
    assert right.reward == pytest.approx(1.25) and right.correct
    assert right.components == {"task": 1.0, "format": 1.0} and right.errors == []
    p = partial.components["task"]
    assert partial.reward == pytest.approx(p + 0.25) and not partial.correct
    assert no_tags.reward == 0.0 and not no_tags.correct


def test_format_alone_never_makes_a_sample_correct(legs):
    task, ex = legs
    fn = RewardFunction([(FormatVerifier(), 1.0)])
    (out,) = fn([f"<answer>{ex.answer}</answer>"], [ex])
    assert out.reward == 1.0 and out.correct is False


def test_repeated_verifier_names_get_distinct_components():
    fn = RewardFunction([(ExactMatchVerifier(), 1.0), (ExactMatchVerifier(case_sensitive=True), 2.0)])
    (out,) = fn(["<answer>paris</answer>"], [_ex("Paris")])
    assert out.components == {"exact_match": 1.0, "exact_match_2": 0.0}
    assert out.reward == 1.0 and out.correct


class _Boom:
    name = "boom"

    def __call__(self, completion, example):
        raise RuntimeError("verifier bug " + completion)


class _NaN:
    name = "nan"

    def __call__(self, completion, example):
        return VerifierResult(float("nan"))


def test_raising_verifier_scores_zero_is_counted_and_warned_once(caplog):
    fn = RewardFunction([(_Boom(), 1.0), (ExactMatchVerifier(), 2.0), (_NaN(), 1.0)])
    with caplog.at_level(logging.WARNING, logger="reinforge.rewards"):
        outs = fn(["<answer>a</answer>", "<answer>b</answer>"], [_ex("a"), _ex("a")])
        fn(["<answer>a</answer>"], [_ex("a")])
    assert [o.reward for o in outs] == [2.0, 0.0]
    assert outs[0].correct and not outs[1].correct
    assert outs[0].components == {"boom": 0.0, "exact_match": 1.0, "nan": 0.0}
    assert outs[0].errors[0].startswith("boom: RuntimeError: verifier bug")
    assert outs[0].errors[1].startswith("nan: InvalidScore: non-finite score")
    assert fn.error_count == 6
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # one per distinct (verifier, error type)


def test_correct_verdict_falls_back_to_threshold():
    class Scored:
        name = "task"

        def __init__(self, s):
            self.s = s

        def __call__(self, completion, example):
            return VerifierResult(self.s)  # no verdict of its own

    assert RewardFunction([(Scored(1.0), 1.0)])(["c"], [_ex("a")])[0].correct
    assert not RewardFunction([(Scored(0.5), 1.0)])(["c"], [_ex("a")])[0].correct
    assert RewardFunction([(Scored(0.5), 1.0)], correct_threshold=0.5)(["c"], [_ex("a")])[0].correct


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="2 completions but 1 examples"):
        RewardFunction([(FormatVerifier(), 1.0)])(["a", "b"], [_ex("a")])


def test_build_reward_from_config(legs):
    task, ex = legs
    cfg = RewardConfig(
        verifiers=[
            VerifierSpec(name="task", weight=1.0),
            VerifierSpec(name="math_verify", weight=0.5, options={"timeout_s": 2}),
            VerifierSpec(name="format", weight=0.1),
        ],
        answer_format="boxed",
    )
    fn = build_reward(cfg, task)
    (out,) = fn([rf"The total is \boxed{{{ex.answer}}}"], [ex])
    assert out.components == {"task": 1.0, "math_verify": 1.0, "format": 1.0}
    assert out.reward == pytest.approx(1.6) and out.correct


def test_build_reward_threshold_and_bad_options(legs):
    task, ex = legs
    lenient = build_reward(RewardConfig(correct_threshold=0.2), task)
    (out,) = lenient([f"<answer>{ex.answer} legs</answer>"], [ex])
    assert out.correct  # partial credit counts when the threshold says so
    bad = RewardConfig(verifiers=[VerifierSpec(name="exact_match", options={"case": True})])
    with pytest.raises(ValueError, match=r"reward\.verifiers\[0\]\.options.*'case'.*case_sensitive"):
        build_reward(bad, task)


def test_python_verifier_loads_a_users_function_from_a_file(tmp_path):
    from reinforge.config import build_config
    from reinforge.rewards import build_reward
    from reinforge.tasks import Example, build_task

    f = tmp_path / "my_rewards.py"
    f.write_text("def score(completion, example):\n    return 1.0 if example.answer in completion else 0.25\n")
    cfg = build_config({"task": {"name": "chain_sum", "train_size": 5, "eval_size": 5},
                        "reward": {"verifiers": [{"name": "python", "options": {"function": f"{f}:score"}}]}})
    rf = build_reward(cfg.reward, build_task(cfg.task))
    ex = Example(id="x", messages=[], answer="42", metadata={})
    right, wrong = rf(["it is 42", "no idea"], [ex, ex])
    assert (right.reward, right.correct) == (1.0, True)  # reaches correct_threshold=1.0
    assert (wrong.reward, wrong.correct) == (0.25, False)


def test_python_verifier_errors_name_the_fix(tmp_path):
    from reinforge.config import build_config
    from reinforge.rewards import build_reward
    from reinforge.tasks import build_task

    for options, message in [({}, "options.function is required"),
                             ({"function": "no_such_module_xyz:f"}, "cannot import module 'no_such_module_xyz'"),
                             ({"function": "os:no_such_function"}, "has no callable 'no_such_function'"),
                             ({"function": str(tmp_path / "missing.py") + ":f"}, "does not exist")]:
        cfg = build_config({"task": {"name": "chain_sum", "train_size": 5, "eval_size": 5},
                            "reward": {"verifiers": [{"name": "python", "options": options}]}})
        with pytest.raises(ValueError, match=message):
            build_reward(cfg.reward, build_task(cfg.task))
