"""Stops that land inside long computations: the learner abandons its update between two
micro-batches, and a signal that arrives during one long native call is acknowledged at once."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from reinforge.batch import TrainBatch
from reinforge.config import AlgorithmConfig, LearnerConfig
from reinforge.learner import Learner
from reinforge.rollout import HFGenerator, SamplingParams
from reinforge.lifecycle.stopping import StepAbandoned, StopControl

from conftest import chat_prompts

ROOT = Path(__file__).resolve().parents[1]


def test_a_stop_past_its_grace_abandons_the_update_between_micro_batches(tiny_model, tiny_tokenizer, capsys):
    gen = HFGenerator(tiny_model, tiny_tokenizer)
    torch.manual_seed(0)
    rollout = gen.generate(chat_prompts(tiny_tokenizer, ["a", "bb", "what is 3*4?"]),
                           SamplingParams(num_samples=4, temperature=1.0, max_new_tokens=10))
    adv = torch.linspace(-1.5, 1.5, len(rollout))
    model = copy.deepcopy(tiny_model)
    learner = Learner(model, LearnerConfig(lr=1e-2, micro_batch_tokens=40, share_prompt_prefix=False),
                      AlgorithmConfig())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stop = StopControl(grace_s=0.0)
    stop.steps_begin()
    calls = []

    def check():
        calls.append(1)
        if len(calls) == 2:  # a SIGTERM lands during the first micro-batch
            stop._on_signal(signal.SIGTERM, None)
        stop.check_abandon()

    learner.before_micro_batch = check
    with pytest.raises(StepAbandoned):
        learner.step(TrainBatch(rollout=rollout, advantages=adv, old_logprobs=None))
    assert len(calls) == 2 and len(learner._plan(rollout)) > 2  # stopped with micro-batches to go
    assert "SIGTERM: stopping and writing a checkpoint" in capsys.readouterr().err
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(p.grad is None for p in model.parameters()) and not learner.optimizer.state
    # the same learner, asked again without a stop, takes the step
    learner.before_micro_batch = None
    assert learner.step(TrainBatch(rollout=rollout, advantages=adv, old_logprobs=None))["skipped"] == 0.0


def test_a_signal_during_a_long_native_call_is_acknowledged_at_once():
    # The process signals itself 0.5 s into one matrix_power call of several seconds (8 squarings
    # of a 2500x2500 matrix on one thread), during which Python cannot run its handler.
    program = textwrap.dedent("""
        import os, signal, threading, torch
        from reinforge.lifecycle.stopping import StopControl
        torch.set_num_threads(1)
        a = torch.randn(2500, 2500) / 50
        stop = StopControl(grace_s=30.0)
        with stop.installed():
            stop.steps_begin()
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
            torch.linalg.matrix_power(a, 256)
            print("call done", flush=True)
        print("requested", stop.requested, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in (out.stderr + out.stdout).splitlines() if line.strip()]
    assert out.returncode == 0, lines
    ack = next(i for i, line in enumerate(lines) if "SIGINT received: the stop takes effect" in line)
    handled = next(i for i, line in enumerate(lines) if "SIGINT: stopping after this step" in line)
    # the watcher spoke while the call was running; the handler ran only after it returned
    assert ack < handled
    assert lines[-2:] == ["call done", "requested True"]
