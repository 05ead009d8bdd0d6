"""Exporters: every metric a run logs reaches wandb (offline), MLflow (local file store),
TensorBoard and trackio under the same name and step, a resumed run continues the same tracker
run, a failing tracker never stops training, and a missing package names its pip extra."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
from conftest import save_tiny_model
from tiny_run import tiny_run_overrides

from reinforge.config import ConfigError, build_config
from reinforge.tracking import RunDir
from reinforge.tracking import exporters as exporters_mod
from reinforge.tracking import run_dir as run_dir_mod

STEPS = {1: {"loss": 0.5, "reward/format": 0.25, "note": "text is not exported"},
         2: {"loss": 0.25, "reward/format": 0.5, "note": "x"},
         3: {"loss": 0.125, "reward/format": 0.75, "note": "x"}}


@pytest.fixture(autouse=True)
def fast_env(monkeypatch):
    monkeypatch.setattr(run_dir_mod, "collect_environment", lambda cwd=None: ({"git": {}}, None))


def _config(tmp_path, name, **options):
    overrides = [f"tracking.output_dir={tmp_path / 'runs'}", "tracking.run_name=r1", f"tracking.exporters=[{name}]"]
    overrides += [f"tracking.{name}.{k}={v}" for k, v in options.items()]
    return build_config({}, overrides)


def _log_two_sessions(cfg) -> RunDir:
    """Session 1 logs steps 1-3 and is interrupted after its step-2 checkpoint; session 2 resumes
    from step 2 (re-logging step 3) and logs step 4."""
    rd = RunDir.create(cfg)
    rd.log_eval(0, {"accuracy": 0.1, "n": 4}, [])
    for step, m in STEPS.items():
        rd.log_metrics(step, m)
    rd.set_status("interrupted", step=3)
    rd2 = RunDir.open(rd.path)
    rd2.truncate_after(2)
    rd2.set_status("running")
    rd2.log_metrics(3, {"loss": 0.0625, "reward/format": 0.75})
    rd2.log_metrics(4, {"loss": 0.03125, "reward/format": 1.0})
    rd2.log_eval(4, {"accuracy": 0.75, "n": 4}, [])
    rd2.set_status("finished", step=4)
    return rd2


def test_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    rd = _log_two_sessions(_config(tmp_path, "tensorboard"))
    ea = EventAccumulator(str(rd.path / "tensorboard"))
    ea.Reload()
    assert {"loss", "reward/format", "eval/accuracy", "eval/n"} <= set(ea.Tags()["scalars"])
    assert "note" not in ea.Tags()["scalars"]
    # the events session 1 wrote after the step-2 checkpoint were purged on resume
    assert [(e.step, e.value) for e in ea.Scalars("loss")] == [(1, 0.5), (2, 0.25), (3, 0.0625), (4, 0.03125)]
    assert [(e.step, e.value) for e in ea.Scalars("eval/accuracy")] == [(0, pytest.approx(0.1)), (4, 0.75)]


def _wandb_history(run_file: Path) -> list[dict]:
    """History rows of an offline .wandb file (a LevelDB-style log of protobuf Records)."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, buf, rows = 7, 32768, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            if rec.WhichOneof("record_type") == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
    return rows


def test_wandb_offline(tmp_path):
    pytest.importorskip("wandb")
    rd = _log_two_sessions(_config(tmp_path, "wandb", project="reinforge-test"))
    run_id = json.loads((rd.path / "exporters.json").read_text())["wandb"]["id"]
    sessions = sorted((rd.path / "wandb").glob("offline-run-*"))
    assert len(sessions) == 2 and all(run_id in s.name for s in sessions)  # resumed: the same run id
    first = _wandb_history(next(sessions[0].glob("run-*.wandb")))
    by_step = {r["_step"]: r for r in first}
    assert by_step[0]["eval/accuracy"] == pytest.approx(0.1)
    for step, m in STEPS.items():
        assert by_step[step]["loss"] == m["loss"] and by_step[step]["reward/format"] == m["reward/format"]
        assert "note" not in by_step[step]
    # wandb's service process writes the offline file; on a loaded machine its last records can
    # land after finish() returned, so read until step 4 is there (or give up after 30 s).
    deadline = time.monotonic() + 30
    while True:
        second = {r["_step"]: r for r in _wandb_history(next(sessions[1].glob("run-*.wandb")))}
        if 4 in second or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert second[4]["loss"] == 0.03125 and second[4]["eval/accuracy"] == 0.75


