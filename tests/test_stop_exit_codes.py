"""How a `reinforge` process ends, told to scripts (issue 28, findings 1 and 2), done for real:

- SIGHUP (a closed terminal or ssh session) stops a run as SIGTERM does: the step under way ends,
  its checkpoint is written, status.json says "interrupted" with the signal and the resume
  command. Tested with a real hang-up: the run's terminal is a pseudo-terminal whose other end is
  closed, so every later write to it fails, as after a dropped ssh session.
- The exit status says how the run ended (reinforge/cli/exits.py): 0 finished, 1 failed, 2 a bad
  config, and a stop by signal N ends the process by that signal (a shell's $? is 128+N: 129
  SIGHUP, 130 Ctrl-C, 143 SIGTERM), so a shell script stops at a Ctrl-C instead of going on.
- `reinforge sft`, `train-rm` and `eval` end the same way.

The runs are test_robustness's tiny runs (3 steps; 5 straight), held in step 2's scoring by its
gated reward so that the signal lands mid-step."""

from __future__ import annotations

import fcntl
import os
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
from test_robustness import _assert_same_as_straight, _held_in_step_2, _one_line, _overrides
from test_robustness import root as _robustness_root  # noqa: F401  (a fixture, used below)
from tiny_run import ROOT, cli_env, spawn_cli, tiny_run_overrides

from reinforge.cli import main
from reinforge.tracking import RunDir
from reinforge.tracking.checkpoints import list_checkpoints
from reinforge.tracking.index import format_runs_table, run_info

GATED = "test_robustness:gated_sevens"


@pytest.fixture(scope="module")
def root(_robustness_root):  # noqa: F811
    """test_robustness's tiny runs: a 3-step run, and the same config run straight for 5 steps."""
    return _robustness_root

# A controlling terminal for the command: a new session whose terminal is the pseudo-terminal on fd 0.
_ON_A_TERMINAL = ("import fcntl, os, sys, termios; os.setsid(); fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
                  "os.execv(sys.executable, [sys.executable, '-m', 'reinforge.cli', *sys.argv[1:]])")


def _wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 240, read=None) -> None:
    deadline = time.time() + timeout
    while not condition():
        if read is not None:
            read()
        assert proc.poll() is None, f"the process ended ({proc.returncode}) before {what}"
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _assert_interrupted(run: Path, signal_name: str, step: int, resume: str) -> None:
    status = RunDir.open(run).status()
    assert status["state"] == "interrupted", status
    assert status["signal"] == signal_name and status["step"] == step
    assert status["resume"] == f"{resume} {run}"
    # `reinforge runs` says which signal stopped it
    (line,) = format_runs_table([run_info(RunDir.open(run))], run.parent).splitlines()[1:]
    assert f"interrupted by {signal_name}" in line, line


# ----------------------------------------------------------------------------- SIGHUP


