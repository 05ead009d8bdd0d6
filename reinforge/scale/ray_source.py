"""Experience from Ray rollout workers, streamed, with bounded staleness.

The trainer asks ``gather(step, timer)`` for a step's scored groups, exactly as it asks its own
``LocalExperienceSource.gather`` in the local mode, and hands the new weights to ``publish(state, version)``
after each update. Between the two, this class keeps the workers busy:

- **Requests.** The curriculum picks prompts (``Curriculum.sample``) in the driver; a request is
  ``ceil(prompts_per_step / rollout_workers)`` prompts with a key (the step slot it is issued for,
  its round) that seeds its sampling, so one worker draws what the local mode draws.
- **Budget (bounded staleness, AReaL arXiv:2505.24298).** With learner version ``v`` (updates
  published), ``s`` steps gathered and ``K = algorithm.max_staleness``, groups in flight or
  waiting may cover steps up to ``v + 1 + K``: requests are issued while
  ``in flight + waiting < (v + 1 + K - s) * prompts_per_step``. A worker receives the weights
  before the requests issued after them (an actor runs its calls in order), so a request issued
  under version ``v`` samples with ``v`` or newer. K = 0 is the synchronous loop.
- **Streaming.** Results are taken as they finish (``ray.wait``, no barrier over workers; of those
  finished, the oldest request's first, so one worker's are taken in order); each one is observed
  by the curriculum and its kept groups queue for the learner. A step takes ``prompts_per_step``
  queued groups; one older than K versions at that step is dropped and counted
  (``stale_dropped_groups``); extra groups wait for the next step.
- **In-flight updates** (``rollout.partial``, PipelineRL arXiv:2509.19128). Weights go to a
  worker's own thread (a Ray concurrency group) and the decode loop loads them between two tokens;
  a request waits for the weights published before it was issued (``min_version``), so the bound
  above holds for a completion's oldest token (``versions``), and ``last_versions`` records the
  newest.
- **Faults.** A worker that dies is started again, given the current weights, and sent its
  unfinished requests again under the same keys; a request's result is taken once (by id), so no
  sample is lost or counted twice (``worker_restarts``).
- **Checkpoints.** ``checkpoint_state`` gives what the requests sampled ahead depend on, and
  ``load_state`` takes it back on resume (``replay``), so an asynchronous run resumes exactly.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections import Counter, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..batch import RolloutBatch, concat_rollouts
from ..rewards import Scores, concat_scores
from ..rollout import SamplingParams
from ..tasks import Example
from ..tracking.io import atomic_write_json
from . import reaper, replay
from .worker import RolloutRequest, RolloutResult, RolloutWorker

MAX_RESTARTS = 3  # per worker, per run
RAY_MISSING = "scale.mode=ray needs Ray, which is not installed: pip install 'reinforge[ray]'"


def import_ray():
    """Ray, imported only in ray mode; a clear message naming the extra when it is absent."""
    try:
        import ray
    except ImportError as err:
        raise ImportError(RAY_MISSING) from err
    return ray


def connect(scale) -> bool:
    """Join the cluster at ``scale.ray_address``, or start a local one with ``scale.num_cpus``
    CPUs. Returns True when this call started Ray (so closing the source shuts it down); a Ray
    already initialised in this process (a test's shared cluster) is used as it is."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    opts: dict[str, Any] = dict(include_dashboard=False, logging_level="warning", log_to_driver=True)
    if scale.ray_address:
        ray.init(address=scale.ray_address, **opts)
    else:
        ray.init(num_cpus=scale.num_cpus, **opts)
    return True


@dataclass
class _Chunk:
    """Kept groups of one result waiting for the learner."""

    rollout: RolloutBatch
    examples: list[Example]
    scores: Scores
    version: int
    request_id: int

    @property
    def groups(self) -> int:
        return self.rollout.num_groups

    def split(self, k: int) -> tuple["_Chunk", "_Chunk"]:
        """The first k groups, and the rest."""
        def part(groups: range) -> _Chunk:
            rows = torch.isin(self.rollout.group_index, torch.tensor(list(groups))).nonzero().squeeze(1)
            r = self.rollout.select(rows)
            return _Chunk(r, [self.examples[g] for g in groups], self.scores.select(rows, r.completion_ids.shape[1]),
                          self.version, self.request_id)
        return part(range(k)), part(range(k, self.groups))


class _WorkerSlot:
    def __init__(self, index: int):
        self.index = index
        self.handle = None
        self.inflight: dict[int, RolloutRequest] = {}  # request id -> request
        self.busy_s = 0.0
        self.restarts = 0
        self.weight_refs: list[Any] = []  # set_weights calls not yet checked


class RayExperienceSource:
    """Rollout workers as Ray actors (module docstring). ``examples``: the task's training
    examples; ``encode``: example -> prompt token ids; ``weights``/``version``: the policy the
    workers start from."""

    def __init__(self, cfg, *, examples: list[Example], encode, curriculum, pad_id: int,
                 weights: dict[str, torch.Tensor], version: int, run_path: Path | None = None):
        self.ray = import_ray()
        self.owns_cluster = connect(cfg.scale)
        self._reaper = self._watch_cluster(cfg.scale)
        self.cfg = cfg
        self.examples, self.encode, self.curriculum, self.pad_id = examples, encode, curriculum, pad_id
        self.run_path = run_path
        self.prompts_per_step = cfg.trainer.prompts_per_step
        self.max_staleness = cfg.algorithm.max_staleness
        self.request_size = math.ceil(self.prompts_per_step / cfg.scale.rollout_workers)
        self.sampling = SamplingParams.from_rollout(cfg.rollout)
        # rollout.partial: weights go to a thread of their own (a concurrency group), so that they
        # reach a worker while its request decodes; otherwise the actor runs its calls in order.
        self.partial = cfg.rollout.partial
        actor = (self.ray.remote(concurrency_groups={"weights": 1})(RolloutWorker) if self.partial
                 else self.ray.remote(RolloutWorker))
        self._actor = actor.options(num_cpus=cfg.scale.worker_cpus, num_gpus=cfg.scale.worker_gpus)
        self._config = cfg.to_dict()
        self._threads = cfg.scale.worker_threads or cfg.trainer.num_threads or torch.get_num_threads()
        self.workers = [_WorkerSlot(i) for i in range(cfg.scale.rollout_workers)]
        self._refs: dict[Any, tuple[_WorkerSlot, RolloutRequest]] = {}
        self._next_id = 0
        self._rounds: Counter[int] = Counter()   # requests issued per step slot (the key's round)
        self.queue: deque[_Chunk] = deque()
        self.version = version
        self.steps_taken = version  # steps gathered; a resume starts at its checkpoint's step
        self._weights_ref = None
        self.completed: list[int] = []          # request ids taken, in order (tests check the ledger)
        self.issued: list[int] = []
        self.request_groups: dict[int, int] = {}  # request id -> its prompts (groups), for the ledger
        self._state_before: dict[int, Any] = {}  # request id -> the curriculum's state before it
        self.staleness_counts: Counter[int] = Counter()
        self.last_token_staleness_counts: Counter[int] = Counter()  # rollout.partial: of each last token
        self._inflight_loads = 0  # weight loads during a generation, since the last step
        self.stale_dropped = 0
        self._started = time.time()
        self._learner_busy_s = 0.0
        self._last_gather_end: float | None = None
        self._info: dict[str, float] = {}
        self._taken_now = 0  # groups the step being gathered has taken (they still use its budget)
        # A resume's replay (replay.py): results that arrived before the checkpoint, taken first,
        # and requests sent again once the checkpoint's weights are published.
        self._ready: deque[tuple[RolloutRequest, RolloutResult]] = deque()
        self._reissue: list[RolloutRequest] = []
        self._snapshot: replay.Snapshot | None = None  # taken when the gather under way began
        # A worker decoding with a bf16 copy gets bf16 weights: half the bytes through the object
        # store, and the same values (its copy rounds fp32 to bf16 on load either way).
        self._ship_dtype = (torch.bfloat16 if cfg.rollout.backend == "hf"
                            and cfg.rollout.resolved_hf_bf16_copy(cfg.model.dtype) else None)
        for w in self.workers:
            self._start(w)
        # Wait until every worker has loaded: one that cannot start fails here, with its error.
        self.worker_pids()
        self._started = time.time()  # busy fractions are of the time after start-up
        # Nothing is requested before the first gather: a resume restores the curriculum first.
        self.publish(weights, version, issue=False)

    def _watch_cluster(self, scale):
        """A local cluster this run started dies with it, even after a SIGKILL (reaper.py)."""
        if not (self.owns_cluster and not scale.ray_address and sys.platform.startswith("linux")):
            return None
        try:
            return reaper.watch(self.ray.get_runtime_context().get_session_name())
        except OSError as err:  # the run goes on; only a SIGKILL of it would leave Ray's agents running
            print(f"reinforge: warning: the watchdog of the local Ray cluster (reinforge/scale/reaper.py) did not "
                  f"start ({err}): if this run is killed, Ray's agents may outlive it by a minute; to manage the "
                  "cluster yourself, `ray start --head` and set scale.ray_address=auto", file=sys.stderr)
            return None

    # -- workers -----------------------------------------------------------------------------
    def _start(self, w: _WorkerSlot) -> None:
        w.handle = self._actor.remote(self._config, w.index, self._threads, list(sys.path))
        w.weight_refs = []
        if self._weights_ref is not None:
            self._send_weights(w)

    def _send_weights(self, w: _WorkerSlot) -> None:
        method = w.handle.set_weights
        if self.partial:
            method = method.options(concurrency_group="weights")
        w.weight_refs.append(method.remote(self._weights_ref, self.version))

    def _restart(self, w: _WorkerSlot, err: Exception) -> None:
        """Start a dead worker again with the current weights and send it its unfinished requests
        again (same ids and keys). A worker that keeps dying (a bad config, no memory) stops the
        run with its error instead of being restarted for ever."""
        if w.restarts >= MAX_RESTARTS:
            raise RuntimeError(f"rollout worker {w.index} died {w.restarts + 1} times; the last time: {err}") from err
        w.restarts += 1
        for ref in [r for r, (slot, _) in self._refs.items() if slot is w]:
            del self._refs[ref]
        self._start(w)
        for req in w.inflight.values():
            self._refs[w.handle.rollout.remote(req)] = (w, req)

    def worker_pids(self) -> list[int]:
        return self.ray.get([w.handle.pid.remote() for w in self.workers])

    # -- weights -----------------------------------------------------------------------------
    def publish(self, state: dict[str, torch.Tensor], version: int, *, issue: bool = True) -> None:
        """Put the weights into the object store once and send every worker a reference; then
        (``issue``) send the requests the new version's staleness budget allows."""
        t0 = time.perf_counter()
        if self._ship_dtype is not None:
            state = {k: v.to(self._ship_dtype) if v.is_floating_point() else v for k, v in state.items()}
        self._weights_ref = self.ray.put(state)
        self.version = int(version)
        # Version v exists only once v steps were gathered (a resume publishes its checkpoint's).
        self.steps_taken = max(self.steps_taken, self.version)
        for w in self.workers:
            self._send_weights(w)
        self._info["weight_sync_s"] = time.perf_counter() - t0
        reissue, self._reissue = self._reissue, []
        for req in reissue:  # a resume's requests issued under these weights: sampled again
            self._send(req)
        if issue:
            self._top_up()

    # -- requests ----------------------------------------------------------------------------
    def _outstanding_groups(self) -> int:
        """Groups in flight, queued, or already taken by the step being gathered."""
        return (sum(len(r.indices) for _, r in self._refs.values()) + sum(c.groups for c in self.queue)
                + sum(len(r.indices) for r, _ in self._ready) + sum(len(r.indices) for r in self._reissue)
                + self._taken_now)

    def _top_up(self) -> None:
        budget = (self.version + 1 + self.max_staleness - self.steps_taken) * self.prompts_per_step
        while self._outstanding_groups() < budget:
            slot = self.steps_taken + 1 + self._outstanding_groups() // self.prompts_per_step
            self._rounds[slot] += 1
            state_before = copy.deepcopy(self.curriculum.state_dict())
            indices = self.curriculum.sample(self.request_size)
            examples = [self.examples[i] for i in indices]
            req = RolloutRequest(self._next_id, (slot, self._rounds[slot]), [self.encode(e) for e in examples],
                                 examples, indices, self.sampling, min_version=self.version)
            self._next_id += 1
            self.issued.append(req.id)
            self.request_groups[req.id] = len(indices)
            self._state_before[req.id] = state_before
            self._send(req)

    def _send(self, req: RolloutRequest) -> None:
        w = min(self.workers, key=lambda s: len(s.inflight))
        w.inflight[req.id] = req
        self._refs[w.handle.rollout.remote(req)] = (w, req)

    def _next_result(self) -> RolloutResult:
        """The next finished request (whichever worker), restarting workers that died; a resume's
        results that arrived before its checkpoint first."""
        if self._ready:
            req, result = self._ready.popleft()
            self.completed.append(req.id)
            self._result_request = req
            return result
        while True:
            if not self._refs:
                raise RuntimeError("no rollout request is in flight: the staleness budget is empty "
                                   f"(version {self.version}, {self.steps_taken} steps gathered)")
            refs = list(self._refs)
            ready, _ = self.ray.wait(refs, num_returns=1)
            # Of the results ready now, the oldest request's (ray.wait picks any): one worker
            # finishes its requests in the order they were issued, so then the order results are
            # taken in, and what a step trains on, does not depend on timing.
            ready = self.ray.wait(refs, num_returns=len(refs), timeout=0)[0] or ready
            ref = min(ready, key=lambda r: self._refs[r][1].id)
            w, req = self._refs[ref]
            try:
                result: RolloutResult = self.ray.get(ref)
            except self.ray.exceptions.RayActorError as err:
                self._restart(w, err)
                continue
            # A weight load that failed would leave the worker sampling an old version for ever
            # (every group then too stale): its error is raised here.
            done, w.weight_refs = self.ray.wait(w.weight_refs, num_returns=len(w.weight_refs), timeout=0) \
                if w.weight_refs else ([], [])
            self.ray.get(done)
            del self._refs[ref]
            del w.inflight[req.id]
            w.busy_s += result.finished - result.started
            self._inflight_loads += int(result.info.get("inflight_weight_loads", 0))
            self.completed.append(req.id)
            self._result_request = req
            return result

    # -- the trainer's side ------------------------------------------------------------------
    def gather(self, step: int, timer):
        """The scored groups step ``step`` trains on (the trainer's ``Scored``), from the queue and
        from results as they arrive; rounds of the curriculum as in ``LocalExperienceSource.gather``."""
        from ..experience import Scored

        # What a checkpoint saves if this step is abandoned (replay.py): the state as it begins.
        self._snapshot = replay.snapshot(self, step)
        now = time.time()
        if self._last_gather_end is not None:
            self._learner_busy_s += now - self._last_gather_end
        need, cur = self.prompts_per_step, self.curriculum
        learner_version = step - 1
        busy_before = [w.busy_s for w in self.workers]
        restarts_before = sum(w.restarts for w in self.workers)
        taken: list[_Chunk] = []
        n_kept = dropped = prompts_arrived = 0
        arrived: list[_Chunk] = []  # this step's fresh results, whole (the fallback below)
        with timer("collect"):  # in ray mode: the learner waiting for rollouts
            self.steps_taken = step - 1
            self._top_up()
            while True:
                # Oldest first: the groups nearest the staleness bound are trained before it
                # passes them (stable, so results of one version keep their arrival order).
                self.queue = deque(sorted(self.queue, key=lambda c: c.version))
                while self.queue and n_kept < need:
                    chunk = self.queue.popleft()
                    if learner_version - chunk.version > self.max_staleness:
                        dropped += chunk.groups
                        continue
                    if chunk.groups > need - n_kept:
                        chunk, rest = chunk.split(need - n_kept)
                        self.queue.appendleft(rest)
                    taken.append(chunk)
                    n_kept += chunk.groups
                    self._taken_now = n_kept
                # A round is prompts_per_step prompts of fresh results, however many requests.
                if n_kept >= need or prompts_arrived // need >= cur.max_rounds:
                    break
                self._top_up()
                result = self._next_result()
                req = self._result_request
                rollout, scores = result.rollout, result.scores
                cur.observe(req.indices, scores.rewards, rollout.group_index)
                version = int(rollout.versions.min()) if len(rollout) else self.version
                whole = _Chunk(rollout, req.examples, scores, version, req.id)
                if learner_version - version > self.max_staleness:
                    dropped += whole.groups
                    continue
                prompts_arrived += len(req.indices)
                arrived.append(whole)
                good = cur.keep(scores.rewards, rollout.group_index).nonzero().squeeze(1)
                if len(good) == rollout.num_groups:
                    self.queue.append(whole)
                elif len(good):
                    rows = torch.isin(rollout.group_index, good).nonzero().squeeze(1)
                    part = rollout.select(rows)
                    self.queue.append(_Chunk(part, [req.examples[int(g)] for g in good],
                                             scores.select(rows, part.completion_ids.shape[1]), version, req.id))
            self.steps_taken, self._taken_now = step, 0
            self._top_up()  # with K >= 1 the workers go on with the next step while the learner trains
        rounds = prompts_arrived // need
        if not taken:
            # Nothing kept in max_rounds rounds: the last round is used whole, as LocalExperienceSource.gather does.
            last_round: list[_Chunk] = []
            while arrived and sum(len(c.examples) for c in last_round) < need:
                last_round.insert(0, arrived.pop())
            if not last_round:
                raise RuntimeError("no rollout arrived for this step")
            taken = last_round
        if len(taken) == 1:
            rollout, examples, scores = taken[0].rollout, taken[0].examples, taken[0].scores
        else:
            rollout = concat_rollouts([c.rollout for c in taken], pad_id=self.pad_id)
            examples = [e for c in taken for e in c.examples]
            scores = concat_scores([c.scores for c in taken], rollout.completion_ids.shape[1])
        staleness = learner_version - rollout.versions
        self.staleness_counts.update(int(s) for s in staleness)
        self.stale_dropped += dropped
        end = time.time()
        window = max(end - (self._last_gather_end or self._started), 1e-9)
        self._last_gather_end = end
        info: dict[str, float] = {}
        if cur.max_rounds > 1:
            info.update(sampling_rounds=float(rounds), informative_groups=float(n_kept))
        busy = [w.busy_s - b for w, b in zip(self.workers, busy_before)]
        info.update({
            "staleness_mean": float(staleness.float().mean()),
            "staleness_max": float(staleness.max()),
            "stale_dropped_groups": float(dropped),
            "worker_restarts": float(sum(w.restarts for w in self.workers) - restarts_before),
            # busy seconds of the results that arrived since the last step, over that window
            "rollout_busy_frac": min(1.0, sum(busy) / (window * len(self.workers))),
            "weight_sync_s": 0.0,  # publish() after this step's update sets it
        })
        if self.partial:  # how much of the batch came from weights loaded mid-generation
            last = learner_version - rollout.last_versions
            self.last_token_staleness_counts.update(int(s) for s in last)
            info.update({
                "inflight_weight_loads": float(self._inflight_loads),
                "partial_rows_frac": float((rollout.last_versions > rollout.versions).float().mean()),
                "last_token_staleness_mean": float(last.float().mean()),
            })
            self._inflight_loads = 0
        self._info = info  # the trainer logs this dict after its sync phase
        self._write_stats()
        return Scored(rollout, examples, scores, info=info)

    def curriculum_state(self) -> Any:
        """The curriculum's state to checkpoint: as it was before the oldest request whose groups
        the next steps may still train on (in flight, or queued and fresh enough), so a resume
        samples those prompts again instead of skipping them; requests already trained on or
        dropped are behind it."""
        live = [r.id for w in self.workers for r in w.inflight.values()]
        live += [r.id for r, _ in self._ready] + [r.id for r in self._reissue]
        live += [c.request_id for c in self.queue if self.steps_taken - c.version <= self.max_staleness]
        if not live:
            return self.curriculum.state_dict()
        oldest = min(live)
        for rid in [i for i in self._state_before if i < oldest]:
            del self._state_before[rid]
        return self._state_before[oldest]

    def checkpoint_state(self, step: int) -> tuple[Any, dict[str, Any]]:
        """What the checkpoint of ``step`` holds of the workers: (the curriculum's state before the
        oldest live request, for a resume that samples again; the replay, ``rollouts.pt``). When the
        gather of step + 1 began (a stop abandoned it), the state as it began."""
        snap = self._snapshot
        if snap is None or snap.step != step + 1:
            snap = replay.snapshot(self, step)
        return snap.fallback, replay.materialize(self, snap, step)

    def load_state(self, state: dict[str, Any]) -> bool:
        """Take a checkpoint's ``rollouts.pt`` back, before its weights are published."""
        return replay.restore(self, state)

    def _write_stats(self) -> None:
        if self.run_path is None:
            return
        wall = max(time.time() - self._started, 1e-9)
        atomic_write_json(self.run_path / "scale.json", {
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness_counts.items())},
            **({"last_token_staleness_histogram": {str(k): v for k, v in
                                                   sorted(self.last_token_staleness_counts.items())}}
               if self.partial else {}),
            "stale_dropped_groups": self.stale_dropped,
            "max_staleness": self.max_staleness,
            "wall_s": wall,
            "learner_busy_frac": self._learner_busy_s / wall,
            "workers": [{"index": w.index, "busy_s": w.busy_s, "busy_frac": w.busy_s / wall, "restarts": w.restarts}
                        for w in self.workers],
        })

    def close(self) -> None:
        """Stop the workers (and Ray, if this source started it). Idempotent."""
        if self.workers is None:
            return
        for w in self.workers:
            try:
                self.ray.kill(w.handle)
            except Exception:  # pragma: no cover - already gone
                pass
        self.workers = None
        self._refs.clear()
        if self.owns_cluster:
            self.ray.shutdown()
        if self._reaper is not None:
            reaper.stop(self._reaper)
