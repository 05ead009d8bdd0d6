"""What clusters and disks do to a run, done for real: SIGTERM (what Slurm, Kubernetes and Ray send
before killing) and Ctrl-C in a step and during start-up, sent to real `reinforge train`
processes; a full disk (a real ENOSPC from the kernel: /dev/full, and a tiny tmpfs in a user
namespace where one can be made) during a checkpoint and during a metrics write; and damaged
checkpoints and logs. Each must end in one line saying what happened and what to do, a status that
says it, and (where the run goes on) a resume exactly equal to the run that was never stopped."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_run import (assert_same_metrics, cli_env, copy_run, save_tiny_run_inputs, sevens, spawn_cli,
                      tiny_run_overrides, wait_for_a_logged_step)

from reinforge.cli import main
from reinforge.config import build_config
from reinforge.tracking import RunDir
from reinforge.tracking.checkpoints import file_digest, list_checkpoints, verify_checkpoint
from reinforge.trainer import Trainer

ROOT = Path(__file__).resolve().parents[1]

# A `reinforge train` process loads this module as its reward function while it sets up (after the
# config, before the model): with $TEST_STARTUP_GATE set, it holds there, signal handlers live.
if os.environ.get("TEST_STARTUP_GATE"):
    Path(os.environ["TEST_STARTUP_GATE"] + ".reached").touch()
    while Path(os.environ["TEST_STARTUP_GATE"]).exists():
        time.sleep(0.05)


def gated_sevens(completion: str, example) -> float:
    """Share of '7' characters (dense: a tiny model's updates change its next samples).

    With $TEST_GATE set: waits while that file exists once the run $TEST_RUN has logged
    $TEST_AFTER steps (default 1), i.e. the run is held in its next step's scoring, with its
    signal handlers live. With $TEST_FILL set (a path): once a step is logged, fills the file
    system of that path up to $TEST_LEAVE bytes of free space, once."""
    run = os.environ.get("TEST_RUN")
    if run:
        metrics = Path(run) / "metrics.jsonl"
        logged = len(metrics.read_text().splitlines()) if metrics.exists() else 0
        gate = os.environ.get("TEST_GATE")
        if gate:
            while Path(gate).exists() and logged >= int(os.environ.get("TEST_AFTER", "1")):
                time.sleep(0.05)
        fill = os.environ.get("TEST_FILL")
        if fill and logged >= 1 and not Path(fill).exists():
            st = os.statvfs(Path(fill).parent)
            with open(fill, "wb") as f:
                f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - int(os.environ["TEST_LEAVE"])))
    return sevens(completion, example)


# a tiny run (tiny_run_overrides) of 3 steps, never evaluated, checkpointed every step, scored by gated_sevens
_overrides = functools.partial(tiny_run_overrides, reward="test_robustness:gated_sevens", schedule=(
    "rollout.num_samples=4", "rollout.max_new_tokens=6", "trainer.prompts_per_step=2", "trainer.steps=3",
    "trainer.eval_every=0", "trainer.eval_at_start=false", "trainer.checkpoint_every=1", "trainer.seed=5",
    "learner.lr=0.05"))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A 3-step run checkpointed every step (keeping the default two: steps 2 and 3), and the same
    config run straight for 5 steps."""
    root = save_tiny_run_inputs(tmp_path_factory.mktemp("robust"))
    Trainer(build_config({}, _overrides(root, "base"))).run()
    Trainer(build_config({}, _overrides(root, "straight", "trainer.steps=5"))).run()
    return root


def _assert_same_as_straight(root: Path, run: Path, steps=(1, 2, 3, 4, 5)) -> None:
    assert_same_metrics(run, root / "runs" / "straight", steps)


def _one_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("reinforge:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# ----------------------------------------------------------------------------- checksums


def test_every_checkpoint_file_has_its_checksum_recorded(root):
    ckpts = list_checkpoints(root / "runs" / "base")
    assert [s for s, _ in ckpts] == [2, 3]  # two kept by default: a fallback for a damaged one
    path = ckpts[-1][1]
    files = json.loads((path / "state.json").read_text())["files"]
    assert set(files) == {"weights.safetensors", "optimizer.pt", "rng.pt"}
    for name, recorded in files.items():
        assert recorded == file_digest(path / name)
    assert verify_checkpoint(path).intact and verify_checkpoint(path).verified


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _overwrite_4k(path: Path) -> None:
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid:mid + 4096] = os.urandom(4096)
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated rng.pt": (lambda c: _truncate(c / "rng.pt"), "rng.pt has"),
    "truncated optimizer.pt": (lambda c: _truncate(c / "optimizer.pt"), "optimizer.pt has"),
    "deleted weights": (lambda c: (c / "weights.safetensors").unlink(), "weights.safetensors is missing"),
    "4 KiB of weights overwritten": (lambda c: _overwrite_4k(c / "weights.safetensors"),
                                     "weights.safetensors does not match its recorded SHA-256"),
    "state.json deleted": (lambda c: (c / "state.json").unlink(), "its state.json is missing"),
    # a key removed by hand: found before the model loads, not as a KeyError after it
    "state.json edited": (lambda c: _drop_key(c / "state.json", "sampler"),
                          "state.json does not match its recorded SHA-256 (edited after it was written?)"),
}