def test_a_closed_terminal_stops_the_run_like_sigterm_and_the_resume_finishes(root):
    """Finding 1: the run's terminal hangs up in step 2 (its other end closed, as when an ssh
    session drops). Before: the run died at once, status.json "running". Now the step ends, its
    checkpoint is written, the status says how, the process ends by SIGHUP, and the resume
    equals the run never stopped."""
    run, gate = root / "runs" / "hangup", root / "hangup.gate"
    gate.touch()
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    # the progress bar on: a rich live display drawing on the terminal, as a person sees it
    args = ["train", *_overrides(root, "hangup", "trainer.steps=5", "tracking.progress=true")]
    proc = subprocess.Popen([sys.executable, "-c", _ON_A_TERMINAL, *args], stdin=slave, stdout=slave, stderr=slave,
                            cwd=ROOT, env=cli_env(TEST_GATE=str(gate), TEST_RUN=str(run), TERM="xterm"))
    os.close(slave)
    shown = bytearray()

    def read() -> None:
        while select.select([master], [], [], 0)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:
                return
            if not data:
                return
            shown.extend(data)

    try:
        metrics = run / "metrics.jsonl"
        _wait_for(lambda: metrics.exists() and metrics.read_text().strip(), proc, "a logged step", read=read)
        time.sleep(0.3)  # into step 2's scoring
        read()
        os.close(master)  # the hang-up: the kernel sends SIGHUP to the terminal's session
        master = None
        time.sleep(1.0)
        assert proc.poll() is None  # the step goes on
        gate.unlink()
        proc.wait(timeout=240)
    finally:
        if master is not None:
            os.close(master)
        gate.unlink(missing_ok=True)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGHUP, bytes(shown).decode(errors="replace")[-3000:]
    assert b"Traceback" not in shown
    _assert_interrupted(run, "SIGHUP", 2, "reinforge train --resume")
    assert [s for s, _ in list_checkpoints(run)][-1] == 2 and not list((run / "checkpoints").glob(".tmp*"))
    # the resume, through the command line: finished, exit 0, no word left of the stop
    resumed = spawn_cli(["train", "--resume", str(run)])
    out, _ = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, out
    status = RunDir.open(run).status()
    assert status["state"] == "finished" and status["step"] == 5
    assert not {"signal", "resume", "reason"} & set(status), status
    _assert_same_as_straight(root, run)


