"""Damaged files of a real run directory (issue 28, finding 3): each is one line naming the file,
what is wrong and the fix, before any model loads (a garbage status.json, config.yaml,
segments.json, evaluation details or log line; deleted checkpoints; a writer.lock that is not a
file), or a one-line warning where the run goes on honestly (metrics.jsonl truncated mid-file or
deleted: the summary still counts every trained step and names the ones without metrics).
`reinforge runs` lists every run and marks the damaged ones with the reason.

The damaged resumes run the real `reinforge train --resume` in a subprocess with the model's
weights file moved away: a resume that loaded the model before refusing would end in a different
error, naming model.safetensors, so the expected line proves nothing was loaded first."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_run import cli_in_process, copy_run, save_tiny_run_inputs, tiny_run_overrides

from reinforge.config import build_config
from reinforge.evaluation.compare import collect_runs
from reinforge.tracking import DamagedRunError, RunDir
from reinforge.tracking.checkpoints import verify_checkpoint
from reinforge.tracking.index import run_info
from reinforge.tracking.io import read_json
from reinforge.tracking.segments import read_segments
from reinforge.tracking.validate import check_records, missing_steps, step_ranges
from reinforge.trainer import Trainer

# 3 steps, evaluated at steps 0 and 3, checkpointed every step (steps 2 and 3 kept)
_overrides = functools.partial(tiny_run_overrides, schedule=(
    "rollout.num_samples=4", "rollout.max_new_tokens=6", "trainer.prompts_per_step=2", "trainer.steps=3",
    "trainer.eval_every=3", "trainer.checkpoint_every=1", "trainer.seed=4", "learner.lr=0.05"))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A finished 3-step run, `base`, that every test damages a copy of."""
    root = save_tiny_run_inputs(tmp_path_factory.mktemp("damaged"))
    Trainer(build_config({}, _overrides(root, "base"))).run()
    return root


@contextlib.contextmanager
def _no_weights(root: Path):
    """The model's weights moved away: a process that loads the model fails, naming the file."""
    weights = root / "model" / "model.safetensors"
    weights.rename(weights.with_suffix(".away"))
    try:
        yield
    finally:
        weights.with_suffix(".away").rename(weights)



def _refused_line(proc: subprocess.CompletedProcess) -> str:
    """The one `reinforge:` line of a refused command (exit status 1, no traceback, no model load)."""
    err = proc.stderr
    lines = [line for line in err.splitlines() if line.startswith("reinforge:")]
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in err, err
    assert "model.safetensors" not in err, err  # the model was never loaded
    return lines[0]


def _resume_damaged(root: Path, name: str, damage) -> tuple[Path, str]:
    """A copy of the base run, damaged by ``damage(run)``, resumed to step 6 without model weights."""
    run = copy_run(root, "base", name)
    damage(run)
    with _no_weights(root):
        proc = cli_in_process("train", "--resume", str(run), "trainer.steps=6")
    return run, _refused_line(proc)


