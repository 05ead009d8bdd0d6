"""The plain progress line (not a terminal): no ETA until a step of this session has finished."""

from __future__ import annotations

from reinforge.trainer.progress import Progress


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
