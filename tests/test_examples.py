"""examples/: each script trains to the end in its own process with a tiny model (its key=value
arguments override its config), prints its run directory, and records what it defined (a reward
function, an environment factory, an advantage estimator) in config.yaml."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import save_tiny_model

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


# example -> (config key, the value config.yaml must hold)
RECORDED = {
    "custom_reward.py": ("reward.verifiers.0.options.function", f"{EXAMPLES / 'custom_reward.py'}:name_reward"),
    "custom_env.py": ("env.name", f"{EXAMPLES / 'custom_env.py'}:multiply_env"),
    "custom_advantage.py": ("algorithm.advantage", "pairwise_rank"),
}


def _get(tree, dotted):
    for part in dotted.split("."):
        tree = tree[int(part)] if isinstance(tree, list) else tree[part]
    return tree


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All three examples started at once (most of each is importing torch and transformers, so
    together they take about as long as the slowest), each with tiny overrides; script -> (process,
    its output folder)."""
    root = tmp_path_factory.mktemp("examples")
    model = save_tiny_model(root / "model", hidden=32, layers=1, max_positions=2048)  # prompts of ~700 char tokens
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    started = {}
    for script in RECORDED:
        out = root / script.removesuffix(".py")
        out.mkdir()
        overrides = [f"model.path={model}", "trainer.steps=1", "task.eval_size=2", "rollout.num_samples=2",
                     "rollout.max_new_tokens=4", "trainer.prompts_per_step=2", f"tracking.output_dir={out}",
                     "tracking.progress=false"]
        with open(out / "stdout", "w") as stdout, open(out / "stderr", "w") as stderr:  # files: no pipe to fill
            started[script] = (subprocess.Popen([sys.executable, str(EXAMPLES / script), *overrides], cwd=out,
                                                env=env, stdout=stdout, stderr=stderr), out)
    yield started
    for proc, _ in started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("script", sorted(RECORDED))
def test_example_trains_with_a_tiny_model(script, runs):
    proc, out = runs[script]
    proc.wait(timeout=300)
    stdout = (out / "stdout").read_text()
    assert proc.returncode == 0, (out / "stderr").read_text()[-3000:]
    run_dir = Path(stdout.split("run: ")[1].split(" (")[0])
    assert run_dir.parent == out and "held-out" in stdout  # where it went, and its result
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1] and metrics[0]["skipped"] == 0.0
    key, value = RECORDED[script]
    assert _get(yaml.safe_load((run_dir / "config.yaml").read_text()), key) == value
    if script == "custom_env.py":  # the script's environment ran the trajectories
        assert metrics[0]["agent/env_errors"] == 0 and metrics[0]["agent/turns"] >= 1
