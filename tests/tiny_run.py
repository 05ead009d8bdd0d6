"""Tiny real runs for tests, in one place: the inputs (a tiny model saved to a folder, a small
task file), the `key=value` overrides of a run on them, a dense reward a tiny model can climb, and
the helpers that copy a run, read its metrics and start `reinforge train` in its own process.

Importable by name (this folder is on sys.path in the tests and in the processes they start), so a
config can name ``'tiny_run:sevens'`` as its python verifier; loading it imports neither pytest nor torch."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The per-step values two runs of the same training must share exactly.
COMPARED = ("reward_mean", "loss", "grad_norm", "completion_length")


def sevens(completion: str, example) -> float:
    """Share of the completion's characters that are '7': dense, so a tiny model's updates change its
    next samples (and it can climb it)."""
    return completion.count("7") / max(len(completion), 1)


def write_task(path: Path, word: str = "say", n: int = 30) -> Path:
    """A file task of `n` prompts "<word> <i>", each with the answer "7"."""
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"prompt": f"{word} {i}", "answer": "7"}) + "\n")
    return path


def save_tiny_run_inputs(root: Path, prompts: int = 30) -> Path:
    """What `tiny_run_overrides(root, ...)` reads: a tiny model (hidden 32, one layer) saved in
    root/model and a task of `prompts` "say <i>" prompts in root/task.jsonl."""
    from conftest import save_tiny_model

    save_tiny_model(root / "model", hidden=32, layers=1)
    write_task(root / "task.jsonl", "say", n=prompts)
    return root


def verifier(reward: str) -> str:
    """The `reward.verifiers` override of one verifier: a ``module:function`` (the python verifier)
    or a bundled verifier's name."""
    if ":" in reward:
        return f"reward.verifiers=[{{name: python, options: {{function: '{reward}'}}}}]"
    return f"reward.verifiers=[{{name: {reward}}}]"


# What a tiny run does, between its reward and its tracking: 2 steps of 2 prompts x 4 samples of up to
# 6 tokens, an evaluation at steps 0 and 2, a checkpoint every step.
SCHEDULE = (
    "rollout.num_samples=4", "rollout.max_new_tokens=6", "trainer.prompts_per_step=2", "trainer.steps=2",
    "trainer.eval_every=2", "trainer.checkpoint_every=1", "trainer.seed=4", "learner.lr=0.05",
)


def tiny_run_overrides(root: Path, name: str | None, *extra: str, reward: str = "tiny_run:sevens",
                       schedule: tuple[str, ...] = SCHEDULE, model: Path | None = None, task: Path | None = None,
                       eval_size: int = 4, runs: Path | None = None) -> list[str]:
    """The overrides of a tiny run named `name` (no `tracking.run_name` when None), in this order:
    the model (root/model), the file task (root/task.jsonl, `eval_size` held out), the reward (see
    `verifier`) with raw answers, `schedule`, the output folder (root/runs) and the run name, no
    progress bar, then `extra` (which, coming last, wins over any of them)."""
    return [
        f"model.path={model or root / 'model'}", "task.source=file", f"task.path={task or root / 'task.jsonl'}",
        f"task.eval_size={eval_size}", verifier(reward), "reward.answer_format=raw", *schedule,
        f"tracking.output_dir={runs or root / 'runs'}", *([f"tracking.run_name={name}"] if name is not None else []),
        "tracking.progress=false", *extra,
    ]


def copy_run(root: Path, src: str, name: str) -> Path:
    """A copy of the run root/runs/`src` as root/runs/`name` (to resume, damage or stop)."""
    dst = root / "runs" / name
    shutil.copytree(root / "runs" / src, dst)
    return dst


def run_metrics(run: Path) -> dict[int, dict]:
    """A run's logged metrics by step."""
    from reinforge.tracking import RunDir

    return {m["step"]: m for m in RunDir.open(run).read_metrics()}


def assert_same_metrics(run: Path, reference: Path, steps, keys=COMPARED) -> None:
    """`run` logged exactly `steps`, each with `reference`'s values of `keys`."""
    got, ref = run_metrics(run), run_metrics(reference)
    assert sorted(got) == list(steps)
    for step in steps:
        for key in keys:
            assert got[step][key] == ref[step][key], (step, key)


def cli_env(**env: str) -> dict[str, str]:
    """This process's environment, plus `env`, with the repository and tests/ on PYTHONPATH: what a
    `reinforge` process needs to import this folder's reward modules by name."""
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, **env}


def spawn_cli(args: list[str], **env: str) -> subprocess.Popen:
    """`python -m reinforge.cli *args` in its own process, from the repository root, stdout and
    stderr together as text."""
    return subprocess.Popen([sys.executable, "-m", "reinforge.cli", *args], cwd=ROOT, env=cli_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for_a_logged_step(proc: subprocess.Popen, run: Path, message: str, timeout: float = 240) -> None:
    """Until the run `proc` writes at `run` has logged a step; its output if it ends first, and
    `message` if `timeout` seconds pass."""
    deadline = time.time() + timeout
    while not ((run / "metrics.jsonl").exists() and (run / "metrics.jsonl").read_text().strip()):
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read())
        assert time.time() < deadline, message
        time.sleep(0.1)


def cli_in_process(*args: str) -> subprocess.CompletedProcess:
    """``reinforge *args`` through the CLI's own entry point in this process, for commands that
    are refused or need no process of their own (a process start costs seconds on two cores):
    its exit status, its stdout, and its stderr with the log records a process would print there."""
    from reinforge.cli import main

    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = main(list(args))
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def bias_stop_token(monkeypatch, bias: float) -> None:
    """Make the trainer's model loader return the real tiny model with ``bias`` added to its stop
    token's logit (a forward hook on the head), so that its turns end and an environment is
    stepped: an untrained tiny model otherwise writes to the token cap every turn."""
    import reinforge.learner.build as build_mod  # where the trainer loads its policy
    from conftest import add_stop_bias

    real = build_mod.load_model

    def load(*a, **k):
        model = real(*a, **k)
        return add_stop_bias(model, model.generation_config.eos_token_id, bias)

    monkeypatch.setattr(build_mod, "load_model", load)
