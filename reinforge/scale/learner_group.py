"""``scale.learners=N``: the run's learner as N data-parallel ranks (``data_parallel.DataParallel``).

Rank 0 is the trainer's own learner; ranks 1..N-1 are processes this module starts on the
trainer's machine (one per GPU on GPUs, over NCCL; over gloo on a CPU). Each builds its replica
from the run's config (``learner.build.build_learner``), then receives rank 0's whole state
(weights, optimiser, scheduler), so a fresh run and a resumed one start every rank identical.
The driver stays the single controller: for each call that changes or needs every rank (an
update, a log-prob forward, a state load) rank 0 broadcasts the call and its batch, and all ranks
run it together: each takes its share of the micro-batches, and the gradients are summed before
the identical optimiser step, so every rank holds the one-process weights (to float tolerance)
and checkpoints, evaluation and generation read rank 0's.

A rank that fails to start reports its error here before any collective; one that dies later
breaks the next collective, and the run is marked failed and resumes from its checkpoint.
"""

from __future__ import annotations

import atexit
import datetime
import logging
import os
import queue
import signal
import socket
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

# What rank 0 forwards to every rank; anything else (state reads, the live model) is rank 0's own.
_COLLECTIVE = ("update", "compute_logprobs", "load_state_dict")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_device(device: torch.device, rank: int) -> torch.device:
    """Rank ``rank``'s device: the next GPU after rank 0's, or the CPU for every rank."""
    if device.type != "cuda":
        return device
    return torch.device("cuda", (device.index or 0) + rank)


def _check_devices(device: torch.device, world: int) -> None:
    if device.type != "cuda":
        return
    first = device.index or 0
    have = torch.cuda.device_count()
    if first + world > have:
        from ..config import ConfigError

        raise ConfigError(
            f"scale.learners={world} puts one learner rank on each GPU from cuda:{first} "
            f"(cuda:{first}..cuda:{first + world - 1}), but torch sees {have} GPU(s): lower scale.learners "
            f"to {max(have - first, 1)}"
        )


def _init(backend: str, init_method: str, rank: int, world: int, timeout_s: float) -> None:
    import torch.distributed as dist

    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _follow_parent() -> None:
    """Signals are the trainer's to handle: a terminal's Ctrl-C, the SIGHUP of a closed terminal or
    ssh session and Slurm's SIGTERM reach every process, and the trainer finishes or abandons its
    step (every rank takes part) before it stops the ranks. A rank whose trainer is gone (SIGKILL)
    exits by itself."""
    parent = os.getppid()
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="reinforge-parent-watch", daemon=True).start()


def _no_named_semaphores() -> None:
    """tqdm makes a multiprocessing lock for its first progress bar (transformers' "Loading
    weights"): in a spawned process that is a named semaphore, registered with the trainer's
    resource tracker and unlinked by the rank's exit handlers. A rank killed with SIGKILL never runs
    them, and the tracker warned "There appear to be 1 leaked semaphore objects" when the run ended.
    A rank's bars have no other process to coordinate with: a thread lock does."""
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - transformers depends on tqdm
        return
    tqdm.set_lock(threading.RLock())


def _rank_main(cfg, rank: int, world: int, init_method: str, model_path: str, device: str, backend: str,
               timeout_s: float, report) -> None:
    """A learner rank > 0: build the replica, report ready (or the error), then run rank 0's calls."""
    import torch.distributed as dist

    _follow_parent()
    _no_named_semaphores()
    try:
        if cfg.trainer.num_threads:
            torch.set_num_threads(cfg.trainer.num_threads)
        torch.manual_seed(cfg.trainer.seed)
        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        from ..learner.build import build_learner

        learner = build_learner(cfg, model_path, dev)
    except BaseException:  # noqa: BLE001 - the driver prints it; nothing else can
        report.put((rank, traceback.format_exc()))
        return
    report.put((rank, None))
    _init(backend, init_method, rank, world, timeout_s)
    from .data_parallel import DataParallel

    learner.data_parallel = DataParallel()
    try:
        while True:
            call = [None]
            dist.broadcast_object_list(call, src=0)
            name, args, kwargs = call[0]
            if name == "stop":
                break
            getattr(learner, name)(*args, **kwargs)
    finally:
        dist.destroy_process_group()


