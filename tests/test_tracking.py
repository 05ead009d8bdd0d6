"""Run directory and crash-safe writes."""

from __future__ import annotations

import importlib.metadata

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from reinforge.config import RunConfig, build_config
from reinforge.tracking import (
    NotARunDirectoryError,
    RunDir,
    append_jsonl,
    atomic_write_bytes,
    atomic_write_json,
    atomic_write_text,
    read_jsonl,
    rewrite_jsonl,
)
from reinforge.tracking import environment as environment_mod
from reinforge.tracking import run_dir as run_dir_mod
from reinforge.tracking.curves import plot_learning_curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    # Run from a directory that is not a git repository: create() must not need one.
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    return build_config({}, ["tracking.output_dir=" + str(tmp_path / "runs")])


@pytest.fixture
def fast_env(monkeypatch):
    """Skip the package scan for tests that do not look at environment.json."""
    monkeypatch.setattr(run_dir_mod, "collect_environment",
                        lambda cwd=None: ({"git": {"commit": None}}, None))


def _leftovers(directory):
    return [p.name for p in directory.iterdir() if p.name.endswith(".tmp")]


# ----------------------------------------------------------------------------- io


def test_atomic_writes_roundtrip_and_leave_no_temp_files(tmp_path):
    atomic_write_text(tmp_path / "a.txt", "héllo\n")
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    atomic_write_json(tmp_path / "sub" / "c.json", {"x": np.float32(1.5), "y": np.arange(3)})
    assert (tmp_path / "a.txt").read_text(encoding="utf-8") == "héllo\n"
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert json.loads((tmp_path / "sub" / "c.json").read_text()) == {"x": 1.5, "y": [0, 1, 2]}
    atomic_write_text(tmp_path / "a.txt", "new")
    assert (tmp_path / "a.txt").read_text() == "new"
    assert _leftovers(tmp_path) == [] and _leftovers(tmp_path / "sub") == []
    # Permissions are those of an ordinary file, not mkstemp's 0600.
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.parametrize("fail_at", ["replace", "fsync"])
def test_atomic_write_failure_keeps_old_content(tmp_path, monkeypatch, fail_at):
    target = tmp_path / "status.json"
    atomic_write_json(target, {"state": "running"})
    old = target.read_bytes()

    def boom(*args, **kwargs):
        raise OSError("simulated crash mid-write")

    monkeypatch.setattr(os, fail_at, boom)
    with pytest.raises(OSError, match="simulated crash"):
        atomic_write_json(target, {"state": "finished", "pad": "x" * 10_000})
    monkeypatch.undo()
    assert target.read_bytes() == old
    assert _leftovers(tmp_path) == []


def test_read_jsonl_tolerates_torn_last_line_and_append_repairs_it(tmp_path):
    p = tmp_path / "metrics.jsonl"
    assert read_jsonl(p) == []  # missing file
    append_jsonl(p, {"step": 1, "loss": 0.5})
    append_jsonl(p, {"step": 2, "loss": float("nan")})
    with open(p, "ab") as f:  # what a crash in the middle of an append leaves
        f.write(b'{"step": 3, "lo')
    recs = read_jsonl(p)
    assert [r["step"] for r in recs] == [1, 2]
    assert np.isnan(recs[1]["loss"])
    # The next append cuts the torn line off instead of gluing onto it.
    append_jsonl(p, {"step": 3, "loss": 0.25})
    assert [r["step"] for r in read_jsonl(p)] == [1, 2, 3]
    assert p.read_bytes().endswith(b"\n") and b"lo{" not in p.read_bytes()


