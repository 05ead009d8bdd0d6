"""The data-parallel learner: 2 real processes over gloo on a CPU give the update one process
gives, to float tolerance (the gradient sum is the only thing whose addition order changes)."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp
from conftest import chat_prompts, make_model, make_tokenizer

from reinforge.batch import TrainBatch
from reinforge.config import AlgorithmConfig, LearnerConfig
from reinforge.learner import Learner
from reinforge.rollout import HFGenerator, SamplingParams

# Small micro-batches, so that the batch has several for the ranks to share.
LEARNER = dict(lr=1e-2, micro_batch_tokens=96, share_prompt_prefix=False)
ALGO = dict(loss_agg="token_mean", entropy_coef=0.01, clip_eps_low=0.1, clip_eps_high=0.1)


def _batch(tok, model) -> TrainBatch:
    prompts = chat_prompts(tok, ["count to three", "say seven", "spell cat", "add one and two", "hi"])
    torch.manual_seed(0)
    rollout = HFGenerator(model, tok).generate(prompts, SamplingParams(num_samples=3, max_new_tokens=12))
    adv = torch.randn(len(rollout), generator=torch.Generator().manual_seed(1))
    return TrainBatch(rollout=rollout, advantages=adv)


def _two_updates(learner: Learner, batch: TrainBatch) -> list[dict[str, float]]:
    """A fresh update (ratio 1), then one with old log-probs (ratio and clip in play)."""
    first = learner.update(batch)
    old = batch.rollout.sampler_logprobs + 0.05 * torch.randn(batch.rollout.sampler_logprobs.shape,
                                                              generator=torch.Generator().manual_seed(2))
    second = learner.update(TrainBatch(rollout=batch.rollout, advantages=batch.advantages, old_logprobs=old))
    return [first, second]


def _rank(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    import torch.distributed as dist

    from reinforge.scale.data_parallel import DataParallel

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_dir)
        batch = torch.load(os.path.join(out_dir, "batch.pt"), weights_only=False)
        learner = Learner(model, LearnerConfig(**LEARNER), AlgorithmConfig(**ALGO), max_new_tokens=12,
                          data_parallel=DataParallel())
        assert len(learner.data_parallel.shard(learner._plan(batch.rollout))) >= 1
        # a budget the whole batch fits in is split so that no rank is idle
        roomy = Learner(model, LearnerConfig(**{**LEARNER, "micro_batch_tokens": 100_000}), AlgorithmConfig(**ALGO),
                        max_new_tokens=12, data_parallel=learner.data_parallel)
        assert len(roomy._plan(batch.rollout)) % world == 0
        stats = _two_updates(learner, batch)
        torch.save({"weights": learner.trainable_state_dict(), "stats": stats,
                    "fresh": learner.last_fresh_logprobs}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_processes_give_the_one_process_update(tmp_path):
    tok = make_tokenizer()
    model = make_model(tok)
    model.save_pretrained(tmp_path / "model")
    batch = _batch(tok, model)
    torch.save(batch, tmp_path / "batch.pt")

    from transformers import AutoModelForCausalLM

    single = Learner(AutoModelForCausalLM.from_pretrained(tmp_path / "model"), LearnerConfig(**LEARNER),
                     AlgorithmConfig(**ALGO), max_new_tokens=12)
    assert len(single._plan(batch.rollout)) >= 3  # the ranks really split the batch
    expected = _two_updates(single, batch)
    want = single.trainable_state_dict()

    mp.spawn(_rank, args=(2, _free_port(), str(tmp_path / "model"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    start = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    for got in ranks:
        for name, value in want.items():
            assert not torch.equal(value, start[name]) or "rotary" in name  # the update moved it
            # (Adam divides by the gradient's running size, so a rounding difference in a
            # near-zero gradient shows in the weight at ~1e-6)
            torch.testing.assert_close(got["weights"][name], value, rtol=1e-4, atol=1e-5)
        for g, e in zip(got["stats"], expected):
            for key in ("loss", "pg_loss", "entropy", "clip_fraction", "grad_norm", "ratio_max"):
                assert g[key] == pytest.approx(e[key], rel=1e-5, abs=1e-7), key
    # the two replicas are bit-identical: same summed gradient, same optimiser step
    for name in want:
        assert torch.equal(ranks[0]["weights"][name], ranks[1]["weights"][name])


def test_data_parallel_needs_an_initialised_process_group():
    from reinforge.scale.data_parallel import DataParallel

    with pytest.raises(RuntimeError, match="init_process_group"):
        DataParallel()
