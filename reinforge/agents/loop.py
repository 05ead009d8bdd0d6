"""The multi-turn agent loop: an experience source beside ``Generator.generate`` that returns the
same ``RolloutBatch``, its rows being whole trajectories (docs/agents.md).

Decoding runs over one KV cache for the whole batch (a chunk of ``rollout.generation_batch_size``
rows; preallocated for a turn, doubling when observations outgrow it: ``rollout/kv_cache.py``),
extended turn by turn instead of re-prefilling the conversation:

- each distinct prompt is prefilled once; its cache rows are repeated for its samples;
- every forward feeds each row what it has to feed: the token it just sampled, or a whole
  observation (tool output, the environment's reply, the next turn's opening). Rows feeding fewer
  tokens than the widest are left-padded within the step with masked slots, so each row's last
  real token sits at the step's last position and one logit row per row is computed. Masked slots
  stay in the cache as holes the attention mask hides;
- when a row ends a turn, its environment step is submitted to a thread pool and the row waits
  (its cache slot receives masked holes) while the other rows keep decoding. A forward costs rows
  x width, so observations are fed together: once the rows with an observation ready are at least
  as many as the rows decoding (or no row is decoding). Feeding each as it arrived padded every
  decoding row to the observation's width and made extension slower than re-prefilling
  (docs/benchmarks.md). The steps of a batch's trajectories run concurrently (with
  ``env.workers`` in worker processes, env_workers.py, on which these threads wait);
- finished rows leave the cache once they are an eighth of it, and once holes are half the cache
  each row's real slots are gathered together (no forward pass: cached keys carry their rotary
  positions).

Sampling is the HF generator's (temperature and top-p, inverse-CDF draw, the log-prob recorded
under the sampling distribution), with one random stream per trajectory seeded from torch's global
generator: which rows share a forward depends on when tools return, and this keeps each
trajectory's draws independent of that. The cache's holes depend on it too, which changes float
rounding in attention; ``overlap_tools=False`` waits for a step's tool calls before the next
forward, making a run bit-for-bit reproducible (resume equals the uninterrupted run).

``kv_reuse=False`` is the baseline the benchmark compares against: the conversation so far is
re-prefilled for every new turn (all waiting rows together, once no row is decoding).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch

from reinforge.agents.env import as_step_result
# The trajectory record and its tensors live in episode.py; imported from here by older code.
from reinforge.agents.episode import Episode, TurnRecord, pad_trajectories  # noqa: F401
from reinforge.agents.render import ChatRenderer
from reinforge.agents.tools import parse_tool_calls
from reinforge.batch import RolloutBatch, Segment
from reinforge.models import autocast, cache_kwargs, model_device
from reinforge.rollout.attention import decode_attention
from reinforge.rollout.base import SamplingParams
from reinforge.rollout.hf import left_pad, sampling_logprobs
from reinforge.rollout.kv_cache import PreallocatedCache, PreallocatedLayer


@dataclass
class AgentBudgets:
    """max_turns: model turns per trajectory; max_tokens_per_turn: tokens one turn may sample;
    max_tokens: all tokens after the prompt (the model's and the observations')."""

    max_turns: int = 4
    max_tokens_per_turn: int = 64
    max_tokens: int = 512


# Row states of the decode loop.
_SAMPLE, _FEED, _WAIT, _PREFILL, _DONE = range(5)


class _Row:
    def __init__(self, env, episode: Episode, seed: int):
        self.env = env
        self.ep = episode
        self.rng = torch.Generator(device="cpu").manual_seed(seed)
        self.state = _SAMPLE
        self.feed: list[int] = []
        self.turn_start = 0
        self.future: Future | None = None

    @property
    def turn_len(self) -> int:
        return len(self.ep.token_ids) - self.turn_start


class WrappedGenerator:
    """A generator for the trainer that samples from examples through a wrapped ``HFGenerator``
    (``base``): the Generator protocol (``pad_id``, ``needs_sync``, ``version``, ``eos_ids``,
    ``sync_weights``) is the base's; ``pop_recorded`` hands out what ``generate_examples(...,
    record=True)`` kept in ``recorded``; ``_batch`` turns Episodes into the trainer's batch."""

    base: Any
    tokenizer: Any
    recorded: list

    @property
    def pad_id(self) -> int:
        return self.base.pad_id

    @property
    def needs_sync(self) -> bool:
        return self.base.needs_sync

    @property
    def version(self) -> int:
        return self.base.version

    @property
    def eos_ids(self):
        return self.base.eos_ids

    def sync_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self.base.sync_weights(state_dict, version)

    def generate(self, prompts, params):  # pragma: no cover - a guard
        raise TypeError(f"{type(self).__name__} samples from examples (the environment renders the prompt): "
                        "call generate_examples(examples, params)")

    def pop_recorded(self) -> list:
        """What was recorded since the last call (``generate_examples(record=True)``)."""
        out, self.recorded = self.recorded, []
        return out

    def _batch(self, episodes: list, group_index: torch.Tensor) -> RolloutBatch:
        """The trainer's RolloutBatch of whole trajectories (Episodes): tensors from
        ``pad_trajectories``, one segment per assistant turn and per observation."""
        n = len(episodes)
        tensors = pad_trajectories(episodes, self.pad_id)
        segments = []
        for e in episodes:
            segs = []
            for t in e.turns:
                segs.append(Segment("assistant", t.start, t.end, t.text))
                if t.obs_end > t.obs_start:
                    role = t.observations[0].get("role", "environment") if t.observations else "environment"
                    segs.append(Segment(role, t.obs_start, t.obs_end,
                                        self.tokenizer.decode(e.token_ids[t.obs_start:t.obs_end])))
            segments.append(segs)
        texts = self.tokenizer.batch_decode([e.token_ids for e in episodes], skip_special_tokens=True)
        return RolloutBatch(
            **tensors, truncated=torch.tensor([e.truncated for e in episodes]),
            group_index=group_index, texts=texts,
            versions=torch.full((n,), self.version, dtype=torch.long), segments=segments,
        )