class LearnerGroup:
    """Rank 0 of ``scale.learners`` data-parallel learner ranks: the ``Learner`` interface the
    trainer uses, with the calls in ``_COLLECTIVE`` run by every rank."""

    def __init__(self, learner, procs: list):
        self.learner = learner
        self._procs = procs
        self._closed = False
        self._in_call = False  # a call rank 0 broadcast and did not finish: the ranks are mid-collective
        atexit.register(self.close)  # before multiprocessing's own exit handler joins the ranks

    @classmethod
    def start(cls, learner, cfg, model_path: str | Path, device: torch.device) -> "LearnerGroup":
        """Start ranks 1..N-1 next to ``learner`` (rank 0, already restored when resuming), wait
        until each has built its replica, join the process group and give them rank 0's state."""
        import torch.multiprocessing as mp

        world = cfg.scale.learners
        _check_devices(device, world)
        backend = "nccl" if device.type == "cuda" else "gloo"
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        timeout_s = cfg.scale.learner_timeout_s
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked CUDA context or trainer threads
        report = ctx.Queue()
        procs = []
        for rank in range(1, world):
            p = ctx.Process(target=_rank_main, name=f"reinforge-learner-{rank}", daemon=True,
                            args=(cfg, rank, world, init_method, str(model_path), str(rank_device(device, rank)),
                                  backend, timeout_s, report))
            p.start()
            procs.append(p)
        group = cls(learner, procs)
        try:
            group._wait_ready(report, world - 1)
            if device.type == "cuda":
                torch.cuda.set_device(device)
            _init(backend, init_method, 0, world, timeout_s)
            from .data_parallel import DataParallel

            learner.data_parallel = DataParallel()
            group.load_state_dict(learner.state_dict())  # every rank starts from rank 0's state
        except BaseException:
            group.close()
            raise
        log.info("data-parallel learner: %d ranks over %s", world, backend)
        return group

    def _wait_ready(self, report, n: int) -> None:
        ready = 0
        while ready < n:
            try:
                rank, err = report.get(timeout=1.0)
            except queue.Empty:
                dead = [p for p in self._procs if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"learner rank process {dead[0].name} exited with code "
                                       f"{dead[0].exitcode} while starting") from None
                continue
            if err is not None:
                raise RuntimeError(f"learner rank {rank} could not build its replica "
                                   f"(scale.learners):\n{err}")
            ready += 1

    def _broadcast(self, name: str, *args, **kwargs) -> None:
        import torch.distributed as dist

        dead = [p for p in self._procs if not p.is_alive()]
        if dead:
            raise RuntimeError(f"learner rank process {dead[0].name} exited (code {dead[0].exitcode}); "
                               "the last checkpoint is intact: resume the run")
        dist.broadcast_object_list([(name, args, kwargs)], src=0)

    def __getattr__(self, name: str) -> Any:
        if name in _COLLECTIVE:
            def collective(*args, **kwargs):
                self._in_call = True
                self._broadcast(name, *args, **kwargs)
                out = getattr(self.learner, name)(*args, **kwargs)
                self._in_call = False
                return out

            return collective
        return getattr(self.learner, name)

    def close(self) -> None:
        """Stop the other ranks and leave the process group (idempotent)."""
        if self._closed:
            return
        self._closed = True
        import torch.distributed as dist

        atexit.unregister(self.close)
        # Ranks still starting, or waiting in a collective of a call that failed here, would never
        # read a stop: they are killed.
        if dist.is_initialized() and not self._in_call and all(p.is_alive() for p in self._procs):
            try:
                dist.broadcast_object_list([("stop", (), {})], src=0)
                for p in self._procs:
                    p.join(timeout=30)
            except Exception as err:  # noqa: BLE001 - a broken group is being torn down anyway
                log.warning("stopping the learner ranks: %s", err)
        self._kill()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.learner.data_parallel = None

    def _kill(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
                p.join()


__all__ = ["LearnerGroup", "rank_device"]
