"""What an asynchronous run's checkpoint holds of its rollout workers, so that a resume trains on
exactly what the uninterrupted run trains on.

With ``algorithm.max_staleness=K > 0`` the workers sample ahead: when the checkpoint of step ``s``
is written, requests for the next steps are in flight (some sampled with weights older than
step ``s``'s), and results may be queued, not yet trained on. A resume that sampled those prompts
again with the checkpoint's weights would train step ``s + 1`` on other samples (staleness 0
instead of 1) and differ from there on. So the checkpoint holds (``rollouts.pt``):

- every live request (in flight, or arrived and not yet taken) in the order it was issued, with
  its key, prompts and the version it was issued under;
- the result of each one issued under an older version than the checkpoint's weights: the
  checkpoint waits for it (it was issued before the step's update, so it is usually done by then);
  one issued under the checkpoint's own version is sampled again on resume, under the same key
  with the same weights, which gives the same tokens;
- the groups queued for the learner, the curriculum as it is now (after sampling those requests),
  the requests issued per step slot (the keys' rounds), the next request id, and the staleness
  counters of ``scale.json``.

A resume puts the arrived results first (one worker returns its requests in the order they were
issued), sends the others again, and then goes on as the uninterrupted run would. When the gather
of the next step had begun before a stop abandoned it, the state taken when that gather began is
saved instead (``snapshot`` at the start of every gather), so an abandoned step is redone exactly
too. A resume that changes what a step computes (``--new-segment``) does not replay: it samples
again from the curriculum as it was before the oldest live request (``curriculum_state``).
"""

from __future__ import annotations

import copy
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

FORMAT = 1


@dataclass
class Snapshot:
    """The source's rollout state at one moment, cheap to take: references, not results."""

    step: int                     # the gather it was taken at the start of (0: at start-up)
    version: int                  # the weights published then
    live: list[tuple[Any, Any, Any]]  # (request, its ref or None, its result or None), by request id
    queue: list[Any]              # _Chunks waiting for the learner, in order
    curriculum: Any               # the curriculum's state (deep copy)
    fallback: Any                 # its state before the oldest live request (a resume that re-samples)
    rounds: Counter
    next_id: int
    state_before: dict[int, Any]
    stats: dict[str, Any]


def snapshot(src, step: int) -> Snapshot:
    live = [(req, ref, None) for ref, (_, req) in src._refs.items()]
    live += [(req, None, result) for req, result in src._ready]
    live += [(req, None, None) for req in src._reissue]
    live.sort(key=lambda x: x[0].id)
    return Snapshot(
        step, src.version, live, list(src.queue), copy.deepcopy(src.curriculum.state_dict()),
        copy.deepcopy(src.curriculum_state()), Counter(src._rounds), src._next_id, dict(src._state_before),
        {"staleness": Counter(src.staleness_counts), "last_token": Counter(src.last_token_staleness_counts),
         "dropped": src.stale_dropped},
    )


def materialize(src, snap: Snapshot, step: int) -> dict[str, Any]:
    """``snap`` as the picklable ``rollouts.pt`` of the checkpoint of ``step`` (whose weights a
    resume publishes as version ``step``): the results of requests issued under older weights
    are waited for."""
    requests = []
    for req, ref, result in snap.live:
        if result is None and ref is not None and req.min_version < step:
            try:
                result = src.ray.get(ref)
            except Exception:  # noqa: BLE001 - the run meets this error when it takes the result
                # A worker that died is restarted and samples it again with the current weights,
                # which is what a resume does with a request it sends again.
                result = None
        requests.append((req, result))
    ids = {req.id for req, _ in requests} | {c.request_id for c in snap.queue}
    return {
        "format": FORMAT, "version": snap.version, "requests": requests, "queue": snap.queue,
        "curriculum": snap.curriculum, "rounds": dict(snap.rounds), "next_id": snap.next_id,
        "state_before": {i: s for i, s in snap.state_before.items() if i in ids},
        "stats": {k: dict(v) if isinstance(v, Counter) else v for k, v in snap.stats.items()},
    }


def restore(src, state: dict[str, Any]) -> bool:
    """Load a checkpoint's ``rollouts.pt`` into a source that has just started (before the
    checkpoint's weights are published). False, and nothing changed, when it cannot be replayed."""
    if state.get("format") != FORMAT:
        return False
    src.curriculum.load_state_dict(state["curriculum"])
    src._rounds = Counter({int(k): v for k, v in state["rounds"].items()})
    src._next_id = int(state["next_id"])
    src._state_before.update(state["state_before"])
    src.queue = deque(state["queue"])
    for req, result in state["requests"]:
        src.issued.append(req.id)
        src.request_groups[req.id] = len(req.indices)
        if result is None:
            src._reissue.append(req)  # sent when the checkpoint's weights are published
        else:
            src._ready.append((req, result))
    stats = state["stats"]
    src.staleness_counts.update({int(k): v for k, v in stats["staleness"].items()})
    src.last_token_staleness_counts.update({int(k): v for k, v in stats["last_token"].items()})
    src.stale_dropped += int(stats["dropped"])
    return True


__all__ = ["Snapshot", "materialize", "restore", "snapshot"]
