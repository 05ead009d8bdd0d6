"""Code tasks and the code verifier: the JSONL format, the bundled problems (every reference
solution passes in the real sandbox), code extraction, comparison, partial credit, config
wiring, program-aided answers on reasoning-gym, and training steps on the code task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reinforge.config import RewardConfig, VerifierSpec, build_config, load_config
from reinforge.rewards import build_reward
from reinforge.rewards.code import CodeVerifier, extract_code, result_cap, stdout_matches, values_equal
from reinforge.tasks import CodeTask, Example, ReasoningGymTask, TaskError, build_task
from reinforge.tasks.code_task import BUNDLED_CODE_SETS, bundled_code_path, load_code_problems

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = [json.loads(line) for line in bundled_code_path("basic").read_text().splitlines()]


@pytest.fixture(scope="module")
def verifier():
    return CodeVerifier(timeout_s=2.0)


def _ex(meta: dict, id_: str = "x") -> Example:
    return Example(id_, [], None, meta)


def _fenced(code: str) -> str:
    return f"Here is my solution:\n```python\n{code}```\nIt works."


# -- the bundled problems ------------------------------------------------------------------------


def test_bundled_set_is_well_formed_and_varied():
    assert list(BUNDLED_CODE_SETS) == ["basic"]
    rows = load_code_problems(bundled_code_path("basic"))
    assert len(rows) >= 30
    assert len({r["id"] for r in rows}) == len(rows)
    assert sum("entry_point" in r for r in rows) >= 30  # mostly functions...
    assert sum("entry_point" not in r for r in rows) >= 4  # ...and some stdin/stdout programs
    assert all(len(r["tests"]) >= 4 and r.get("solution") for r in rows)


def test_every_reference_solution_passes_in_the_sandbox(verifier):
    task = CodeTask(name="basic", eval_size=5)
    examples = [*task.train_examples(), *task.eval_examples()]
    solutions = {r["id"]: r["solution"] for r in BUNDLED}
    results = verifier.score_batch([_fenced(solutions[e.metadata["id"]]) for e in examples], examples)
    failed = {e.metadata["id"]: r.details["reason"] for e, r in zip(examples, results) if r.score != 1.0}
    assert not failed
    assert len(examples) == len(BUNDLED)


def test_code_task_split_prompts_and_metadata():
    a = CodeTask(name="basic", eval_size=8, seed=0)
    b = CodeTask(name="basic", eval_size=8, seed=0)
    c = CodeTask(name="basic", eval_size=8, seed=1)
    ids = lambda xs: [e.id for e in xs]  # noqa: E731
    assert ids(a.eval_examples()) == ids(b.eval_examples()) != ids(c.eval_examples())
    assert not set(ids(a.train_examples())) & set(ids(a.eval_examples()))
    assert len(a.train_examples()) + len(a.eval_examples()) == len(BUNDLED)
    ex = next(e for e in a.train_examples() if e.metadata["id"] == "sum_list")
    assert ex.id == "code:basic/train/sum_list" and ex.answer is None
    text = ex.messages[-1]["content"]
    assert "sum_list(xs)" in text and "```python\ndef sum_list(xs: list[int]) -> int:\n```" in text
    assert "solution" not in ex.metadata  # the reference solution never travels with the prompt
    assert "return sum(xs)" not in text
    with pytest.raises(TaskError, match=r"use reward.verifiers=\[\{name: code\}\]"):
        a.score("anything", ex)


def test_jsonl_errors_name_the_line_and_the_fix(tmp_path):
    def write(rows):
        p = tmp_path / "p.jsonl"
        p.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
        return p

    good = {"id": "a", "prompt": "p", "entry_point": "f", "tests": [{"args": [1], "expected": 1}]}
    cases = [
        (["{not json"], r"line 1 is not valid JSON"),
        ([{"tests": []}], r"line 1 needs a non-empty string field 'prompt'"),
        ([{"prompt": "p", "tests": []}], r"needs a non-empty list field 'tests'"),
        ([{"prompt": "p", "entry_point": "f", "tests": [{"args": [1]}]}],
         r"tests\[0\]: a function problem's test is \{\"args\""),
        ([{"prompt": "p", "tests": [{"stdin": "x"}]}], r"a stdin/stdout problem, whose test is"),
        ([{"prompt": "p", "entry_point": "not a name", "tests": [{"args": [], "expected": 1}]}],
         r"'entry_point' must be a Python function name"),
        ([good, good], r"line 2: id 'a' is used twice"),
    ]
    for rows, message in cases:
        with pytest.raises(TaskError, match=message):
            load_code_problems(write(rows))
    with pytest.raises(TaskError, match=r"no bundled code problem set 'nope'; bundled: basic"):
        CodeTask(name="nope")
    with pytest.raises(TaskError, match=r"task.eval_size=50 but code:basic has only"):
        CodeTask(name="basic", eval_size=50)


def test_user_jsonl_file_with_both_kinds_of_problem(tmp_path, verifier):
    rows = [
        {"id": "double", "prompt": "Write double(x).", "entry_point": "double",
         "tests": [{"args": [2], "expected": 4}, {"args": [], "kwargs": {"x": -1}, "expected": -2}]},
        {"id": "echo", "prompt": "Echo stdin.", "tests": [{"stdin": "a b\n", "stdout": "a b"}]},
        {"id": "pad", "prompt": "p", "entry_point": "f", "tests": [{"args": [], "expected": None}]},
    ]
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = build_task(build_config({"task": {"source": "code", "path": str(path), "eval_size": 1,
                                             "seed": 3}}).task)
    assert task.name == "code:mine.jsonl"
    by_id = {e.metadata["id"]: e for e in [*task.train_examples(), *task.eval_examples()]}
    out = verifier.score_batch(
        [_fenced("def double(x):\n    return 2 * x\n"), _fenced("import sys\nprint(sys.stdin.read(), end='')\n")],
        [by_id["double"], by_id["echo"]],
    )
    assert [r.score for r in out] == [1.0, 1.0]


# -- extraction and comparison --------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, entry, expected",
    [
        ("```python\nA\n```", None, "A\n"),
        ("```python\nx = 1```", None, "x = 1"),  # the closing fence on the code's last line
        ("text\n```python\nA\n```\nmore\n```python\nB\n```\nend", None, "B\n"),  # last block
        ("```py\nA\n```", None, "A\n"),
        ("```\nA\n```", None, "A\n"),  # unlabelled
        ("```bash\nls\n```\n```python\nA\n```\n```text\nout\n```", None, "A\n"),  # Python wins
        ("```bash\nls\n```", None, "ls\n"),  # only another language: used anyway
        ("```python\ndef f(x):\n    return x\n```\nUsage:\n```python\nprint(f(1))\n```", "f",
         "def f(x):\n    return x\n"),  # the block that defines the entry point
        ("```python\nA\n```\n```python\ndef f():\n    pass\n", None, "def f():\n    pass\n"),  # cut off
        ("def f(x):\n    return x", "f", "def f(x):\n    return x"),  # no fences: the whole text
        ("", None, None),
        ("   \n", None, None),
    ],
)
def test_extract_code(completion, entry, expected):
    assert extract_code(completion, entry) == expected


@pytest.mark.parametrize(
    "got, expected, equal",
    [
        (6, 6, True), (6.0, 6, True), (0.1 + 0.2, 0.3, True), (1.0, 1.001, False),
        # an integer is compared exactly: comb(40, 20) = 137846528820, not a float 1e-6 away
        (137846444778.7, 137846528820, False), (137846528820.0, 137846528820, True),
        (2**60 + 1.0, 2**60 + 1, False), (0.5, 1, False),
        (10**400, 1.5, False), (10**400, float("inf"), False), (-(10**400), 0.0, False),
        (3, 3.0000001, True), (3, 3.1, False),
        (True, 1, False), (1, True, False), (True, True, True), (None, None, True), (0, None, False),
        ([1, 2], [1, 2], True), ([1, 2], [2, 1], False), ([[1]], [[1.0]], True),
        ({"a": 1}, {"a": 1}, True), ({"a": 1}, {"a": 1, "b": 2}, False), ("1", 1, False),
        (float("nan"), float("nan"), True), (float("inf"), float("inf"), True),
    ],
)
def test_values_equal(got, expected, equal):
    assert values_equal(got, expected) is equal


def test_result_cap_scales_with_the_expected_value():
    assert result_cap(5) == 4096 + 8 and result_cap("x" * 1000) == 4096 + 8 * 1002


def test_stdout_matches_ignores_only_trailing_whitespace():
    assert stdout_matches("a \nb\n\n\n", "a\nb")
    assert stdout_matches("a\r\nb\r\n", "a\nb\n")
    assert not stdout_matches(" a\nb", "a\nb")
    assert not stdout_matches("a\n\nb", "a\nb")


# -- verdicts, partial credit, reasons ------------------------------------------------------------

ADD3 = {"id": "add", "entry_point": "add",
        "tests": [{"args": [1, 2], "expected": 3}, {"args": [0, 0], "expected": 0},
                  {"args": [-5, 2], "expected": -3}, {"args": [10, 10], "expected": 20}]}


def test_partial_credit_and_correctness(verifier):
    partial = CodeVerifier(partial_credit=True, timeout_s=1.0)
    codes = {
        "right": "def add(a, b):\n    return a + b\n",
        "half": "def add(a, b):\n    return a + b if a >= 0 and a < 5 else 0\n",  # tests 0, 1 pass
        "crash_on_one": "def add(a, b):\n    if a < 0:\n        raise ValueError('neg')\n    return a + b\n",
        "tuple_ok": "def add(a, b):\n    return (a + b)\n",
        "none": "def add(a, b):\n    pass\n",
    }
    completions = [_fenced(c) for c in codes.values()]
    full = verifier.score_batch(completions, [_ex(ADD3)] * len(codes))
    part = partial.score_batch(completions, [_ex(ADD3)] * len(codes))
    assert [r.score for r in full] == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert [r.score for r in part] == [1.0, 0.5, 0.75, 1.0, 0.0]
    assert [r.correct for r in part] == [True, False, False, True, False]  # correct = all pass
    assert part[2].details["tests"] == ["passed", "passed", "runtime error: ValueError: neg", "passed"]
    assert part[1].details["passed"] == 2 and part[1].details["total"] == 4


def test_reasons_are_clear(verifier):
    fast = CodeVerifier(timeout_s=1.0, memory_mb=256, max_output_bytes=10_000)
    shout = {"id": "s", "tests": [{"stdin": "a\n", "stdout": "A\n"}]}
    cases = [
        ("def add(a, b):\n    while True:\n        pass\n", ADD3, "timeout: more than 1 s"),
        ("def add(a, b):\n    return bytearray(10**11)\n", ADD3, "memory limit"),
        ("def add(a, b):\n    return [0] * 10**4\n", ADD3, "wrong answer (the return value is far larger"),
        ("while True:\n    print('x' * 1000)\n", shout, "output limit: more than 10000 bytes"),
        ("def add(a, b):\n    return a / 0\n", ADD3, "runtime error: ZeroDivisionError: division by zero"),
        ("def add(a, b) return", ADD3, "runtime error: SyntaxError"),
        ("def plus(a, b):\n    return a + b\n", ADD3, "runtime error: NameError: the code defines no function named 'add'"),
        ("def add(a, b):\n    return {1, 2}\n", ADD3, "runtime error: TypeError: a value of type set is not plain data"),
        ("import os\nos.kill(os.getpid(), 11)\n", shout, "crashed: killed by SIGSEGV"),
        ("print('a')", shout, "wrong answer"),
    ]
    results = fast.score_batch([_fenced(c) for c, _, _ in cases], [_ex(m) for _, m, _ in cases])
    for (code, _, reason), r in zip(cases, results):
        assert r.score == 0.0 and reason in r.details["reason"], (code, r.details["reason"])
    (no_code,) = verifier.score_batch([""], [_ex(ADD3)])
    assert no_code.score == 0.0 and no_code.details["reason"] == "no code in the completion"


def test_a_huge_integer_where_a_float_is_expected_is_a_wrong_answer(verifier):
    half = {"id": "half", "entry_point": "half", "tests": [{"args": [1], "expected": 0.5},
                                                          {"args": [3], "expected": 1.5}]}
    out = verifier.score_batch([_fenced("def half(x):\n    return 10**400\n"),
                                _fenced("def half(x):\n    return x / 2\n")], [_ex(half)] * 2)
    assert isinstance(out[0].score, float) and out[0].score == 0.0
    assert out[0].details["tests"] == ["wrong answer", "wrong answer"] and out[1].score == 1.0


HONEST_STDIO = {
    "main in a thread with a big stack": (
        "import sys, threading\n"
        "def main():\n    print(input().upper())\n"
        "threading.stack_size(64 << 20)\nsys.setrecursionlimit(10**6)\n"
        "threading.Thread(target=main).start()\n"),
    "output from an atexit handler": (
        "import atexit\nline = input()\natexit.register(lambda: print(line.upper()))\n"),
    "closes stdout at the end": (
        "import sys\nsys.stdout.write(input().upper() + '\\n')\nsys.stdout.close()\n"),
    "buffered output and exit()": (
        "import sys\nout = [input().upper()]\nsys.stdout.write('\\n'.join(out) + '\\n')\nexit()\n"),
    "half a megabyte of debug output per test": (
        "import sys\nsys.stderr.write('debug ' * 85_000)\nprint(input().upper())\n"),
}


@pytest.mark.parametrize("name", list(HONEST_STDIO))
def test_honest_stdio_programs_behave_as_under_a_plain_interpreter(name, verifier):
    shout = {"id": "s", "tests": [{"stdin": "ab\n", "stdout": "AB\n"}, {"stdin": "cd\n", "stdout": "CD\n"}]}
    (r,) = verifier.score_batch([_fenced(HONEST_STDIO[name])], [_ex(shout)])
    assert r.score == 1.0, r.details


def test_the_trainer_never_parses_a_return_value_far_larger_than_expected(verifier):
    import tracemalloc

    code = _fenced("def add(a, b):\n    return [{}] * 200_000\n")  # ~1 MB of JSON per test
    tracemalloc.start()
    try:
        (r,) = verifier.score_batch([code], [_ex(ADD3)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.score == 0.0 and "far larger than the expected one" in r.details["reason"]
    assert peak < 2 << 20  # a few kilobytes per test reach this process, never the objects


def test_identical_programs_run_once(verifier, monkeypatch):
    calls = []
    real = verifier.sandbox.map
    monkeypatch.setattr(verifier.sandbox, "map", lambda jobs: calls.append(len(jobs)) or real(jobs))
    code = _fenced("def add(a, b):\n    return a + b\n")
    out = verifier.score_batch([code, code, code, _fenced("def add(a, b):\n    return 0\n")], [_ex(ADD3)] * 4)
    assert calls == [2] and [r.score for r in out] == [1.0, 1.0, 1.0, 0.0]


def test_missing_tests_is_an_error_not_a_zero(verifier):
    (out,) = verifier.score_batch(["```python\nprint(1)\n```"], [_ex({"question": "q"})])
    assert isinstance(out, TaskError) and "stdout_answer" in str(out)


# -- program-aided answers on reasoning-gym ----------------------------------------------------------


def test_stdout_answer_mode_scores_the_program_output_with_the_task():
    task = ReasoningGymTask("basic_arithmetic", train_size=4, eval_size=2, seed=0)
    ex = task.train_examples()[0]
    v = CodeVerifier(task, mode="stdout_answer", timeout_s=2.0)
    right = f"I will compute it.\n```python\nprint({ex.answer!r})\n```"
    wrong = "```python\nprint('no idea')\n```"
    crash = "```python\nraise SystemExit(3)\n```"
    r_right, r_wrong, r_crash = v.score_batch([right, wrong, crash], [ex] * 3)
    assert (r_right.score, r_right.correct) == (1.0, True)
    assert r_right.details["extracted"] == ex.answer
    assert r_wrong.score == 0.0 and r_crash.score == 0.0
    assert "exit code 3" in r_crash.details["reason"]
    with pytest.raises(ValueError, match="needs the task"):
        CodeVerifier(None, mode="stdout_answer")


# -- config wiring --------------------------------------------------------------------------------


def test_config_builds_code_task_and_verifier():
    cfg = build_config({"task": {"source": "code", "name": "basic", "eval_size": 5},
                        "reward": {"verifiers": [{"name": "code", "options": {"partial_credit": True,
                                                                              "timeout_s": 1}}]}})
    task = build_task(cfg.task)
    fn = build_reward(cfg.reward, task)
    verifier = fn._entries[0][1]
    assert isinstance(task, CodeTask) and isinstance(verifier, CodeVerifier)
    assert verifier.partial_credit and verifier.timeout_s == 1.0


def test_config_errors_name_the_fix():
    task = CodeTask(name="basic", eval_size=5)
    with pytest.raises(ValueError, match=r"scored by the 'code' verifier; set reward.verifiers=\[\{name: code\}\]"):
        build_reward(RewardConfig(), task)  # the default 'task' verifier cannot score code
    bad = RewardConfig(verifiers=[VerifierSpec(name="code", options={"time_limit": 1})])
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'time_limit'.*accepted: mode, partial_credit, timeout_s"):
        build_reward(bad, task)
    bad = RewardConfig(verifiers=[VerifierSpec(name="code", options={"mode": "vibes"})])
    with pytest.raises(ValueError, match=r"options \(code verifier\).*unknown mode 'vibes'; accepted: tests, stdout_answer"):
        build_reward(bad, task)
    bad = RewardConfig(verifiers=[VerifierSpec(name="code", options={"isolation": "none"})])
    with pytest.raises(ValueError, match=r"isolation must be one of full, best_effort"):
        build_reward(bad, task)
    with pytest.raises(TaskError, match=r"no bundled code problem set 'leg_counting'"):
        build_task(build_config({"task": {"source": "code"}}).task)  # neither path nor a set name


def test_shipped_code_config_is_valid():
    cfg = load_config(ROOT / "configs" / "code.yaml")
    assert cfg.task.source == "code" and cfg.reward.verifiers[0].name == "code"
    task = build_task(cfg.task)
    assert len(task.eval_examples()) == cfg.task.eval_size
    build_reward(cfg.reward, task)


# -- through the trainer's reward path, and a training step -----------------------------------------

HONEST = "```python\ndef sum_list(xs):\n    return sum(xs)\n```"
MALICIOUS = {
    "fork bomb": "```python\nimport os\ndef sum_list(xs):\n    while True:\n        os.fork()\n```",
    "print passed": "```python\nprint('all tests passed')\ndef sum_list(xs):\n    print('passed')\n```",
    "exit early": "```python\nimport sys\nsys.exit(0)\n```",
    "always equal": "```python\nclass E(int):\n    __eq__ = lambda s, o: True\ndef sum_list(xs):\n    return E(-1)\n```",
    "read host": "```python\ndef sum_list(xs):\n    return open('/etc/passwd').read()\n```",
    "infinite loop": "```python\ndef sum_list(xs):\n    while True:\n        pass\n```",
    "kill all": "```python\nimport os\ndef sum_list(xs):\n    os.kill(-1, 9)\n```",
}


def test_reward_over_a_mixed_batch_of_honest_and_malicious_completions():
    cfg = build_config({"task": {"source": "code", "name": "basic", "eval_size": 5},
                        "reward": {"verifiers": [{"name": "code", "options": {"timeout_s": 1.0}},
                                                 {"name": "format", "weight": 0.0}],
                                   "answer_format": "raw"}})
    task = build_task(cfg.task)
    fn = build_reward(cfg.reward, task)
    ex = next(e for e in [*task.train_examples(), *task.eval_examples()] if e.metadata["id"] == "sum_list")
    completions = [HONEST, *MALICIOUS.values(), HONEST]
    outcomes = fn(completions, [ex] * len(completions))
    assert [o.reward for o in outcomes] == [1.0] + [0.0] * len(MALICIOUS) + [1.0]
    assert [o.correct for o in outcomes] == [True] + [False] * len(MALICIOUS) + [True]
    assert all(not o.errors for o in outcomes)  # a malicious program is a 0, not an error
    assert fn.error_count == 0


def test_one_training_step_on_the_code_task(tmp_path, tiny_model_dir):
    from reinforge.trainer import Trainer
    from reinforge.tracking import RunDir

    cfg = build_config({}, [
        f"model.path={tiny_model_dir}",
        "task.source=code", "task.name=basic", "task.eval_size=2", "task.train_size=8",
        "reward.verifiers=[{name: code, options: {timeout_s: 1.0, partial_credit: true}}]",
        "rollout.num_samples=2", "rollout.max_new_tokens=8",
        "trainer.prompts_per_step=2", "trainer.steps=1", "trainer.eval_every=0",
        "trainer.eval_at_start=false", "trainer.checkpoint_every=0",
        f"tracking.output_dir={tmp_path / 'runs'}", "tracking.progress=false",
    ])
    result = Trainer(cfg).run()
    metrics = RunDir.open(result.run_dir).read_metrics()
    assert len(metrics) == 1 and metrics[0]["reward_errors"] == 0.0
    assert RunDir.open(result.run_dir).status()["state"] == "finished"
