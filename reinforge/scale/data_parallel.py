"""A data-parallel learner over torch.distributed: every rank holds the whole policy and its
optimiser, takes its share of a batch's micro-batches, and the gradients are summed over ranks
before the (identical) optimiser step: the algorithm of DDP (Li et al., "PyTorch Distributed:
Experiences on Accelerating Data Parallel Training", VLDB 2020, arXiv:2006.15704).

Because ``Learner.step`` normalises every micro-batch's loss by the whole batch's token and
sequence counts, the summed gradient is the one-process gradient, so N ranks give the same
update as one process up to the order of float additions (tested with 2 gloo processes on a CPU).

The same calls run over gloo on CPUs and NCCL on GPUs (NCCL reduces only CUDA tensors: the
CPU-side sums travel through the rank's GPU). ``scale.learners`` starts the ranks of a run
(``scale.learner_group``). FSDP2 (``torch.distributed.fsdp.fully_shard``, which also shards
parameters and optimiser state) runs on CPU/gloo in torch 2.13 as well, but the learner's state
dicts, LoRA merge and weight export expect whole tensors; it is not wired in (docs/scaling.md).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

# Stats the learner sums over micro-batches (summed over ranks too) and the one it maxes.
_SUMMED = ("loss", "pg_loss", "entropy", "clip_fraction", "kl")
_MAXED = ("ratio_max",)


class DataParallel:
    """This process's place in a process group (``torch.distributed`` initialised by the caller)."""

    def __init__(self, group=None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("DataParallel needs torch.distributed initialised (dist.init_process_group)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        # where this rank's collectives run: NCCL takes CUDA tensors only
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if dist.get_backend(group) == "nccl" else torch.device("cpu"))

    def all_reduce_(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """Reduce ``t`` over ranks in place (through this rank's collective device) and return it."""
        if t.device == self.device:
            dist.all_reduce(t, op=op, group=self.group)
        else:
            moved = t.to(self.device)
            dist.all_reduce(moved, op=op, group=self.group)
            t.copy_(moved)
        return t

    def shard(self, plan: list[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's micro-batches: every world_size-th, starting at its rank."""
        return plan[self.rank :: self.world_size]

    def reduce(self, params: list[torch.nn.Parameter], sums: dict[str, float], finite: bool,
               fresh: torch.Tensor | None) -> bool:
        """Sum the gradients (one flat all-reduce), the summed stats and the fresh log-probs
        (each rank filled its own rows) over ranks; max ``ratio_max``; the step is finite only if
        it is on every rank. Returns that."""
        grads = []
        for p in params:
            if p.grad is None:  # a rank without micro-batches still takes part
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = self.all_reduce_(torch.cat([g.reshape(-1) for g in grads]))
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset : offset + n].view_as(g))
            offset += n
        keys = [k for k in _SUMMED if k in sums]
        stats = torch.tensor([sums[k] for k in keys] + [0.0 if finite else 1.0], dtype=torch.float64)
        self.all_reduce_(stats)
        for k, v in zip(keys, stats.tolist()):
            sums[k] = v
        for k in _MAXED:
            if k in sums:
                sums[k] = float(self.all_reduce_(torch.tensor([sums[k]], dtype=torch.float64), dist.ReduceOp.MAX))
        if fresh is not None:
            self.all_reduce_(fresh)
        return bool(stats[-1] == 0)