class AgentGenerator(WrappedGenerator):
    """Multi-turn rollouts from an ``HFGenerator`` and an environment factory; a ``Generator``
    for the trainer (``pad_id``, ``needs_sync``, ``version``, ``sync_weights``, ``close`` are the
    wrapped generator's) whose samples come from examples (``generate_examples``) rather than
    token prompts.

    make_env:       a no-argument function making a fresh environment (one per trajectory), or an
                    ``EnvWorkerPool`` (env_workers.py: the environments live in worker processes).
    budgets:        AgentBudgets (an env's own ``max_turns`` also applies; the smaller wins).
    tool_workers:   threads running environment steps (tool calls) concurrently.
    overlap_tools:  keep decoding other rows while a row's tools run (see the module docstring).
    kv_reuse:       extend the KV cache per turn (False: re-prefill every turn, the baseline).
    """

    def __init__(self, base, make_env: Callable[[], Any], budgets: AgentBudgets, *, tool_format: str = "auto",
                 tool_workers: int = 8, overlap_tools: bool = True, kv_reuse: bool = True):
        if not hasattr(base, "engine"):
            raise ValueError("multi-turn agents decode with the HF backend (rollout.backend=hf)")
        self.base = base
        self.tokenizer = base.tokenizer
        self.make_env = make_env
        self.budgets = budgets
        self.renderer = ChatRenderer(self.tokenizer, tool_format)
        self.overlap_tools = overlap_tools
        self.kv_reuse = kv_reuse
        self.compact_slack = 32  # holes tolerated beyond half the cache before compacting
        self.pool = ThreadPoolExecutor(max_workers=max(1, tool_workers), thread_name_prefix="reinforge-env")
        self.recorded: list[Episode] = []
        self.compactions = 0  # times the cache's holes were squeezed out (see _decode)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        if getattr(self.make_env, "concurrent", False):  # an EnvWorkerPool: its worker processes
            self.make_env.close()
        self.base.close()

    # -- rollouts -------------------------------------------------------------------------------
    @torch.no_grad()
    def generate_examples(self, examples: Sequence, params: SamplingParams, *, record: bool = False) -> RolloutBatch:
        """``params.num_samples`` trajectories per example (rows of one example contiguous), as a
        RolloutBatch whose ``episodes`` attribute holds each row's Episode."""
        g = params.num_samples
        seeds = torch.randint(0, 2**62, (len(examples) * g,)).tolist()
        rows: list[_Row] = []
        flat = [e for e in examples for _ in range(g)]
        if getattr(self.make_env, "concurrent", False):  # in worker processes (env_workers.py): opened concurrently
            each, envs = self.pool.map, [self.make_env() for _ in flat]
            opened = zip(envs, self.pool.map(lambda env, e: [dict(m) for m in env.reset(e)], envs, flat))
        else:  # in this process, each made and reset in order
            each, opened = map, map(self._open, flat)
        for e, (env, messages) in zip(flat, opened):
            tools = list(getattr(env, "tools", None) or [])
            shown, template_tools = self.renderer.prompt_messages(messages, tools)
            prompt = self.renderer.prompt_ids(messages, tools)
            ep = Episode(example_id=e.id, messages=[dict(m) for m in shown], prompt_ids=prompt,
                         tools=list(template_tools or []))
            rows.append(_Row(env, ep, seeds[len(rows)]))
            if getattr(env, "failed", None):  # its worker could not open it: the episode ends with nothing sampled
                ep.env_error, ep.truncated, ep.truncation, rows[-1].state = env.failed, True, "env_error", _DONE
        per_chunk = max(1, self.base.batch_size // g) * g
        for i in range(0, len(rows), per_chunk):
            self._run(rows[i : i + per_chunk], params)
        # An environment may hold a resource (a server session, a process): freed now.
        list(each(lambda r: getattr(r.env, "close", lambda: None)(), rows))
        episodes = [r.ep for r in rows]
        if record:
            self.recorded.extend(episodes)
        batch = self._batch(episodes, torch.arange(len(examples)).repeat_interleave(g))
        batch.episodes = episodes
        return batch

    def _open(self, example) -> tuple[Any, list[dict]]:
        env = self.make_env()
        return env, [dict(m) for m in env.reset(example)]

    def _max_turns(self, row: _Row) -> int:
        own = getattr(row.env, "max_turns", None)
        return min(self.budgets.max_turns, own) if own else self.budgets.max_turns

    # -- the decode loop ------------------------------------------------------------------------
    def _run(self, rows: list[_Row], params: SamplingParams) -> None:
        model = self.base.engine
        was_training = model.training
        model.eval()
        try:
            with decode_attention(model):
                self._decode(model, rows, params, autocast(model_device(model), self.base.autocast_dtype))
        finally:
            model.train(was_training)

    def _prefill(self, model, rows: list[_Row], ctx):
        """A fresh cache for ``rows`` (each distinct sequence prefilled once): (cache, logits of
        each row's next token, attention mask, next positions)."""
        device = model_device(model)
        seqs = [r.ep.prompt_ids + r.ep.token_ids for r in rows]
        distinct: dict[tuple, int] = {}
        which = [distinct.setdefault(tuple(s), len(distinct)) for s in seqs]
        uniq = [list(s) for s in distinct]
        ids, mask = left_pad(uniq, self.pad_id)
        ids, mask = ids.to(device), mask.to(device)
        # Sized for a turn's tokens; observations and holes past that double it (amortised).
        cache = PreallocatedCache(model.config, ids.shape[1] + self.budgets.max_tokens_per_turn + 1)
        with ctx:
            logits = model(input_ids=ids, attention_mask=mask.long(),
                           position_ids=(mask.long().cumsum(dim=1) - 1).clamp(min=0),
                           logits_to_keep=1, **cache_kwargs(model, cache)).logits[:, -1]
        if which != list(range(len(uniq))):
            sel = torch.tensor(which, device=device)
            cache.batch_select_indices(sel)
            logits, mask = logits[sel], mask[sel]
        attn = mask.long()
        return cache, logits, attn, attn.sum(dim=1)

    def _decode(self, model, rows: list[_Row], params: SamplingParams, ctx) -> None:
        device = model_device(model)
        eos_ids = self.base.eos_ids
        b = self.budgets
        cache, logits, attn, pos = self._prefill(model, rows, ctx)
        slots = list(range(len(rows)))  # cache row -> index into rows
        while True:
            # 1. Rows with fresh logits draw their next token.
            sampling = [k for k, r in enumerate(slots) if rows[r].state == _SAMPLE]
            if sampling:
                lp = sampling_logprobs(logits[sampling], params)
                if params.greedy:
                    picks = lp.argmax(dim=-1)
                else:
                    u = torch.tensor([float(torch.rand((), generator=rows[slots[k]].rng, dtype=torch.float64))
                                      for k in sampling], dtype=torch.float64, device=lp.device)
                    cdf = lp.exp().cumsum(dim=-1, dtype=torch.float64)
                    picks = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).clamp_(
                        max=lp.shape[-1] - 1).squeeze(1)
                picked_lp = lp.gather(1, picks[:, None]).squeeze(1).float().cpu().tolist()
                for k, tok, tok_lp in zip(sampling, picks.cpu().tolist(), picked_lp):
                    row = rows[slots[k]]
                    ep = row.ep
                    ep.token_ids.append(tok)
                    ep.action_mask.append(True)
                    ep.logprobs.append(tok_lp)
                    if tok in eos_ids:
                        self._end_turn(row, stopped=True)
                    elif row.turn_len >= b.max_tokens_per_turn:
                        self._end_turn(row, stopped=False, why="max_tokens_per_turn")
                    elif len(ep.token_ids) >= b.max_tokens:
                        self._end_turn(row, stopped=False, why="max_tokens")
                    else:
                        row.feed, row.state = [tok], _FEED
            # 2. Environment steps that have finished (waiting when nothing else can run).
            self._collect(rows, [rows[r] for r in slots])
            states = [rows[r].state for r in slots]
            if all(s == _DONE for s in states):
                return
            if not self.kv_reuse and _FEED not in states and _SAMPLE not in states and _WAIT not in states:
                # The baseline: every waiting row's whole conversation prefilled again.
                again = [r for r in slots if rows[r].state == _PREFILL]
                cache, logits, attn, pos = self._prefill(model, [rows[r] for r in again], ctx)
                slots = again
                for r in again:
                    rows[r].state = _SAMPLE
                continue
            feeding = [k for k, r in enumerate(slots) if rows[r].state == _FEED]
            if not feeding:
                continue  # only waiting rows: _collect blocks until one returns
            # 3. Finished rows leave the cache once they are an eighth of it (a selection copies
            # the cache, so it is batched).
            done = [k for k, r in enumerate(slots) if rows[r].state == _DONE]
            if len(done) * 8 >= len(slots):
                keep = [k for k, r in enumerate(slots) if rows[r].state != _DONE]
                sel = torch.tensor(keep, device=device)
                cache.batch_select_indices(sel)
                attn, pos = attn[sel], pos[sel]
                slots = [slots[k] for k in keep]
                feeding = [k for k, r in enumerate(slots) if rows[r].state == _FEED]
            # Holes (slots of rows that waited, or fed fewer tokens than the widest) cost attention
            # in every later step: once they are half the cache, each row's real slots are moved
            # together (a gather of the cached keys and values: no forward pass).
            if attn.shape[1] >= 2 * int(attn.sum(dim=1).max()) + self.compact_slack:
                attn = self._compact(cache, attn)
            # 4. One forward: each feeding row's tokens right-aligned, the rest masked holes. A
            # forward costs rows x width, so an observation fed beside single sampled tokens pads
            # every decoding row to its width: observations wait (one hole per step) until they
            # are at least as many as the decoding rows, then go in together.
            decoding = [k for k in feeding if len(rows[slots[k]].feed) == 1]
            observing = [k for k in feeding if len(rows[slots[k]].feed) > 1]
            if observing and decoding and len(observing) < len(decoding):
                feeding = decoding
            width = max(len(rows[slots[k]].feed) for k in feeding)
            n = len(slots)
            inp = torch.full((n, width), self.pad_id, dtype=torch.long)
            new = torch.zeros((n, width), dtype=torch.long)
            positions = torch.zeros((n, width), dtype=torch.long)
            pos_cpu = pos.cpu()
            for k in feeding:
                f = rows[slots[k]].feed
                inp[k, width - len(f):] = torch.tensor(f, dtype=torch.long)
                new[k, width - len(f):] = 1
                positions[k, width - len(f):] = pos_cpu[k] + torch.arange(len(f))
            attn = torch.cat([attn, new.to(device)], dim=1)
            with ctx:
                logits = model(input_ids=inp.to(device), attention_mask=attn, position_ids=positions.to(device),
                               logits_to_keep=1, **cache_kwargs(model, cache)).logits[:, -1]
            pos = pos + new.sum(dim=1).to(device)
            for k in feeding:
                row = rows[slots[k]]
                row.feed, row.state = [], _SAMPLE

    def _compact(self, cache, attn: torch.Tensor) -> torch.Tensor:
        """Move each row's real cache slots to the right end, in order, dropping the holes; returns
        the new attention mask. Keys are cached after the rotary embedding, so their positions
        travel with them. Caches with sliding-window layers are left alone."""
        from transformers.cache_utils import DynamicCache, DynamicLayer

        if not isinstance(cache, DynamicCache) or any(type(layer) not in (DynamicLayer, PreallocatedLayer)
                                                       for layer in cache.layers):
            return attn
        real = attn.bool()
        width = int(real.sum(dim=1).max())
        order = torch.argsort(real.to(torch.int8), dim=1, stable=True)[:, -width:]  # holes first, then real slots
        for layer in cache.layers:
            index = order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            keys, values = torch.gather(layer.keys, 2, index), torch.gather(layer.values, 2, index)
            if isinstance(layer, PreallocatedLayer):
                layer.overwrite(keys, values)
            else:
                layer.keys, layer.values = keys, values
        self.compactions += 1
        return torch.gather(real, 1, order).long()

    def _end_turn(self, row: _Row, *, stopped: bool, why: str | None = None) -> None:
        ep = row.ep
        turn_ids = ep.token_ids[row.turn_start:]
        text = self.tokenizer.decode(turn_ids, skip_special_tokens=True)
        calls = [{"name": c.name, "arguments": c.arguments, "error": c.error} for c in parse_tool_calls(text)]
        ep.turns.append(TurnRecord(start=row.turn_start, end=len(ep.token_ids), text=text, tool_calls=calls,
                                   obs_start=len(ep.token_ids), obs_end=len(ep.token_ids)))
        ep.messages.append({"role": "assistant", "content": text})
        if not stopped:  # a budget cut the turn: never silently, and the environment is not asked
            ep.truncated, ep.truncation, row.state = True, why, _DONE
            return
        row.future = self.pool.submit(row.env.step, {"role": "assistant", "content": text})
        row.state = _WAIT

    def _collect(self, rows: list[_Row], live: list[_Row]) -> None:
        waiting = [r for r in live if r.state == _WAIT]
        if not waiting:
            return
        busy = any(r.state in (_FEED, _SAMPLE) for r in live)
        if not self.overlap_tools or not self.kv_reuse:
            wait([r.future for r in waiting])
        elif not busy:
            wait([r.future for r in waiting], return_when=FIRST_COMPLETED)
        for row in waiting:  # in row order, so the same results are handled the same way
            if row.future.done():
                self._observe(row)

    def _observe(self, row: _Row) -> None:
        ep, turn = row.ep, row.ep.turns[-1]
        future, row.future = row.future, None
        try:
            result = as_step_result(future.result())
        except Exception as err:  # noqa: BLE001 - a broken environment ends this trajectory, not the run
            ep.env_error = (getattr(err, "reason", None) or f"{type(err).__name__}: {err}")[:500]
            ep.truncated, ep.truncation, row.state = True, "env_error", _DONE
            return
        turn.reward, turn.info = float(result.reward), dict(result.info)
        turn.observations = [dict(m) for m in result.observations]
        if result.info.get("success") is not None:
            ep.success = bool(result.info["success"])
        if result.done:
            ep.done, row.state = True, _DONE
            if result.truncated:  # the environment's own limit: over, but not finished
                ep.truncated, ep.truncation = True, "env"
            return
        if len(ep.turns) >= self._max_turns(row):
            ep.truncated, ep.truncation, row.state = True, "max_turns", _DONE
            return
        stop_text = self.tokenizer.decode(ep.token_ids[-1:]) if ep.token_ids else None
        obs = self.renderer.observation_ids(result.observations, stop_text)
        if not obs:
            raise RuntimeError("the chat template rendered nothing for an observation turn (not even the next "
                               "assistant turn's opening); the model would have nothing to continue from")
        # The observation and at least one token of the next turn must fit.
        if len(ep.token_ids) + len(obs) + 1 > self.budgets.max_tokens:
            ep.truncated, ep.truncation, row.state = True, "max_tokens", _DONE
            return
        turn.obs_start = len(ep.token_ids)
        ep.token_ids.extend(obs)
        ep.action_mask.extend([False] * len(obs))
        ep.logprobs.extend([0.0] * len(obs))
        turn.obs_end = len(ep.token_ids)
        ep.messages.extend(turn.observations)
        row.turn_start = len(ep.token_ids)
        # The turn's stop token was sampled but not yet fed: it goes into the cache with the observation.
        row.feed, row.state = [ep.token_ids[turn.end - 1]] + obs, (_FEED if self.kv_reuse else _PREFILL)