def test_read_jsonl_complete_last_line_without_newline_is_kept(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n\n{"a": 2}')
    assert read_jsonl(p) == [{"a": 1}, {"a": 2}]
    append_jsonl(p, {"a": 3})
    assert read_jsonl(p) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_read_jsonl_corrupt_middle_line_is_an_error(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n{"a": \n{"a": 2}\n')
    with pytest.raises(ValueError, match=r"x\.jsonl: line 2"):
        read_jsonl(p)


def test_rewrite_jsonl(tmp_path):
    p = tmp_path / "x.jsonl"
    append_jsonl(p, {"a": 1})
    rewrite_jsonl(p, [{"b": 1}, {"b": "two\nlines"}])
    assert read_jsonl(p) == [{"b": 1}, {"b": "two\nlines"}]
    rewrite_jsonl(p, [])
    assert read_jsonl(p) == [] and p.read_bytes() == b""


# ----------------------------------------------------------------------------- RunDir


def test_create_writes_config_environment_status(cfg):
    run = RunDir.create(cfg)
    assert run.path.parent == Path(cfg.tracking.output_dir)
    assert run.name.endswith("-grpo-leg_counting")
    # config.yaml reloads to the same config, whole.
    raw = yaml.safe_load((run.path / "config.yaml").read_text())
    assert raw == cfg.to_dict() == run.load_config()
    assert RunConfig.model_validate(raw) == cfg
    assert run.load_run_config() == cfg

    env = json.loads((run.path / "environment.json").read_text())
    import torch

    assert env["torch"]["version"] == torch.__version__
    assert env["torch"]["num_threads"] >= 1
    # the distribution's version: a CUDA build's __version__ adds a local tag (2.11.0+cu130)
    assert env["packages"]["torch"] == importlib.metadata.version("torch")
    assert "numpy" in env["packages"] and "pydantic" in env["packages"]
    assert env["python"]["version"] and env["cpu_count"] >= 1
    assert env["git"]["commit"] is None  # not a repository: recorded, not an error
    assert env["seeds"] == {"trainer": cfg.trainer.seed, "task": cfg.task.seed}

    status = json.loads((run.path / "status.json").read_text())
    assert status["state"] == "running" and status["pid"] == os.getpid() and status["started"]
    assert _leftovers(run.path) == []


def test_create_default_names_are_unique_and_explicit_names_never_reuse(cfg, fast_env):
    a, b = RunDir.create(cfg), RunDir.create(cfg)
    assert a.path != b.path and a.path.is_dir() and b.path.is_dir()
    named = RunDir.create(cfg, name="exp1")
    assert named.name == "exp1"
    with pytest.raises(FileExistsError, match="exp1"):
        RunDir.create(cfg, name="exp1")
    cfg2 = cfg.model_copy(deep=True)
    cfg2.tracking.run_name = "from_config"
    assert RunDir.create(cfg2).name == "from_config"


def test_default_names_of_runs_whose_examples_come_from_an_environment(tmp_path, fast_env):
    # task.source=env: the environment names the run, not the unused task.name default
    cfg = build_config({}, ["task.source=env", "env.name=guess_number",
                            f"tracking.output_dir={tmp_path}", "tracking.exporters=[]"])
    assert RunDir.create(cfg).name.endswith("-grpo-guess_number")
    assert run_dir_mod.task_label({"source": "env"}, {"name": "verifiers", "options": {"taskset": "ts"}}) == "verifiers-ts"
    assert run_dir_mod.task_label({"source": "reasoning_gym", "name": "products"}, {"name": "calculator"}) == "products"


def test_create_records_git_commit_when_in_a_repo(cfg, monkeypatch):
    answers = {
        ("rev-parse", "HEAD"): "abc123\n",
        ("rev-parse", "--show-toplevel"): "/repo\n",
        ("status", "--porcelain", "--untracked-files=no"): " M reinforge/x.py\n",
        ("diff", "HEAD"): "diff --git a/x b/x\n",
    }
    monkeypatch.setattr(environment_mod, "_run_git", lambda args, cwd: answers[tuple(args)])
    run = RunDir.create(cfg)
    git = run.load_environment()["git"]
    assert git["commit"] == "abc123" and git["dirty"] is True
    assert (run.path / git["diff_file"]).read_text() == "diff --git a/x b/x\n"


def test_open_errors_clearly_on_non_run_dir(tmp_path, cfg, fast_env):
    with pytest.raises(NotARunDirectoryError, match="not a reinforge run directory") as e:
        RunDir.open(tmp_path)
    assert str(tmp_path) in str(e.value)
    with pytest.raises(FileNotFoundError, match="not a reinforge run directory"):
        RunDir.open(tmp_path / "missing")
    run = RunDir.create(cfg)
    assert RunDir.open(run.path).path == run.path


def test_logging_reading_and_status(cfg, fast_env):
    run = RunDir.create(cfg)
    run.log_metrics(1, {"reward_mean": 0.25, "loss": np.float64(0.1)})
    run.log_samples(1, [{"prompt": "p", "completion": "c", "reward": 1.0}, {"prompt": "q"}])
    run.log_eval(1, {"accuracy": 0.5, "n": 2}, [{"prompt": "p", "correct": True}])
    m = run.read_metrics()
    assert m[0]["step"] == 1 and m[0]["reward_mean"] == 0.25 and "time" in m[0]
    assert [s["step"] for s in run.read_samples()] == [1, 1]
    assert run.read_evals()[0]["accuracy"] == 0.5
    assert run.read_eval_details(1) == [{"prompt": "p", "correct": True}]
    assert (run.path / "evals" / "step_000001.json").is_file()
    with pytest.raises(FileNotFoundError, match="step 7"):
        run.read_eval_details(7)
    with pytest.raises(ValueError, match="reserved"):
        run.log_metrics(2, {"step": 3})

    run.set_status("finished", step=1)
    st = run.status()
    assert st["state"] == "finished" and st["step"] == 1 and "started" in st and "ended" in st
    with pytest.raises(ValueError, match="unknown run state"):
        run.set_status("done")

    run.write_summary({"accuracy": 0.5}, "# Summary")
    assert json.loads((run.path / "summary.json").read_text()) == {"accuracy": 0.5}
    assert (run.path / "summary.md").read_text() == "# Summary\n"


def test_truncate_after_drops_later_steps(cfg, fast_env):
    run = RunDir.create(cfg)
    for step in range(1, 6):
        run.log_metrics(step, {"loss": float(step)})
        run.log_samples(step, [{"completion": str(step)}])
        if step % 2 == 0:
            run.log_eval(step, {"accuracy": step / 10}, [{"step_of": step}])
    with open(run.path / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 6, "lo')  # crash mid-append
    run.truncate_after(3)
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3]
    assert [r["step"] for r in run.read_samples()] == [1, 2, 3]
    assert [r["step"] for r in run.read_evals()] == [2]
    assert run.eval_steps() == [2]
    assert (run.path / "metrics.jsonl").read_bytes().endswith(b"}\n")
    # Resuming from step 3 continues without duplicates.
    run.log_metrics(4, {"loss": 4.0})
    assert [r["step"] for r in run.read_metrics()] == [1, 2, 3, 4]
    run.truncate_after(0)
    assert run.read_metrics() == [] and run.read_evals() == [] and run.eval_steps() == []
    assert _leftovers(run.path) == []


def _metric_record(step):
    return {
        "reward_mean": 0.1 * step,
        "accuracy": 0.05 * step,
        "completion_length_mean": 30.0 + step,
        "loss": 1.0 / step,
        "kl": 0.01 * step,
    }


@pytest.mark.parametrize("n_records", [0, 1, 5])
def test_plot_curves_png(cfg, fast_env, n_records):
    run = RunDir.create(cfg)
    for step in range(1, n_records + 1):
        run.log_metrics(step, _metric_record(step))
        acc = 0.1 * step
        run.log_eval(
            step,
            {"accuracy": acc, "accuracy_ci_low": acc - 0.05, "accuracy_ci_high": acc + 0.05,
             "reward_mean": acc},
            [],
        )
    out = plot_learning_curves(run)
    assert out == run.path / "learning_curves.png"
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000
    assert _leftovers(run.path) == []


def test_plot_curves_metrics_only(cfg, fast_env):
    run = RunDir.create(cfg)
    run.log_metrics(1, {"reward_mean": 0.5, "loss": float("nan")})
    assert plot_learning_curves(run).read_bytes()[:8] == PNG_MAGIC


# ----------------------------------------------------------------------------- one writer


def _holder_process(run_path):
    """A separate process holding the run's writer lock until killed."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    code = ("import sys, time; from reinforge.tracking.lock import acquire; acquire(sys.argv[1]); "
            "print('held', flush=True); time.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(run_path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(root)})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_writer_lock_is_reentrant_in_a_process_and_required_for_writes(cfg, fast_env):
    from reinforge.tracking.lock import lock_holder

    run = RunDir.create(cfg)  # created with the lock held
    assert lock_holder(run.path)["pid"] == os.getpid() and run.writer()["pid"] == os.getpid()
    again = RunDir.open(run.path)
    again.acquire_writer()  # the same process: counted, not refused
    run.release_writer()
    again.log_metrics(1, {"loss": 1.0})  # still held through `again`
    again.release_writer()
    again.release_writer()  # a release without an acquisition does nothing
    assert lock_holder(run.path) is None and run.writer() is None
    reader = RunDir.open(run.path)
    for write in (lambda: reader.log_metrics(2, {"loss": 0.5}), lambda: reader.set_status("finished"),
                  lambda: reader.truncate_after(0), lambda: reader.log_eval(2, {}, [])):
        with pytest.raises(RuntimeError, match="does not hold the writer lock"):
            write()
    assert [m["step"] for m in reader.read_metrics()] == [1]  # reading needs no lock


def test_a_lock_held_by_another_process_is_named_and_freed_when_it_dies(cfg, fast_env):
    import signal
    import socket

    from reinforge.tracking import RunLockedError
    from reinforge.tracking import lock as lock_mod

    run = RunDir.create(cfg)
    run.release_writer()
    proc = _holder_process(run.path)
    try:
        with pytest.raises(RunLockedError) as err:
            RunDir.open(run.path).acquire_writer()
        message = str(err.value)
        assert f"pid {proc.pid} on host {socket.gethostname()}" in message and "\n" not in message
        assert run.writer()["pid"] == proc.pid
        with pytest.raises(RunLockedError):  # RunDir.create into the held, explicit name loses too
            lock_mod.acquire(run.path, retry_s=0)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert run.writer() is None
    lock_mod.acquire(run.path, retry_s=0)  # at once: the kernel dropped the dead holder's lock
    lock_mod.release(run.path)


def test_an_explicit_run_name_is_created_by_one_process_only(cfg, fast_env):
    from reinforge.tracking import RunLockedError

    (Path(cfg.tracking.output_dir) / "raced").mkdir(parents=True)  # made empty by a racing creator...
    proc = _holder_process(Path(cfg.tracking.output_dir) / "raced")  # ...which holds its lock
    try:
        with pytest.raises((RunLockedError, FileExistsError)):
            RunDir.create(cfg, name="raced")
    finally:
        proc.kill()
        proc.wait()
    assert not (Path(cfg.tracking.output_dir) / "raced" / "config.yaml").exists()


# ----------------------------------------------------------------------------- checkpoints, segments


def test_checkpoints_are_listed_in_one_place(cfg, fast_env):
    from reinforge.lifecycle.checkpoint import latest_checkpoint

    run = RunDir.create(cfg)
    root = run.path / "checkpoints"
    for name, complete in (("step_000002", True), ("step_000010", True), ("step_000011", False),
                           (".tmp-step_000012", True), ("notes", True)):
        (root / name).mkdir(parents=True)
        if complete:
            (root / name / "state.json").write_text("{}")
    assert [(s, p.name) for s, p in run.checkpoints()] == [(2, "step_000002"), (10, "step_000010")]
    assert latest_checkpoint(run.path) == root / "step_000010" == run.checkpoint("latest")[1]
    assert run.checkpoint("2") == (2, root / "step_000002") == run.checkpoint("step_000002")
    with pytest.raises(FileNotFoundError, match="step_000002, step_000010"):
        run.checkpoint(11)


def test_segment_history_keeps_what_survived(cfg, fast_env):
    from reinforge.tracking.segments import SEGMENTS_FILE, read_segments, record_resume

    def kind(key):
        return "free" if key == "trainer.steps" else "segment"

    run = RunDir.create(cfg)
    a = cfg.to_dict()
    b = build_config(a, ["learner.lr=0.001", "trainer.steps=60"]).to_dict()
    c = build_config(a, ["learner.lr=0.002"]).to_dict()
    assert [(s.from_step, s.config) for s in read_segments(run)] == [(1, a)]  # recorded at creation
    stamp = (run.path / SEGMENTS_FILE).stat().st_mtime_ns
    record_resume(run, 10, a, kind)  # nothing changed: nothing written
    assert (run.path / SEGMENTS_FILE).stat().st_mtime_ns == stamp

    history = record_resume(run, 10, b, kind)
    assert [s.from_step for s in history] == [1, 11] and run.load_config() == b
    assert {(ch.key, ch.kind) for ch in history[1].changes} == {("learner.lr", "segment"), ("trainer.steps", "free")}
    stamp = (run.path / SEGMENTS_FILE).stat().st_mtime_ns
    record_resume(run, 20, b, kind)  # the same config goes on: same history, untouched files
    assert (run.path / SEGMENTS_FILE).stat().st_mtime_ns == stamp

    # resumed from step 10 again (b's steps after it were dropped): b's segment is replaced by c's
    history = record_resume(run, 10, c, kind)
    assert [s.from_step for s in history] == [1, 11] and history[1].config == c and run.load_config() == c
    assert [(ch.key, ch.before, ch.after) for ch in history[1].changes] == [("learner.lr", cfg.learner.lr, 0.002)]
    # back to the first config from step 10: one segment again
    assert [s.from_step for s in record_resume(run, 10, a, kind)] == [1]
    assert run.load_config() == a
    # a crash between segments.json and config.yaml: the segment it names began after the latest
    # checkpoint, and the next resume drops it
    record_resume(run, 10, b, kind)
    atomic_write_text(run.path / "config.yaml", yaml.safe_dump(a, sort_keys=False))
    assert [s.from_step for s in record_resume(run, 10, a, kind)] == [1]
    # no checkpoint survives (a restart from step 0): the new config is the only one
    record_resume(run, 10, b, kind)
    history = record_resume(run, 0, c, kind)
    assert len(history) == 1 and history[0].config == c and history[0].changes == []
