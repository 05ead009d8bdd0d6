"""Every config under configs/ validates with the command it is written for: a README or docs
command must not fail on a renamed key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from reinforge.config import load_config
from reinforge.reward_models.train import load_rm_config
from reinforge.tracking.sweep import load_sweep, plan_sweep, run_config

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


def test_the_bundled_configs_are_found():
    names = {p.name for p in CONFIGS}
    assert {"main.yaml", "needle_sft_rl.yaml", "train_rm_prm.yaml", "sweep_process_reward.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_bundled_config_validates(path, tmp_path):
    raw = yaml.safe_load(path.read_text())
    if "grid" in raw:  # a sweep: every run's config validates
        spec = load_sweep(path, output_dir=tmp_path)
        runs = plan_sweep(spec)
        assert runs and all(run_config(spec, r).trainer.seed == r.seed for r in runs)
    elif "rm" in raw:
        assert load_rm_config(path).rm.kind in ("prm", "outcome")
    else:
        cfg = load_config(path)
        assert cfg.trainer.steps >= 1
