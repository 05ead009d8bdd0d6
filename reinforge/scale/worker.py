"""A rollout worker: a generator and the reward function in a process of its own (a Ray actor).

It builds the same generator as the local mode from the same config, receives the policy's weights
as a state dict with a version (from Ray's object store: no files), samples a request's prompts
under the request's own seed (``rollout.seeding``), scores them, and returns the scored rollout
with the time it was busy. Ray is not imported here: ``ray_source`` wraps this class in
``ray.remote``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from ..batch import RolloutBatch
from ..rewards import Scores
from ..rollout import SamplingParams
from ..tasks import Example


@dataclass
class RolloutRequest:
    """One unit of work: ``prompts`` (token ids, one per group) of the training examples at
    ``indices``, sampled under the seed of ``key`` = (step slot, round)."""

    id: int
    key: tuple[int, int]
    prompts: list[list[int]]
    examples: list[Example]
    indices: list[int]
    sampling: SamplingParams
    min_version: int = 0  # the weights published when it was issued: it samples with these or newer


@dataclass
class RolloutResult:
    request_id: int
    rollout: RolloutBatch
    scores: Scores
    started: float          # time.time() when the worker began the request
    finished: float
    worker_pid: int
    weight_load_s: float = 0.0   # the last weight load before this request
    info: dict[str, float] = field(default_factory=dict)


class RolloutWorker:
    """``config``: the run's config as a dict. ``threads``: torch CPU threads (the trainer's by
    default, so that float results match the local mode). ``sys_path``: the driver's import path,
    so that a user's reward module found by the driver is found here too."""

    def __init__(self, config: dict, worker_id: int, threads: int | None, sys_path: list[str]):
        for p in sys_path:
            if p not in sys.path:
                sys.path.append(p)
        from ..config import RunConfig
        from ..models import compute_dtype, load_model, load_tokenizer, resolve_device, resolve_model_path, resolve_precision
        from ..rewards import build_reward
        from ..rollout import build_generator
        from ..tasks import build_task

        cfg = RunConfig.model_validate(config)
        if threads:
            torch.set_num_threads(threads)
        if cfg.model.dtype == "auto":  # (the trainer sends its resolved config; a worker built alone resolves here)
            cfg, _ = resolve_precision(cfg)
        self.worker_id = worker_id
        self.seed = cfg.trainer.seed
        task = build_task(cfg.task)
        self.reward_fn = build_reward(cfg.reward, task, max_new_tokens=cfg.rollout.max_new_tokens)
        device = resolve_device(cfg.model.device)
        path = resolve_model_path(cfg.model.path)
        tokenizer = load_tokenizer(path)
        # Weights arrive merged (LoRA folded in), so the worker holds the plain base architecture.
        self.model = load_model(cfg.model.model_copy(update={"lora": None}), path=path, device=device)
        self.model.requires_grad_(False)
        self.generator = build_generator(
            cfg.rollout, self.model, tokenizer, model_path=path, model_dtype=cfg.model.dtype,
            autocast_dtype=compute_dtype(cfg.model), seed=cfg.trainer.seed,
        )
        self.weight_load_s = 0.0
        # rollout.partial: weights arrive on their own thread (a Ray concurrency group) while a
        # request decodes; they wait here until the decode loop takes them between two tokens.
        self.partial = cfg.rollout.partial
        self._pending: tuple[Mapping[str, torch.Tensor], int] | None = None
        self._pending_lock = threading.Lock()
        self._inflight_loads = 0

    def pid(self) -> int:
        return os.getpid()

    def set_weights(self, state: Mapping[str, torch.Tensor], version: int) -> int:
        """Take version ``version`` of the policy: load it now, or (``rollout.partial``) keep it
        for the decode loop, replacing an older one not yet loaded."""
        if not self.partial:
            return self._load(state, version)
        with self._pending_lock:
            if self._pending is None or self._pending[1] < version:
                self._pending = (state, version)
        return version

    def _take_pending(self) -> bool:
        """Load the newest weights that arrived since the last load; False when none did."""
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is None or pending[1] <= self.generator.version:
            return False
        self._load(*pending)
        return True

    def _poll_in_flight(self) -> None:
        if self._take_pending():
            self._inflight_loads += 1

    @torch.no_grad()
    def _load(self, state: Mapping[str, torch.Tensor], version: int) -> int:
        t0 = time.perf_counter()
        if self.generator.needs_sync:
            self.generator.sync_weights(state, version)
        else:  # the generator samples from self.model: load into it, then record the version
            self.model.load_state_dict(state)
            self.generator.sync_weights({}, version)
        self.weight_load_s = time.perf_counter() - t0
        return version

    def rollout(self, request: RolloutRequest) -> RolloutResult:
        from ..rollout.seeding import seeded_sampling

        started = time.time()
        info: dict[str, float] = {}
        if self.partial:
            # The weights published before this request was issued may still be on their way
            # (another thread takes them): wait for them, so the staleness bound holds.
            self._take_pending()
            deadline = time.monotonic() + 600
            while self.generator.version < request.min_version:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"request {request.id} needs weights version {request.min_version}, "
                                       f"which did not arrive in 600 s (holding {self.generator.version})")
                time.sleep(0.005)
                self._take_pending()
            self._inflight_loads = 0
            self.generator.weight_poll = self._poll_in_flight
        try:
            with seeded_sampling(self.seed, *request.key):
                rollout = self.generator.generate(request.prompts, request.sampling)
        finally:
            self.generator.weight_poll = None
        if self.partial:
            info["inflight_weight_loads"] = float(self._inflight_loads)
        rows = [request.examples[int(g)] for g in rollout.group_index]
        scores = self.reward_fn.score(rollout, rows)
        return RolloutResult(request.id, rollout, scores, started, time.time(), os.getpid(), self.weight_load_s,
                             info)

    def close(self) -> None:
        self.generator.close()
        close = getattr(self.reward_fn, "close", None)
        if close is not None:
            close()
