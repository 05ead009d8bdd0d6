"""model.dtype=auto: bf16 only where the hardware computes it natively and faster; the choice is
recorded in the run directory and a resume keeps it."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import reinforge.precision as precision
from reinforge.config import build_config
from reinforge.models import compute_dtype, resolve_precision
from reinforge.tracking import RunDir
from reinforge.trainer import Trainer

import test_trainer

AVX2 = {"model": "AMD EPYC", "machine": "x86_64", "capability": "AVX2", "avx512_bf16": False, "amx_tile": False,
        "mkldnn_bf16": False}
AMX = {"model": "Intel(R) Xeon(R) Platinum 8480+", "machine": "x86_64", "capability": "AVX512",
       "avx512_bf16": True, "amx_tile": True, "mkldnn_bf16": True}
AVX512_NO_BF16 = {**AVX2, "capability": "AVX512", "mkldnn_bf16": True}  # oneDNN emulates bf16 here


def _cpu(monkeypatch, flags, speedup=None):
    monkeypatch.setattr(precision, "_cpu_flags", lambda: dict(flags))
    probes = []

    def probe(device_type="cpu", threads=None, size=128):
        probes.append(device_type)
        return {"float32_s": 1.0, "bfloat16_s": 1.0 / speedup, "float32_gflops": 50.0,
                "bfloat16_gflops": 50.0 * speedup, "bf16_speedup": speedup}

    if speedup is not None:
        monkeypatch.setattr(precision, "bf16_probe", probe)
    return probes


def test_auto_is_float32_without_native_bf16_and_runs_no_probe(monkeypatch):
    for flags in (AVX2, AVX512_NO_BF16):
        probes = _cpu(monkeypatch, flags, speedup=3.0)  # a probe must not even be asked
        choice = precision.choose_dtype("auto", "cpu")
        assert choice.dtype == "float32" and probes == []
        assert "no native bf16" in choice.reason and flags["capability"] in choice.reason


def test_auto_is_bf16_with_native_bf16_confirmed_by_the_probe(monkeypatch):
    _cpu(monkeypatch, AMX, speedup=2.1)
    choice = precision.choose_dtype("auto", "cpu")
    assert choice.dtype == "bfloat16" and "AVX512-BF16+AMX" in choice.reason and "2.10x" in choice.reason
    # flags that promise native bf16 but a probe that finds it no faster: fp32
    _cpu(monkeypatch, AMX, speedup=0.9)
    choice = precision.choose_dtype("auto", "cpu")
    assert choice.dtype == "float32" and "reports native bf16, but" in choice.reason


def test_explicit_bf16_is_kept_but_warned_about_with_the_measured_slowdown(monkeypatch):
    _cpu(monkeypatch, AVX2, speedup=0.05)
    choice = precision.choose_dtype("bfloat16", "cpu")
    assert choice.dtype == "bfloat16"
    assert "about 20x slower" in choice.warning and "model.dtype=auto" in choice.warning
    assert precision.choose_dtype("float32", "cpu").warning is None


def test_the_real_probe_measures_both_dtypes_on_this_machine():
    result = precision.bf16_probe("cpu", torch.get_num_threads())
    assert result["float32_s"] > 0 and result["bfloat16_s"] > 0
    assert result["bf16_speedup"] == pytest.approx(result["float32_s"] / result["bfloat16_s"])
    info = precision.hardware_info()
    assert info["cpu"]["capability"] == torch.backends.cpu.get_cpu_capability()
    assert isinstance(info["cpu"]["native_bf16"], bool)


def test_an_unresolved_auto_is_refused_where_a_dtype_is_read(monkeypatch):
    cfg = build_config({}, [])
    assert cfg.model.dtype == "auto"
    with pytest.raises(ValueError, match="must be resolved first"):
        compute_dtype(cfg.model)
    _cpu(monkeypatch, AVX2)
    resolved, choice = resolve_precision(cfg, torch.device("cpu"))
    assert resolved.model.dtype == "float32" and cfg.model.dtype == "auto" and compute_dtype(resolved.model) is None


def test_a_run_records_the_choice_and_a_resume_keeps_it(tmp_path, tiny_model_dir, monkeypatch, caplog):
    _cpu(monkeypatch, AMX, speedup=2.0)  # the run starts on a machine with native bf16 ...
    cfg = test_trainer._config(tmp_path, tiny_model_dir, "trainer.steps=1", "trainer.eval_every=0",
                               "trainer.checkpoint_every=1")
    with caplog.at_level(logging.INFO, logger="reinforge"):
        result = Trainer(cfg).run()
    assert any("model.dtype=auto -> bfloat16" in r.getMessage() for r in caplog.records)
    rd = RunDir.open(result.run_dir)
    assert rd.load_config()["model"]["dtype"] == "bfloat16"
    env = json.loads((rd.path / "environment.json").read_text())
    assert env["precision"]["requested"] == "auto" and env["precision"]["dtype"] == "bfloat16"
    assert env["precision"]["probe"]["bf16_speedup"] == 2.0
    assert "capability" in env["hardware"]["cpu"] and "model" in env["hardware"]["cpu"]
    # ... and is resumed on one without: the checkpoint's dtype stays, with the warning
    _cpu(monkeypatch, AVX2, speedup=0.1)
    from reinforge.cli import main

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="reinforge"):
        assert main(["train", "--resume", str(rd.path), "trainer.steps=2"]) == 0
    assert rd.load_config()["model"]["dtype"] == "bfloat16"
    assert any("about 10x slower" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