@pytest.mark.skipif(shutil.which("nohup") is None, reason="needs nohup")
def test_under_nohup_a_sighup_is_ignored_as_asked(root):
    """`nohup reinforge train ...` asks the run to outlive its terminal: the SIGHUP it ignores stays
    ignored, and the run finishes."""
    run, gate = root / "runs" / "nohup", root / "nohup.gate"
    gate.touch()
    proc = subprocess.Popen(["nohup", sys.executable, "-m", "reinforge.cli", "train", *_overrides(root, "nohup")],
                            cwd=ROOT, env=cli_env(TEST_GATE=str(gate), TEST_RUN=str(run)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        metrics = run / "metrics.jsonl"
        _wait_for(lambda: metrics.exists() and metrics.read_text().strip(), proc, "a logged step")
        time.sleep(0.3)
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.5)
        gate.unlink()
        out, _ = proc.communicate(timeout=240)
    finally:
        gate.unlink(missing_ok=True)
    assert proc.returncode == 0 and "SIGHUP" not in out, out
    assert RunDir.open(run).status()["state"] == "finished"


# ----------------------------------------------------------------------------- each signal's exit status


# SIGHUP's stop and exact resume are the closed-terminal test's above; a SIGINT's resume is
# test_trainer's interrupted-run test: here the resume runs once, for SIGTERM (suite time).
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_stops_after_the_step_and_the_process_ends_by_it(root, sig):
    """Finding 2: every interrupted run used to exit 0, like a finished one. Now the process ends
    by the signal that stopped it (a shell's $? 128+N), after the step's checkpoint, the status
    and the resume line."""
    proc, run, gate = _held_in_step_2(root, f"stop-{sig.name}")
    try:
        proc.send_signal(sig)
        time.sleep(1.0)
        assert proc.poll() is None  # the step goes on
        gate.unlink()
        out, _ = proc.communicate(timeout=240)
    finally:
        gate.unlink(missing_ok=True)
    assert proc.returncode == -sig, out
    assert f"{sig.name}: stopping after this step and writing a checkpoint" in out and "Traceback" not in out
    assert f"reinforge: stopped by {sig.name} at step 2; a resume continues from the checkpoint of step 2. " \
           f"Resume with: reinforge train --resume {run}" in out
    _assert_interrupted(run, sig.name, 2, "reinforge train --resume")
    if sig == signal.SIGTERM:
        assert main(["train", "--resume", str(run)]) == 0
        _assert_same_as_straight(root, run)


def _child_of(pid: int, timeout: float = 60) -> int:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.time() + timeout
    while not children.read_text().split():
        assert time.time() < deadline, "the shell started no command"
        time.sleep(0.05)
    return int(children.read_text().split()[0])


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.parametrize("how", ["Ctrl-C"])  # SIGTERM's 143 in a shell: the -15 above, the same exit
def test_a_shell_sees_128_plus_n_and_a_ctrl_c_stops_the_script(root, how):
    """In a shell script: SIGTERM to the run gives $? = 143 and the script goes on; a Ctrl-C
    (SIGINT to the whole foreground process group, as a terminal sends it) stops the script too,
    instead of the script running its next command after the run's graceful stop (which an
    `exit(130)` would do: the shell takes a normal exit as "the program handled the Ctrl-C")."""
    name = f"shell-{how}"
    run, gate = root / "runs" / name, root / f"{name}.gate"
    gate.touch()
    script = 'python -m reinforge.cli "$@"; echo "exit status $?"; echo "next command"'
    proc = subprocess.Popen(["bash", "-c", script.replace("python", sys.executable), "bash", "train",
                             *_overrides(root, name, "trainer.steps=5")], cwd=ROOT, start_new_session=True,
                            env=cli_env(TEST_GATE=str(gate), TEST_RUN=str(run)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        metrics = run / "metrics.jsonl"
        _wait_for(lambda: metrics.exists() and metrics.read_text().strip(), proc, "a logged step")
        time.sleep(0.3)
        if how == "Ctrl-C":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            os.kill(_child_of(proc.pid), signal.SIGTERM)
        time.sleep(1.0)
        gate.unlink()
        out, _ = proc.communicate(timeout=240)
    finally:
        gate.unlink(missing_ok=True)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if how == "Ctrl-C":
        assert proc.returncode == -signal.SIGINT, out  # the shell stopped too
        assert "exit status" not in out and "next command" not in out, out
        _assert_interrupted(run, "SIGINT", 2, "reinforge train --resume")
    else:
        assert "exit status 143\nnext command" in out and proc.returncode == 0, out
        _assert_interrupted(run, "SIGTERM", 2, "reinforge train --resume")


# ----------------------------------------------------------------------------- finished, failed, refused


def test_a_failed_run_exits_1_and_says_why(root):
    """A run that diverges (a learning rate of 1e30: the next step's loss is not finite) fails:
    exit status 1, one line, status.json "failed" with the reason."""
    proc = spawn_cli(["train", *_overrides(root, "diverges", "learner.lr=1e30", "trainer.max_consecutive_nan=1")])
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 1, out
    status = RunDir.open(root / "runs" / "diverges").status()
    assert status["state"] == "failed" and status["reason"], status
    assert "signal" not in status


def test_a_bad_config_exits_2_and_nothing_runs(root):
    proc = spawn_cli(["train", *_overrides(root, "refused", "trainer.steps=-1")])
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2, out
    assert "trainer.steps" in out and "Traceback" not in out
    assert not (root / "runs" / "refused").exists()


# ----------------------------------------------------------------------------- sft, train-rm, eval


SFT = "sft={steps: 3, batch_size: 2, num_examples: 12, lr: 0.01, checkpoint_every: 1, eval_every: 1}"


def test_sft_stops_on_sigterm_after_the_step_and_resumes(root):
    """`reinforge sft` had only a Ctrl-C handler; a SIGTERM or SIGHUP killed the step under way
    and the process exited 0. Now it stops as `train` does: held in step 1's evaluation, the stop
    waits for it and the checkpoint."""
    run, gate = root / "runs" / "sft-stop", root / "sft-stop.gate"
    gate.touch()
    proc = spawn_cli(["sft", *tiny_run_overrides(root, "sft-stop", SFT, reward=GATED)],
                     TEST_GATE=str(gate), TEST_RUN=str(run))
    try:
        metrics = run / "metrics.jsonl"
        _wait_for(lambda: metrics.exists() and metrics.read_text().strip(), proc, "a logged SFT step")
        time.sleep(0.3)  # into step 1's evaluation
        proc.send_signal(signal.SIGTERM)
        time.sleep(1.0)
        assert proc.poll() is None  # the evaluation and the checkpoint come first
        gate.unlink()
        out, _ = proc.communicate(timeout=240)
    finally:
        gate.unlink(missing_ok=True)
    assert proc.returncode == -signal.SIGTERM, out
    assert f"reinforge: SFT stopped by SIGTERM at step 1. Resume with: reinforge sft --resume {run}" in out
    assert "Traceback" not in out
    _assert_interrupted(run, "SIGTERM", 1, "reinforge sft --resume")
    assert [s for s, _ in list_checkpoints(run)][-1] == 1
    assert main(["sft", "--resume", str(run)]) == 0
    rd = RunDir.open(run)
    assert rd.status()["state"] == "finished" and [m["step"] for m in rd.read_metrics()] == [1, 2, 3]


def _startup_gated(args: list[str], gate: Path) -> subprocess.Popen:
    """The command, held where it imports its reward module (test_robustness's start-up gate)."""
    gate.touch()
    proc = spawn_cli(args, TEST_STARTUP_GATE=str(gate))
    _wait_for(lambda: Path(str(gate) + ".reached").exists(), proc, "the reward's import")
    return proc


def _stopped_at_startup(args, gate, sig):
    """The command held at start-up by its gate, sent `sig`: the process and its output."""
    proc = _startup_gated(args, gate)
    try:
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
    finally:
        gate.unlink(missing_ok=True)
    return proc, out


def test_train_rm_stopped_by_a_signal_says_how_and_resumes(root):
    run = root / "runs" / "rm-stop"
    args = ["train-rm", f"model.path={root / 'model'}", "task.source=file", f"task.path={root / 'task.jsonl'}",
            "task.eval_size=4", f"reward.verifiers=[{{name: python, options: {{function: '{GATED}'}}}}]",
            "reward.answer_format=raw", "rollout.max_new_tokens=6", f"tracking.output_dir={root / 'runs'}",
            "tracking.run_name=rm-stop", "tracking.progress=false", "rm.kind=outcome", "rm.train_prompts=3",
            "rm.eval_prompts=2", "rm.samples_per_prompt=2", "rm.epochs=1", "rm.batch_size=4",
            "rm.bootstrap_resamples=200"]
    gate = root / "rm-stop.gate"
    proc, out = _stopped_at_startup(args, gate, signal.SIGHUP)
    assert proc.returncode == -signal.SIGHUP, out
    line = _one_line(out)
    assert f"stopped by SIGHUP; the labels made so far are kept. Resume with: reinforge train-rm --resume {run}" in line
    status = RunDir.open(run).status()
    assert status["state"] == "interrupted" and status["signal"] == "SIGHUP" and "step" not in status
    assert status["resume"] == f"reinforge train-rm --resume {run}"
    assert main(["train-rm", "--resume", str(run)]) == 0
    assert RunDir.open(run).status()["state"] == "finished"


def test_eval_stopped_by_a_signal_is_one_line_and_its_exit_status(root):
    out_dir = root / "evals"
    args = ["eval", str(root / "model"), "task.source=file", f"task.path={root / 'task.jsonl'}", "task.eval_size=4",
            f"reward.verifiers=[{{name: python, options: {{function: '{GATED}'}}}}]", "reward.answer_format=raw",
            "--samples", "2", "--max-new-tokens", "4", "--output-dir", str(out_dir), "--name", "stopped"]
    gate = root / "eval-stop.gate"
    proc, out = _stopped_at_startup(args, gate, signal.SIGTERM)
    assert proc.returncode == -signal.SIGTERM, out
    assert _one_line(out) == "reinforge: stopped by SIGTERM"
    assert not (out_dir / "stopped").exists()  # nothing was evaluated: no half-made directory
