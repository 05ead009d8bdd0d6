"""The CUDA paths of `model.device`: generation, the learner's update, a trainer run with its
checkpoint and resume, on a real GPU. Skipped where no GPU is present (CI); run on a GPU machine
with `pytest tests/test_gpu.py` (docs/benchmarks.md records where they last ran)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import chat_prompts, make_model, make_tokenizer, save_tiny_model
from test_trainer import _config

from reinforge.rollout import SamplingParams
from reinforge.rollout.hf import HFGenerator
from reinforge.tracking import RunDir
from reinforge.trainer import Trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

COMPARED = ("reward_mean", "loss", "grad_norm", "completion_length")


def test_greedy_generation_on_cuda_matches_cpu():
    tok = make_tokenizer()
    cpu_model = make_model(tok, hidden=64, layers=2).float().eval()
    gpu_model = make_model(tok, hidden=64, layers=2).float().eval().to("cuda")
    params = SamplingParams(num_samples=1, max_new_tokens=12, greedy=True)
    prompts = chat_prompts(tok, [f"count {i}" for i in range(4)])
    on_cpu = HFGenerator(cpu_model, tok).generate(prompts, params)
    on_gpu = HFGenerator(gpu_model, tok).generate(prompts, params)
    assert on_gpu.completion_ids.device.type == "cpu"  # batches leave the device between phases
    assert torch.equal(on_cpu.completion_ids, on_gpu.completion_ids)
    torch.testing.assert_close(on_cpu.sampler_logprobs, on_gpu.sampler_logprobs, atol=1e-4, rtol=1e-4)


def test_trainer_runs_on_cuda(tmp_path):
    model_dir = tmp_path / "model"
    save_tiny_model(model_dir, hidden=32, layers=1)
    cfg = _config(tmp_path, model_dir, "model.device=cuda", "model.dtype=float32",
                  "trainer.steps=2", "trainer.eval_every=2", "trainer.checkpoint_every=2")
    result = Trainer(cfg).run()
    rd = RunDir.open(result.run_dir)
    assert rd.status()["state"] == "finished"
    assert (rd.path / "checkpoints").is_dir() or list(rd.path.glob("**/step_000002"))
    # Sampling draws from the device's own generator, so CPU and GPU runs see different samples.
    for m in rd.read_metrics():
        assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"]) and m["generated_tokens"] > 0
    assert torch.cuda.max_memory_allocated() > 0


def test_cuda_run_resumes_like_an_uninterrupted_run(tmp_path):
    model_dir = tmp_path / "model"
    save_tiny_model(model_dir, hidden=32, layers=1)
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    straight = Trainer(_config(tmp_path / "a", model_dir, "model.device=cuda", "trainer.steps=4",
                               "trainer.checkpoint_every=2", "tracking.run_name=straight")).run()
    cut = _config(tmp_path / "b", model_dir, "model.device=cuda", "trainer.steps=2",
                  "trainer.checkpoint_every=2", "tracking.run_name=cut")
    first = Trainer(cut).run()
    from reinforge.cli import main

    assert main(["train", "--resume", str(first.run_dir), "trainer.steps=4"]) == 0
    a = RunDir.open(straight.run_dir).read_metrics()
    b = RunDir.open(first.run_dir).read_metrics()
    assert [m["step"] for m in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        for key in COMPARED:
            assert x[key] == pytest.approx(y[key], rel=1e-4, abs=1e-6), (x["step"], key)
