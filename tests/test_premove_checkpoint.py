"""A run written by the code before the re-layout (issue 26) still resumes exactly.

tests/data/premove_run is a tiny run's directory as commit ab6d181 wrote it (two steps, a
checkpoint at step 2; the model folder and task file are rebuilt here from the same seed). Its
optimizer.pt is a torch pickle read with weights_only=False: a class that moved and was pickled
in it would fail to load. The new code must restore every part of that checkpoint, and resuming
it must give the same steps whichever copy is resumed. (That the resumed steps equal the old
code's own resume, step by step and in the final weights, was checked on the machine that wrote
the fixture: docs/architecture.md, "The re-layout".)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import save_tiny_model

from reinforge.cli import main
from reinforge.lifecycle.checkpoint import load_checkpoint
from reinforge.lifecycle.resume import resume_config
from reinforge.tracking import RunDir
from reinforge.trainer import Trainer

FIXTURE = Path(__file__).parent / "data" / "premove_run"
COMPARED = ("reward_mean", "reward_std", "loss", "grad_norm", "completion_length", "advantage_abs_mean", "lr")


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """The fixture's relative paths (model, task.jsonl, runs/) rebuilt under a fresh folder."""
    save_tiny_model(tmp_path / "model", hidden=32, layers=1)
    with open(tmp_path / "task.jsonl", "w") as f:
        for i in range(30):
            f.write(json.dumps({"prompt": f"say {i}", "answer": "7"}) + "\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _copy(workdir: Path, name: str) -> Path:
    dst = workdir / "runs" / name
    shutil.copytree(FIXTURE, dst)
    return dst


def _metrics(run: Path) -> dict[int, dict]:
    return {m["step"]: m for m in RunDir.open(run).read_metrics()}


def test_every_part_of_a_premove_checkpoint_is_restored(workdir):
    run = _copy(workdir, "restored")
    saved = load_checkpoint(run / "checkpoints" / "step_000002")
    rd = RunDir.open(run)
    trainer = Trainer(resume_config(rd.load_config(), []), run_dir=rd, resume=True)
    rd.acquire_writer()
    trainer._setup()
    try:
        assert trainer.start_step == 2
        state = trainer.learner.state_dict()
        for name, value in saved["weights"].items():
            assert torch.equal(state["weights"][name], value), name
        opt, want = state["optimizer"], saved["optimizer"]["optimizer"]
        assert opt["param_groups"] == want["param_groups"]
        for i, entry in want["state"].items():
            for key, value in entry.items():
                assert torch.equal(opt["state"][i][key], value), (i, key)
        assert state["scheduler"]["last_epoch"] == saved["optimizer"]["scheduler"]["last_epoch"]
        assert trainer.learner.scheduler.get_last_lr() == saved["optimizer"]["scheduler"]["_last_lr"]
        assert torch.equal(torch.get_rng_state(), saved["rng"]["torch"])
        assert np.array_equal(np.random.get_state()[1], saved["rng"]["numpy"][1])
        assert trainer.curriculum.state_dict() == saved["state"]["sampler"]
    finally:
        trainer.run_dir.release_writer()


def test_a_premove_run_resumes_and_its_logged_steps_stay(workdir):
    before = (FIXTURE / "metrics.jsonl").read_text().splitlines()
    runs = [_copy(workdir, name) for name in ("first", "second")]
    for run in runs:
        assert main(["train", "--resume", str(run), "trainer.steps=4"]) == 0
    first, second = (_metrics(r) for r in runs)
    assert sorted(first) == [1, 2, 3, 4]
    # the steps trained before the move are kept as written
    assert (runs[0] / "metrics.jsonl").read_text().splitlines()[:2] == before
    for step in (3, 4):
        for key in COMPARED:
            assert first[step][key] == second[step][key], (step, key)
    a = RunDir.open(runs[0]).status()
    assert a["state"] == "finished" and a["step"] == 4