def _steps(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


# ----------------------------------------------------------------------------- refused, before the model


def test_a_garbage_status_json_is_named_before_the_model_loads_and_the_fix_works(root):
    run, line = _resume_damaged(root, "status", lambda r: (r / "status.json").write_text("}{ garbage"))
    assert f"{run / 'status.json'}: not valid JSON" in line
    assert "delete it (a resume writes a new one)" in line
    assert (run / "status.json").read_text() == "}{ garbage"  # left as found
    (run / "status.json").unlink()  # the fix the line gives
    proc = cli_in_process("train", "--resume", str(run), "trainer.steps=4")
    assert proc.returncode == 0, proc.stderr
    assert _steps(run) == [1, 2, 3, 4] and RunDir.open(run).status()["state"] == "finished"


def test_a_garbage_config_yaml_is_one_line_with_its_line_number(root):
    run, line = _resume_damaged(root, "config", lambda r: (r / "config.yaml").write_text("model: [unclosed\n  x: 1\n"))
    assert f"{run / 'config.yaml'}: not valid YAML" in line and "at line" in line
    assert "restore it from a copy" in line and "segments.json" in line


def test_a_garbage_eval_detail_file_is_refused_before_any_step_trains(root):
    detail = Path("evals") / "step_000000.json"
    run, line = _resume_damaged(root, "eval-detail", lambda r: (r / detail).write_text("[{\"id\": "))
    assert f"{run / detail}: not valid JSON" in line and "delete it" in line
    assert _steps(run) == [1, 2, 3]  # nothing trained
    (run / detail).unlink()  # the fix: the summary then pairs the evaluations that are left
    proc = cli_in_process("train", "--resume", str(run), "trainer.steps=4", "trainer.eval_every=4")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["heldout_accuracy"]["from_step"] == 3 and summary["heldout_accuracy"]["to_step"] == 4


def test_a_garbage_segments_json_is_named_with_the_fix(root):
    run, line = _resume_damaged(root, "segments", lambda r: (r / "segments.json").write_text("{\"segments\": [{}]}"))
    assert f"{run / 'segments.json'}: segment 1 is malformed" in line
    assert "delete it (the run then continues under config.yaml" in line


def test_a_log_line_that_is_json_but_not_an_object_is_named(root):
    def damage(run):
        lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
        (run / "metrics.jsonl").write_text(lines[0] + "[1, 2]\n" + "".join(lines[1:]))

    run, line = _resume_damaged(root, "non-object", damage)
    assert f"{run / 'metrics.jsonl'}: line 2 is a JSON list, not a JSON object" in line
    assert "delete or repair that line" in line


def test_deleted_checkpoints_are_refused_instead_of_starting_over(root):
    run, line = _resume_damaged(root, "no-checkpoints", lambda r: shutil.rmtree(r / "checkpoints"))
    assert "the checkpoint of step 3 was written" in line and f"{run / 'checkpoints'} holds no checkpoint" in line
    assert "restore checkpoints/ from a copy" in line and "tracking.run_name=NEW_NAME" in line
    assert _steps(run) == [1, 2, 3]  # the records were not dropped


def test_a_writer_lock_that_is_not_a_file_is_named(root):
    def damage(run):
        (run / "writer.lock").unlink(missing_ok=True)
        (run / "writer.lock").mkdir()

    run, line = _resume_damaged(root, "lock", damage)
    assert f"{run / 'writer.lock'}: cannot be opened for writing" in line and "delete it" in line


# ----------------------------------------------------------------------------- warned, and the run goes on


@pytest.mark.parametrize("damage", ["truncated mid-file", "deleted"])
def test_lost_metrics_warn_and_the_summary_counts_every_trained_step(root, damage):
    run = copy_run(root, "base", f"metrics-{damage.split()[0]}")
    metrics = run / "metrics.jsonl"
    if damage == "deleted":
        metrics.unlink()
        lost = [1, 2, 3]
    else:  # cut inside the second line: the first survives, the second is a torn tail
        data = metrics.read_bytes()
        metrics.write_bytes(data[: data.index(b"\n") + 20])
        lost = [2, 3]
    proc = cli_in_process("train", "--resume", str(run), "trainer.steps=6")
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.splitlines()
    warning = [i for i, line in enumerate(err) if line.startswith("warning:") and "metrics.jsonl" in line]
    assert len(warning) == 1, proc.stderr
    assert f"{metrics} has no record of step(s) {step_ranges(lost)}" in err[warning[0]]
    assert "checkpoint of step 3 is intact" in err[warning[0]]
    resumed = next(i for i, line in enumerate(err) if line.startswith("resuming "))
    assert warning[0] < resumed  # said while the plan was made, before anything loaded
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 6 and summary["steps_without_metrics"] == lost
    md = (run / "summary.md").read_text()
    assert f"6 steps (metrics.jsonl has no record of step(s) {step_ranges(lost)}" in md
    assert sorted(set(_steps(run))) == [s for s in range(1, 7) if s not in lost]


# ----------------------------------------------------------------------------- reinforge runs


def test_runs_lists_every_run_and_marks_the_damaged_ones(root):
    folder = root / "listing"
    for name in ("good-a", "good-b", "status", "config", "segments", "metrics"):
        shutil.copytree(root / "runs" / "base", folder / name)
    (folder / "status" / "status.json").write_text("}{")
    (folder / "config" / "config.yaml").write_text("model: [unclosed\n")
    (folder / "segments" / "segments.json").write_text("[]")
    data = (folder / "metrics" / "metrics.jsonl").read_bytes()
    (folder / "metrics" / "metrics.jsonl").write_bytes(data[: data.index(b"\n") + 1])
    proc = cli_in_process("runs", str(folder))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[1:]}
    assert sorted(rows) == ["config", "good-a", "good-b", "metrics", "segments", "status"]
    assert proc.stdout.splitlines()[0].split()[-1] == "problem"
    for good in ("good-a", "good-b"):
        assert rows[good].split()[1:3] == ["finished", "grpo"] and "3/3" in rows[good]
        assert rows[good].rstrip().endswith("-")  # no problem
    assert rows["status"].split()[1] == "damaged" and "status.json: not valid JSON" in rows["status"]
    assert "config.yaml: not valid YAML" in rows["config"]
    assert "segments.json: holds a JSON list, not a JSON object" in rows["segments"]
    assert "3/3" in rows["metrics"] and "metrics.jsonl has no record of step(s) 2-3" in rows["metrics"]