def test_mlflow_local_file_store(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    rd = _log_two_sessions(_config(tmp_path, "mlflow", experiment="reinforge-test"))
    state = json.loads((rd.path / "exporters.json").read_text())["mlflow"]
    assert state["tracking_uri"] == (tmp_path / "runs" / "mlruns").resolve().as_uri()
    client = MlflowClient(state["tracking_uri"])
    run = client.get_run(state["run_id"])  # one MLflow run across both sessions
    assert run.info.status == "FINISHED" and run.info.run_name == "r1"
    assert run.data.params["trainer.steps"] == "30" and run.data.params["tracking.exporters"] == "['mlflow']"
    history = sorted((m.step, m.value) for m in client.get_metric_history(state["run_id"], "reward/format"))
    assert history == [(1, 0.25), (2, 0.5), (3, 0.75), (3, 0.75), (4, 1.0)]
    assert [m.value for m in client.get_metric_history(state["run_id"], "eval/accuracy")] == [0.1, 0.75]
    assert not client.get_metric_history(state["run_id"], "note")


def test_trackio_local(tmp_path, monkeypatch):
    import importlib
    import importlib.util
    import sys

    if importlib.util.find_spec("trackio") is None:
        pytest.skip("trackio is not installed")
    # trackio reads TRACKIO_DIR once, at import, into module globals: set it first, and point the
    # copies at tmp_path in case trackio was imported earlier, so nothing is written to ~/.cache.
    store = tmp_path / "trackio"
    monkeypatch.setenv("TRACKIO_DIR", str(store))
    importlib.import_module("trackio")

    for name, module in list(sys.modules.items()):
        if name.startswith("trackio") and hasattr(module, "TRACKIO_DIR"):
            monkeypatch.setattr(module, "TRACKIO_DIR", store)
    rd = _log_two_sessions(_config(tmp_path, "trackio", project="reinforge-test", dir=str(store)))
    from trackio.sqlite_storage import SQLiteStorage

    logs = SQLiteStorage.get_logs("reinforge-test", "r1")
    by_step: dict[int, dict] = {}
    for row in logs:
        by_step.setdefault(row["step"], {}).update(row)
    assert by_step[1]["loss"] == 0.5 and by_step[2]["reward/format"] == 0.5
    assert by_step[4]["loss"] == 0.03125 and by_step[0]["eval/accuracy"] == pytest.approx(0.1)
    assert "note" not in by_step[1]
    assert json.loads((rd.path / "exporters.json").read_text())["trackio"] == {"project": "reinforge-test", "name": "r1"}
    assert (store / "reinforge-test.db").is_file()


def test_a_run_logs_to_several_exporters_from_the_trainer(tmp_path):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from reinforge.trainer import Trainer

    save_tiny_model(tmp_path / "m", hidden=32, layers=1)
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"prompt": f"p{i}", "answer": "7"}) + "\n" for i in range(20)))
    cfg = build_config({}, tiny_run_overrides(
        tmp_path, None, "tracking.exporters=[tensorboard, wandb]", reward="exact_match", model=tmp_path / "m",
        task=tmp_path / "t.jsonl", eval_size=3, schedule=(
            "rollout.num_samples=2", "rollout.max_new_tokens=4", "trainer.prompts_per_step=2", "trainer.steps=2",
            "trainer.eval_every=1", "trainer.checkpoint_every=0")))
    rd = RunDir.open(Trainer(cfg).run().run_dir)
    ea = EventAccumulator(str(rd.path / "tensorboard"))
    ea.Reload()
    metrics = rd.read_metrics()
    for key in ("reward_mean", "loss", "grad_norm"):
        assert [(e.step, e.value) for e in ea.Scalars(key)] == [(m["step"], pytest.approx(m[key])) for m in metrics]
    assert [e.step for e in ea.Scalars("eval/accuracy")] == [0, 1, 2]
    (session,) = (rd.path / "wandb").glob("offline-run-*")
    rows = {r["_step"]: r for r in _wandb_history(next(session.glob("run-*.wandb")))}
    assert rows[2]["loss"] == pytest.approx(metrics[1]["loss"]) and "eval/accuracy" in rows[2]


def test_a_failing_exporter_is_switched_off_and_the_run_goes_on(tmp_path, monkeypatch, caplog):
    calls = []

    class Broken(exporters_mod.Exporter):
        name = "tensorboard"

        def start(self, saved, purge_step):
            return {}

        def log(self, metrics, step):
            calls.append(step)
            raise ConnectionError("tracking server down")

        def finish(self, state):
            raise AssertionError("a switched-off exporter is not finished")

    monkeypatch.setattr(exporters_mod, "check_exporters_available", lambda names: None)
    monkeypatch.setitem(exporters_mod._CLASSES, "tensorboard", Broken)
    rd = RunDir.create(_config(tmp_path, "tensorboard"))
    rd.log_metrics(1, {"loss": 1.0})
    rd.log_metrics(2, {"loss": 0.5})
    rd.set_status("finished")
    assert calls == [1]
    assert [m["loss"] for m in rd.read_metrics()] == [1.0, 0.5]
    assert "switched off" in caplog.text and "tracking server down" in caplog.text


def test_missing_package_names_the_extra(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'reinforge\[wandb\]'"):
        build_config({}, ["tracking.exporters=[wandb]"])
    with pytest.raises(ConfigError, match="listed more than once"):
        build_config({}, ["tracking.exporters=[tensorboard, tensorboard]"])
    with pytest.raises(ConfigError, match="tracking.exporters"):
        build_config({}, ["tracking.exporters=[comet]"])


def test_no_exporters_by_default(tmp_path):
    cfg = build_config({}, [f"tracking.output_dir={tmp_path}"])
    assert cfg.tracking.exporters == []
    rd = RunDir.create(cfg)
    rd.log_metrics(1, {"loss": 1.0})
    rd.set_status("finished")
    assert not (rd.path / "exporters.json").exists()
