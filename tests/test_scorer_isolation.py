"""Third-party scorers never run in the trainer: reasoning-gym's score_answer runs in sandboxed
worker processes (reinforge/rewards/isolated.py, scorer_worker.py) whose eval() and sympy
parse_expr never run code. Real reasoning-gym, real sandbox, real worker processes.

What is shown: the scan finds exactly the scorers that evaluate answers; honest answers score as
they do in-process; malicious answers on every such scorer cannot write a host file, read the
expected answer or a host secret, or stall the batch; a hung scorer is cut at its limit and
replaced while the batch goes on; and even a scorer that ran code would stay inside the sandbox.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from reinforge.config import RewardConfig, VerifierSpec
from reinforge.rewards import RewardFunction, TaskVerifier, build_reward
from reinforge.rewards.code import CodeVerifier
from reinforge.rewards.isolated import (
    EVALUATING_SCORERS,
    IsolatedScorer,
    ScorerFailure,
    ScorerPool,
    _package_paths,
)
from reinforge.sandbox import inside_path
from reinforge.tasks import ReasoningGymTask

ROOT = Path(__file__).resolve().parents[1]
WORKERS = 2


def _task(name: str) -> ReasoningGymTask:
    return ReasoningGymTask(name, train_size=4, eval_size=1, seed=0)


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scorer-host")
    secret = tmp / "secret.txt"
    token = uuid.uuid4().hex
    secret.write_text(f"SECRET-{token}")
    return {"tmp": tmp, "secret": secret, "token": token, "written": tmp / "pwned.txt"}


def _payloads(host: dict) -> dict[str, str]:
    """Python expressions a policy could write as an answer, each an attack if evaluated."""
    written, secret = str(host["written"]), str(host["secret"])
    return {
        "write a host file": f"open({written!r}, 'w').write('pwned')",
        "run a shell command": f"__import__('os').system('touch {written}')",
        "read the expected answer from the scorer's frame":
            "__import__('sys')._getframe(1).f_locals['entry']['answer']",
        "find the expected answer in memory":
            "[o for o in __import__('gc').get_objects() if isinstance(o, dict) and 'answer' in o][0]['answer']",
        "read a host secret": f"open({secret!r}).read()",
        "sleep through the batch": "__import__('time').sleep(60)",
        "equal to anything": "type('E', (), {'__eq__': lambda s, o: True, '__hash__': lambda s: 0})()",
    }


def _shapes(payload: str, reference: str) -> list[str]:
    """The answer shapes the scan found reaching eval (tests/scan_evaluating_scorers.py)."""
    return [payload, f"[{payload}]", f"[[{payload}]]", f"({payload})", f"x + {payload}",
            f"{reference} + {payload}"]


# -- which scorers evaluate their input ----------------------------------------------------------------


def test_scan_finds_exactly_the_documented_evaluating_scorers():
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "scan_evaluating_scorers.py")],
                         capture_output=True, text=True, timeout=600, check=True)
    last = out.stdout.strip().splitlines()[-1]
    found = set(json.loads(last[last.index("["):]))  # reasoning-gym prints progress dots first
    assert found == EVALUATING_SCORERS
    doc = (ROOT / "docs" / "sandbox.md").read_text()
    assert all(f"`{name}`" in doc for name in EVALUATING_SCORERS)


# -- honest answers score as before -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EVALUATING_SCORERS | {"leg_counting", "basic_arithmetic",
                                                               "number_sorting", "bitwise_arithmetic"}))
def test_isolated_scores_equal_in_process_scores_on_honest_answers(name):
    task = _task(name)
    scorer = IsolatedScorer(task, workers=WORKERS)
    answers, examples = [], []
    for ex in task.train_examples()[:3]:
        ref = ex.answer or ""
        for a in (ref, ref.replace(" ", ""), f"({ref})", "wrong", "0"):
            answers.append(a)
            examples.append(ex)
    isolated = scorer.score_batch(answers, examples)
    in_process = [float(task.score(a, e)) for a, e in zip(answers, examples)]  # honest answers only
    assert isolated == in_process
    assert isolated[0] == 1.0  # the reference answer is right


# -- malicious answers ------------------------------------------------------------------------------


def test_the_frame_attack_is_real_when_a_scorer_evaluates_in_process():
    # Why this file exists: in the trainer's process, reasoning-gym's own scorer credits this
    # answer (0.1, its score for a right answer given as a list), since the expression reads the
    # expected answer out of the scorer's frame; a wrong answer gets 0.
    task = _task("string_insertion")
    ex = task.train_examples()[0]
    answer = "__import__('sys')._getframe(1).f_locals['entry']['answer']"
    assert task.score(answer, ex) == 0.1 > task.score("wrong", ex) == 0.0
    assert IsolatedScorer(task, workers=WORKERS).score(answer, ex) == 0.0


@pytest.mark.parametrize("name", sorted(EVALUATING_SCORERS))
def test_malicious_answers_on_an_evaluating_scorer_touch_nothing(name, host):
    task = _task(name)
    scorer = IsolatedScorer(task, timeout_s=20.0, workers=WORKERS)
    ex = task.train_examples()[0]
    wrong = scorer.score("wrong", ex)
    answers, labels = [ex.answer], ["reference"]
    for label, payload in _payloads(host).items():
        for shape in _shapes(payload, ex.answer):
            answers.append(shape)
            labels.append(label)
    t0 = time.monotonic()
    scores = scorer.score_batch(answers, [ex] * len(answers))
    elapsed = time.monotonic() - t0
    assert scores[0] == 1.0  # the honest answer in the same batch
    for label, answer, score in zip(labels[1:], answers[1:], scores[1:]):
        assert isinstance(score, float) and score <= wrong, (label, answer, score)
    assert not host["written"].exists()
    assert elapsed < 20.0  # nothing slept: no answer ran
    assert scorer.pool.failures["timeout"] == 0


def test_a_hung_scorer_is_cut_at_the_limit_and_the_batch_goes_on():
    task = _task("countdown")
    scorer = IsolatedScorer(task, timeout_s=2.0, workers=1, memory_mb=1024)
    ex = task.train_examples()[0]
    assert scorer.score(ex.answer, ex) == 1.0  # the worker is up
    before = scorer.pool.failures["timeout"]
    hang = "factorial(factorial(20))"  # a formula, not code: sympy itself never finishes it
    t0 = time.monotonic()
    out = scorer.score_batch([ex.answer, hang, ex.answer, "wrong"], [ex] * 4)
    elapsed = time.monotonic() - t0
    assert out[0] == 1.0 and out[2] == 1.0 and out[3] < 1.0
    assert isinstance(out[1], ScorerFailure) and out[1].kind == "timeout"
    assert scorer.pool.failures["timeout"] == before + 1
    assert elapsed < 2.0 + 30.0  # the limit, plus a replacement worker's start on a busy machine


def test_a_crashed_worker_is_counted_and_replaced():
    task = _task("leg_counting")
    scorer = IsolatedScorer(task, workers=1, memory_mb=1024)
    ex = task.train_examples()[0]
    assert scorer.score(ex.answer, ex) == 1.0
    worker = scorer.pool._workers[0]
    worker.proc._proc.kill()  # the worker's sandbox dies between two requests...
    worker.proc._proc.wait()
    assert scorer.score(ex.answer, ex) == 1.0  # ...and a new one takes the next request
    import threading

    def kill_soon():  # ...or while scoring a request that hangs
        time.sleep(1.0)
        worker.proc._proc.kill()

    hang = _task("countdown")
    slow = IsolatedScorer(hang, workers=1, memory_mb=1024, timeout_s=60.0)
    slow.score(hang.train_examples()[0].answer, hang.train_examples()[0])
    worker = slow.pool._workers[0]
    threading.Thread(target=kill_soon).start()
    (out,) = slow.score_batch(["factorial(factorial(20))"], [hang.train_examples()[0]])
    assert isinstance(out, ScorerFailure) and out.kind == "crashed"


def test_even_a_scorer_that_runs_the_answer_stays_inside_the_sandbox(host):
    """Defence in depth: the worker's sandbox, with the scorer's own eval() (what the worker
    replaces) running a malicious answer: nothing of the host or the trainer is reachable."""
    pool = ScorerPool.shared(workers=WORKERS, memory_mb=2048, isolation="full")
    sb = pool.sandbox
    written, secret = str(host["written"]), str(host["secret"])
    attacks = {
        "write a host file": f"open({written!r}, 'w')",
        "shell out": f"__import__('os').system('touch {written} 2>/dev/null') and 1 / 0",
        "read a host secret": f"open({secret!r}).read()",
        "read the project": f"open({str(ROOT / 'reinforge' / 'config.py')!r}).read()",
        "signal the trainer": f"__import__('os').kill({os.getpid()}, 9)",
        "reach the network": "__import__('socket').create_connection(('1.1.1.1', 53), timeout=1)",
        "open a unix socket": "__import__('socket').socket(__import__('socket').AF_UNIX)",
    }
    program = "\n".join([
        "import sys",
        f"sys.path[:0] = {[inside_path(p) for p in _package_paths()]!r}",
        "from reasoning_gym import create_dataset",
        "ds = create_dataset('string_insertion', seed=0, size=2)",
        "entry = ds[0]",
        f"for label, expr in {attacks!r}.items():",
        "    try:",
        "        ds.score_answer(expr, entry)  # its own eval(): the expression runs here",
        "        eval(expr)",
        "        print('REACHED', label)",
        "    except BaseException as e:",
        "        print('refused', label, type(e).__name__)",
    ])
    r = sb.run([sb.python, "-I", "-S", "-c", program], timeout_s=60.0)
    out = r.stdout.decode()
    assert r.ok, (r.reason, r.stderr[-1000:])
    assert "REACHED" not in out and out.count("refused") == len(attacks), out
    assert not host["written"].exists()
    assert host["token"] not in out + r.stderr.decode(errors="replace")
    assert os.getpid()  # this process was not killed


# -- the trainer's path ------------------------------------------------------------------------------


def test_task_verifier_scores_a_batch_in_the_pool_and_counts_failures(host):
    task = _task("string_insertion")
    ex = task.train_examples()[0]
    fn = RewardFunction([(TaskVerifier(task, workers=WORKERS), 1.0)])
    payload = _payloads(host)["read the expected answer from the scorer's frame"]
    completions = [f"<answer>{ex.answer}</answer>", f"<answer>{payload}</answer>", "no answer"]
    out = fn(completions, [ex] * 3)
    assert [o.reward for o in out] == [1.0, 0.0, 0.0]
    assert [o.correct for o in out] == [True, False, False]


def test_task_verifier_options_from_the_config():
    task = _task("leg_counting")
    cfg = RewardConfig(verifiers=[VerifierSpec(name="task", options={"timeout_s": 3, "workers": 1})])
    (verifier, _), = [(v, w) for _, v, w, _ in build_reward(cfg, task)._entries]
    assert verifier.scorer.timeout_s == 3.0 and verifier.scorer.pool.size == 1
    bad = RewardConfig(verifiers=[VerifierSpec(name="task", options={"isolation": "none"})])
    with pytest.raises(ValueError, match=r"options \(task verifier\).*isolation must be one of"):
        build_reward(bad, task)
    bad = RewardConfig(verifiers=[VerifierSpec(name="task", options={"timeout": 3})])
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'timeout'.*accepted: timeout_s"):
        build_reward(bad, task)


def test_stdout_answer_mode_scores_program_output_in_the_pool(host):
    task = _task("string_insertion")
    ex = task.train_examples()[0]
    v = CodeVerifier(task, mode="stdout_answer", timeout_s=2.0)
    frame = _payloads(host)["read the expected answer from the scorer's frame"]
    write = _payloads(host)["write a host file"]
    programs = [f"print({ex.answer!r})", f"print({frame!r})", f"print({write!r})"]
    out = v.score_batch([f"```python\n{p}\n```" for p in programs], [ex] * 3)
    assert [r.score for r in out] == [1.0, 0.0, 0.0], [r.details for r in out]
    assert out[1].details["extracted"] == frame  # the program's output reached the scorer...
    assert not host["written"].exists()  # ...and ran nowhere