def test_compare_leaves_a_damaged_run_out_and_names_it(root):
    folder = root / "compare-in"
    for name in ("good", "bad"):
        shutil.copytree(root / "runs" / "base", folder / name)
    (folder / "bad" / "status.json").write_text("")
    runs, skipped = collect_runs([folder])
    assert [r.run.name for r in runs] == ["good"]
    assert len(skipped) == 1 and skipped[0][0].endswith("bad")
    assert "damaged" in skipped[0][1] and "status.json: not valid JSON" in skipped[0][1]


# ----------------------------------------------------------------------------- the parts, in process


def test_run_info_never_raises_and_names_the_file(root):
    run = copy_run(root, "base", "info")
    (run / "config.yaml").write_text("task: just a string\n")  # valid YAML, not what reinforge wrote
    info = run_info(RunDir.open(run))
    assert info.problem and info.state in ("damaged", "finished")


def test_a_checkpoint_whose_state_names_another_step_is_damaged(root):
    run = copy_run(root, "base", "state-step")
    state_file = run / "checkpoints" / "step_000003" / "state.json"
    state = json.loads(state_file.read_text())
    state["step"] = 2
    state_file.write_text(json.dumps(state))
    check = verify_checkpoint(state_file.parent)
    assert not check.intact and "says step 2, not the folder's 3" in check.problem


def test_a_run_stopped_before_its_first_checkpoint_may_still_start_over(root, capsys):
    """No checkpoint and no evidence one was written (checkpoint_every=0, interrupted): legitimate."""
    run = copy_run(root, "base", "never-checkpointed")
    shutil.rmtree(run / "checkpoints")
    status = json.loads((run / "status.json").read_text())
    status.update(state="interrupted", step=3)
    (run / "status.json").write_text(json.dumps(status))
    segments = json.loads((run / "segments.json").read_text())
    segments["segments"][0]["config"]["trainer"]["checkpoint_every"] = 0
    (run / "segments.json").write_text(json.dumps(segments))
    assert check_records(RunDir.open(run), 0, out=sys.stderr) == []
    segments["segments"][0]["config"]["trainer"]["checkpoint_every"] = 1  # then step 2's was written
    (run / "segments.json").write_text(json.dumps(segments))
    with pytest.raises(Exception, match="the checkpoint of step 2 was written"):
        check_records(RunDir.open(run), 0, out=sys.stderr)


def test_read_json_and_segments_name_the_shape_that_is_wrong(tmp_path):
    (tmp_path / "a.json").write_text("[1]")
    with pytest.raises(DamagedRunError, match=r"a.json: holds a JSON list, not a JSON object; FIX"):
        read_json(tmp_path / "a.json", kind=dict, fix="FIX")
    (tmp_path / "b.json").write_bytes(b"\xff\xfe")
    with pytest.raises(DamagedRunError, match=r"b.json: not UTF-8 text \(byte 0\); FIX"):
        read_json(tmp_path / "b.json", fix="FIX")
    assert read_json(tmp_path / "none.json", fix="FIX", default={}) == {}
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("recipe: grpo\n")
    (run / "segments.json").write_text(json.dumps({"segments": []}))
    with pytest.raises(DamagedRunError, match="segments.json: lists no segment; restore it from a copy"):
        read_segments(RunDir.open(run))


def test_step_ranges_and_missing_steps():
    assert step_ranges([5, 1, 2, 3, 7, 8]) == "1-3, 5, 7-8"
    assert missing_steps([{"step": 1}, {"step": 3}, {"no": 1}], 4) == [2, 4]


def test_a_resume_drops_the_trajectory_files_of_dropped_steps(root):
    run = RunDir.open(copy_run(root, "base", "trajectories"))
    for s in (1, 2, 3):
        (run.path / "trajectories").mkdir(exist_ok=True)
        (run.path / "trajectories" / f"step_{s:06d}.jsonl").write_text("{}\n")
    run.acquire_writer()
    try:
        run.truncate_after(2)
    finally:
        run.release_writer()
    assert sorted(p.name for p in (run.path / "trajectories").iterdir()) == ["step_000001.jsonl", "step_000002.jsonl"]


def test_a_garbage_exporters_json_is_a_warning_and_the_exporters_start_anew(root, caplog):
    pytest.importorskip("tensorboard")
    from reinforge.tracking.exporters import build_exporters

    run = copy_run(root, "base", "exporters")
    (run / "exporters.json").write_text("}{")
    config = RunDir.open(run).load_config()
    config["tracking"]["exporters"] = ["tensorboard"]
    with caplog.at_level("WARNING"):
        exporters = build_exporters(run, config)
    exporters.finish("finished")
    assert any("exporters.json: not valid JSON" in r.getMessage() and "start new runs" in r.getMessage()
               for r in caplog.records)
    assert isinstance(json.loads((run / "exporters.json").read_text()), dict)  # rewritten whole