def _drop_key(path, key: str) -> None:
    state = json.loads(path.read_text())
    del state[key]
    path.write_text(json.dumps(state))


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_last_checkpoint_with_no_fallback_is_refused_naming_the_file(root, damage, capsys):
    run = copy_run(root, "base", f"refused-{damage.replace(' ', '-')}")
    shutil.rmtree(run / "checkpoints" / "step_000002")  # as with trainer.keep_checkpoints=1
    harm, named = DAMAGE[damage]
    harm(run / "checkpoints" / "step_000003")
    metrics = (run / "metrics.jsonl").read_bytes()
    assert main(["train", "--resume", str(run), "trainer.steps=5"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "checkpoint step_000003 is damaged" in line and named in line
    assert "no intact earlier checkpoint" in line and "start a new run" in line
    status = RunDir.open(run).status()
    assert status["state"] == "failed" and named in status["reason"]
    # never a silent restart from step 0: the logs are untouched
    assert (run / "metrics.jsonl").read_bytes() == metrics


def test_a_damaged_last_checkpoint_falls_back_to_the_one_before_exactly(root, capsys):
    run = copy_run(root, "base", "fallback")
    _overwrite_4k(run / "checkpoints" / "step_000003" / "weights.safetensors")  # same size: silent before
    (run / "checkpoints" / ".tmp-step_000009").mkdir()  # what a SIGKILL mid-write leaves (another step)
    assert main(["train", "--resume", str(run), "trainer.steps=5"]) == 0
    err = capsys.readouterr().err
    warning = next(line for line in err.splitlines() if "is damaged" in line)
    assert "checkpoint step_000003 is damaged (weights.safetensors does not match its recorded SHA-256" in warning
    assert "resuming from the newest intact one, step_000002" in warning
    assert "from the checkpoint of step 2" in err
    _assert_same_as_straight(root, run)
    assert RunDir.open(run).status()["state"] == "finished"
    assert [s for s, _ in list_checkpoints(run)] == [4, 5] and verify_checkpoint(run / "checkpoints" / "step_000005").intact
    assert not list((run / "checkpoints").glob(".tmp*"))


@pytest.mark.parametrize("damage", ["truncated optimizer.pt", "state.json deleted", "state.json edited"])
def test_other_damage_falls_back_too(root, damage, capsys):
    from reinforge.lifecycle.resume import choose_checkpoint

    run = copy_run(root, "base", f"fallback-{damage.replace(' ', '-')}")
    harm, named = DAMAGE[damage]
    harm(run / "checkpoints" / "step_000003")
    import io

    out = io.StringIO()
    step, path = choose_checkpoint(RunDir.open(run), out=out)
    assert (step, path.name) == (2, "step_000002")
    assert f"step_000003 is damaged ({named}" in out.getvalue()


def test_a_checkpoint_from_before_checksums_still_resumes_with_a_note(root, capsys):
    run = copy_run(root, "base", "legacy")
    for _, ckpt in list_checkpoints(run):
        state = json.loads((ckpt / "state.json").read_text())
        del state["files"], state["state_sha256"]  # as written before checksums were recorded
        (ckpt / "state.json").write_text(json.dumps(state))
    assert main(["train", "--resume", str(run), "trainer.steps=4"]) == 0
    assert "step_000003 was written before checksums were recorded" in capsys.readouterr().err
    _assert_same_as_straight(root, run, steps=(1, 2, 3, 4))


def test_an_unverifiable_unreadable_file_is_named_and_the_run_marked_failed(root, capsys):
    run = copy_run(root, "base", "legacy-truncated")
    ckpt = run / "checkpoints" / "step_000003"
    state = json.loads((ckpt / "state.json").read_text())
    del state["files"], state["state_sha256"]
    (ckpt / "state.json").write_text(json.dumps(state))
    _truncate(ckpt / "optimizer.pt")
    assert main(["train", "--resume", str(run), "trainer.steps=4"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert f"{ckpt / 'optimizer.pt'} cannot be read" in line
    status = RunDir.open(run).status()
    assert status["state"] == "failed" and "optimizer.pt cannot be read" in status["reason"]


def test_a_directory_in_place_of_a_log_is_named_with_the_fix(root, capsys):
    run = copy_run(root, "base", "log-dir")
    (run / "samples.jsonl").unlink()
    (run / "samples.jsonl").mkdir()
    assert main(["train", "--resume", str(run), "trainer.steps=4"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert ("samples.jsonl: is a directory, not the JSON-lines log reinforge writes there; move it out of the run "
            "directory") in line, line
    assert main(["runs", str(run.parent)]) == 0  # the listing goes on past it
    capsys.readouterr()


def test_a_garbage_line_in_metrics_is_named_with_the_fix(root, capsys):
    run = copy_run(root, "base", "garbage")
    lines = (run / "metrics.jsonl").read_text().splitlines(keepends=True)
    lines.insert(1, "}{ not json\n")
    (run / "metrics.jsonl").write_text("".join(lines))
    assert main(["train", "--resume", str(run), "trainer.steps=4"]) == 1
    line = _one_line(capsys.readouterr().err)
    assert "metrics.jsonl: line 2 is not valid JSON" in line and "delete or repair that line" in line
    status = RunDir.open(run).status()
    assert status["state"] == "failed" and "line 2" in status["reason"]
    # repaired as told, it resumes exactly
    del lines[1]
    (run / "metrics.jsonl").write_text("".join(lines))
    assert main(["train", "--resume", str(run), "trainer.steps=4"]) == 0
    _assert_same_as_straight(root, run, steps=(1, 2, 3, 4))


# ----------------------------------------------------------------------------- signals, real processes


def _held_in_step_2(root: Path, name: str, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    """`reinforge train` in its own process, held in step 2's scoring (step 1 logged)."""
    run, gate = root / "runs" / name, root / f"{name}.gate"
    gate.touch()
    proc = spawn_cli(["train", *_overrides(root, name, "trainer.steps=5", *extra)], TEST_GATE=str(gate),
                     TEST_RUN=str(run))
    wait_for_a_logged_step(proc, run, "the run logged no step")
    time.sleep(0.3)  # into step 2's scoring
    return proc, run, gate


def test_sigterm_finishes_the_step_checkpoints_and_resumes_exactly(root, capsys):
    proc, run, gate = _held_in_step_2(root, "term-finish", "trainer.checkpoint_every=4")
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert proc.poll() is None  # the step goes on within the grace period
    gate.unlink()
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == -signal.SIGTERM, out  # the process ends by the signal (cli/exits.py)
    assert "SIGTERM: stopping after this step and writing a checkpoint" in out and "Traceback" not in out
    assert f"Resume with: reinforge train --resume {run}" in out
    status = RunDir.open(run).status()
    assert status["state"] == "interrupted" and status["step"] == 2
    assert status["resume"] == f"reinforge train --resume {run}"
    assert [s for s, _ in list_checkpoints(run)] == [2] and not list((run / "checkpoints").glob(".tmp*"))
    assert main(["train", "--resume", str(run)]) == 0
    _assert_same_as_straight(root, run)


def test_sigterm_past_the_grace_period_abandons_the_step_and_resumes_exactly(root):
    # step 1 was not checkpointed (every 4): the abandoned step 2's start state is written as step 1's
    proc, run, gate = _held_in_step_2(root, "term-abandon", "trainer.checkpoint_every=4", "trainer.stop_grace_s=0.5")
    try:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)  # the gate stays: only abandoning ends the step
    finally:
        gate.unlink()
    assert proc.returncode == -signal.SIGTERM, out
    assert "step 2 was still running after the 0.5 s grace period: abandoned" in out and "Traceback" not in out
    status = RunDir.open(run).status()
    assert status["state"] == "interrupted" and status["step"] == 1
    assert [s for s, _ in list_checkpoints(run)] == [1] and [m["step"] for m in RunDir.open(run).read_metrics()] == [1]
    assert main(["train", "--resume", str(run)]) == 0
    _assert_same_as_straight(root, run)


def test_sigterm_past_the_grace_period_abandons_an_evaluation_which_the_resume_makes(root):
    # eval_every=1: step 1 is logged, then its held-out evaluation is held in scoring
    proc, run, gate = _held_in_step_2(root, "term-eval", "trainer.eval_every=1", "trainer.stop_grace_s=0.5")
    try:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)  # the gate stays: only abandoning ends the evaluation
    finally:
        gate.unlink()
    assert proc.returncode == -signal.SIGTERM, out
    assert "the evaluation of step 1 was still running after the 0.5 s grace period: abandoned" in out
    assert "Traceback" not in out
    rd = RunDir.open(run)
    assert rd.status()["state"] == "interrupted" and rd.status()["step"] == 1
    assert [s for s, _ in list_checkpoints(run)] == [1] and rd.eval_steps() == []
    assert main(["train", "--resume", str(run)]) == 0
    assert RunDir.open(run).eval_steps() == [1, 2, 3, 4, 5]
    _assert_same_as_straight(root, run)


def test_a_second_signal_stops_at_once_with_the_last_checkpoint_intact(root):
    proc, run, gate = _held_in_step_2(root, "term-twice")
    try:
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)  # the gate stays: the step never finishes
    finally:
        gate.unlink()
    assert proc.returncode == -signal.SIGTERM and "Traceback" not in out, out  # the first signal: the stop's
    assert "a resume continues from the checkpoint of step 1" in out
    assert RunDir.open(run).status()["state"] == "interrupted"
    assert [s for s, _ in list_checkpoints(run)] == [1] and not list((run / "checkpoints").glob(".tmp*"))
    assert main(["train", "--resume", str(run)]) == 0
    _assert_same_as_straight(root, run)


@pytest.mark.parametrize("how", ["new run, Ctrl-C", "resume, SIGTERM"])
def test_a_stop_during_start_up_is_one_line_and_leaves_a_consistent_status(root, how):
    gate = root / f"startup-{how[:3]}.gate"
    gate.touch()
    if how.startswith("new"):
        run = root / "runs" / "startup-new"
        args, sig = ["train", *_overrides(root, "startup-new")], signal.SIGINT
    else:
        run = copy_run(root, "base", "startup-resume")
        args, sig = ["train", "--resume", str(run), "trainer.steps=5"], signal.SIGTERM
    proc = spawn_cli(args, TEST_STARTUP_GATE=str(gate))
    try:
        deadline = time.time() + 240
        while not Path(str(gate) + ".reached").exists():
            assert proc.poll() is None and time.time() < deadline, proc.stdout.read() if proc.poll() else "no start"
            time.sleep(0.05)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        gate.unlink()
    assert proc.returncode == -sig, out
    line = _one_line(out)
    assert f"stopped by {sig.name} during start-up; nothing was trained" in line
    if how.startswith("new"):
        assert not run.exists()  # nothing was written
    else:
        assert f"Resume with: reinforge train --resume {run}" in line
        status = RunDir.open(run).status()
        assert status["state"] == "interrupted" and status["step"] == 3
        assert [m["step"] for m in RunDir.open(run).read_metrics()] == [1, 2, 3]


# ----------------------------------------------------------------------------- full disks


def test_a_full_disk_during_a_checkpoint_is_one_line_and_the_previous_checkpoint_resumes_exactly(
        root, monkeypatch, capsys):
    import builtins

    from reinforge.lifecycle import checkpoint as checkpoint_module

    def open_on_a_full_disk(path, mode="r", *args, **kwargs):
        # step 2's optimizer state goes to /dev/full: the kernel's own ENOSPC, through torch.save
        if "w" in mode and Path(path).name == "optimizer.pt" and ".tmp-step_000002" in str(path):
            return builtins.open("/dev/full", mode, *args, **kwargs)
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "open", open_on_a_full_disk, raising=False)
    run = root / "runs" / "full-checkpoint"
    assert main(["train", *_overrides(root, "full-checkpoint", "trainer.steps=5")]) == 1
    line = _one_line(capsys.readouterr().err)
    assert f"no space left on device writing checkpoint step_000002 in {run / 'checkpoints'}" in line
    assert "the partial folder was removed and the previous checkpoint step_000001 is intact" in line
    assert f"`reinforge train --resume {run}`" in line
    assert not list((run / "checkpoints").glob(".tmp*")) and [s for s, _ in list_checkpoints(run)] == [1]
    status = RunDir.open(run).status()
    assert status["state"] == "failed" and "no space left on device" in status["reason"]
    monkeypatch.undo()  # space freed
    assert main(["train", "--resume", str(run)]) == 0
    _assert_same_as_straight(root, run)


def test_a_full_disk_during_a_metrics_write_is_one_line_naming_the_file(root, monkeypatch, capsys):
    import builtins

    from reinforge.tracking import io as io_module

    appends = []

    def open_on_a_full_disk(path, mode="r", *args, **kwargs):
        # step 3's metrics line goes to /dev/full: a real ENOSPC from write(), which names no file
        if Path(path).name == "metrics.jsonl" and "a" in mode:
            appends.append(path)
            if len(appends) == 3:
                return builtins.open("/dev/full", mode, *args, **kwargs)
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(io_module, "open", open_on_a_full_disk, raising=False)
    run = root / "runs" / "full-metrics"
    assert main(["train", *_overrides(root, "full-metrics", "trainer.steps=5")]) == 1
    line = _one_line(capsys.readouterr().err)
    assert f"no space left on device writing {run / 'metrics.jsonl'}" in line  # named by the io layer
    assert "the latest checkpoint step_000002 is intact" in line
    assert RunDir.open(run).status()["state"] == "failed"
    monkeypatch.undo()
    assert main(["train", "--resume", str(run)]) == 0
    _assert_same_as_straight(root, run)


def _tmpfs_available() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m none /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(sys.platform != "linux" or not _tmpfs_available(),
                    reason="needs unprivileged user and mount namespaces (unshare -rm) to mount a tiny tmpfs")
def test_a_real_full_tmpfs_during_a_checkpoint(root, tmp_path):
    """The run directory on a real 4 MiB tmpfs (a private mount namespace); during step 2 the reward
    function fills it up to 100 kB, less than a checkpoint: the kernel's ENOSPC, however torch and
    safetensors report it. Then the filler is deleted and the run resumed, in the same namespace."""
    mnt, saved = tmp_path / "disk", tmp_path / "saved"
    mnt.mkdir()
    overrides = " ".join(f"'{o}'" for o in _overrides(root, "tmpfs", "trainer.steps=5", runs=mnt / "runs"))
    py = f"{sys.executable} -m reinforge.cli"
    script = (
        f"mount -t tmpfs -o size=4m none {mnt} && "
        f"TEST_RUN={mnt}/runs/tmpfs TEST_FILL={mnt}/filler TEST_LEAVE=100000 {py} train {overrides} "
        f"> {tmp_path}/first.txt 2>&1; echo $? > {tmp_path}/first.rc; "
        f"cp -r {mnt}/runs/tmpfs {tmp_path}/after-failure; rm {mnt}/filler; "
        f"{py} train --resume {mnt}/runs/tmpfs > {tmp_path}/second.txt 2>&1; echo $? > {tmp_path}/second.rc; "
        f"rm -rf {mnt}/runs/tmpfs/checkpoints {mnt}/runs/tmpfs/final_model; cp -r {mnt}/runs/tmpfs {saved}"
    )
    subprocess.run(["unshare", "-rm", "sh", "-c", script], env=cli_env(), cwd=ROOT, timeout=480, check=True)
    first = (tmp_path / "first.txt").read_text()
    assert (tmp_path / "first.rc").read_text().strip() == "1", first
    line = _one_line(first)
    assert "no space left on device writing checkpoint step_000002" in line, line
    assert "the previous checkpoint step_000001 is intact" in line
    print(line)
    failed = tmp_path / "after-failure"
    status = json.loads((failed / "status.json").read_text())
    assert status["state"] == "failed" and "no space left on device" in status["reason"]
    assert not list((failed / "checkpoints").glob(".tmp*"))
    assert (tmp_path / "second.rc").read_text().strip() == "0", (tmp_path / "second.txt").read_text()
    assert json.loads((saved / "status.json").read_text())["state"] == "finished"
    _assert_same_as_straight(root, saved)


def test_a_second_signal_waits_for_the_checkpoint_being_written():
    """Real signals to this process: the first asks to stop, a second during a checkpoint write
    is held until the write ends, then stops; a second one elsewhere stops at once."""
    import io

    from reinforge.lifecycle.stopping import StopControl

    out = io.StringIO()
    stop = StopControl(grace_s=60, out=out)
    with stop.installed():
        stop.steps_begin()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
        assert stop.requested and "SIGTERM: stopping after this step" in out.getvalue()
        written = []
        with pytest.raises(KeyboardInterrupt):
            with stop.critical():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                written.append("the whole checkpoint")  # not interrupted
        assert written == ["the whole checkpoint"] and "as soon as the checkpoint being written is complete" in out.getvalue()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.5)
    assert signal.getsignal(signal.SIGTERM) is not stop._on_signal  # handed back
