"""The plain progress line (not a terminal): no ETA until a step of this session has finished."""

from __future__ import annotations

from reinforge.lifecycle.progress import EvalProgress, Progress


def test_eta_appears_only_once_it_is_known(capsys):
    with Progress(total=4, start=0) as bar:
        bar.update(0, eval={"accuracy": 0.25})  # the held-out evaluation before step 1
        first = capsys.readouterr().err
        bar.update(1, metrics={"reward_mean": 0.5, "tokens_per_s": 100.0}, eval={"accuracy": 0.25})
        second = capsys.readouterr().err
    assert first.startswith("step 0/4") and "held-out acc 0.250" in first
    assert "eta" not in first and "nan" not in first
    assert "reward 0.500" in second and "eta " in second and "nan" not in second


def test_resumed_run_waits_for_its_own_first_step(capsys):
    bar = Progress(total=10, start=6)
    bar.update(6, eval={"accuracy": 0.5})
    assert "eta" not in capsys.readouterr().err
    # 2 steps in 8 s: 4 s a step, 2 steps left -> 8 s
    assert bar.eta(8, elapsed=8.0) == 8.0 and bar.eta(6, elapsed=3.0) is None


def test_disabled_progress_prints_nothing(capsys):
    Progress(total=2, enabled=False).update(1, metrics={"reward_mean": 0.0, "tokens_per_s": 1.0})
    assert capsys.readouterr().err == ""


def test_the_eta_times_steps_and_evaluations_apart_and_is_announced_once(capsys):
    bar = Progress(total=10, start=0, evals_left=lambda s: sum(k % 5 == 0 for k in range(s + 1, 11)))
    bar.evaluated(30.0)  # the step-0 evaluation took 30 s ...
    # ... then 2 steps in 20 s: 10 s a step, 8 steps and 2 evaluations (5, 10) of 30 s to go
    assert bar.eta(2, elapsed=50.0) == 8 * 10.0 + 2 * 30.0
    bar._t0 -= 50.0
    bar.update(2, metrics={"reward_mean": 0.1, "tokens_per_s": 10.0})
    bar.update(3, metrics={"reward_mean": 0.1, "tokens_per_s": 10.0})
    err = capsys.readouterr().err
    assert err.count("the run should end in about") == 1
    assert "8 steps to go and 2 held-out evaluations" in err and "s a step" in err


def test_a_long_evaluation_reports_its_progress(capsys):
    said = []
    progress = EvalProgress(said.append, "held-out evaluation at step 0", every_s=0.0)
    progress(64, 200)
    progress(200, 200)  # the end is not announced: the evaluation's result is
    assert len(said) == 1 and "held-out evaluation at step 0: 64/200 prompts" in said[0] and "left" in said[0]
