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

import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import torch

from reinforge.agents.env import as_step_result
# The trajectory record and its tensors live in episode.py; imported from here by older code.
from reinforge.agents.episode import Episode, TurnRecord, WrappedGenerator, pad_trajectories  # noqa: F401
from reinforge.agents.render import ChatRenderer
from reinforge.agents.seats import FROZEN, SeatTable, SeatView, is_match, seat_example
from reinforge.agents.tools import parse_tool_calls
from reinforge.batch import RolloutBatch
from reinforge.models import autocast, cache_kwargs, model_device
from reinforge.rollout.attention import decode_attention
from reinforge.rollout.base import SamplingParams
from reinforge.rollout.hf import left_pad, sampling_logprobs
from reinforge.rollout.kv_cache import PreallocatedCache, PreallocatedLayer, merge_rows


@dataclass
class AgentBudgets:
    """max_turns: model turns per trajectory; max_tokens_per_turn: tokens one turn may sample;
    max_tokens: all tokens after the prompt (the model's and the observations')."""

    max_turns: int = 4
    max_tokens_per_turn: int = 64
    max_tokens: int = 512


# Row states of the decode loop. _JOIN: a seat waiting for its first turn (no prompt yet);
# _JOINING: a prompt ready to be prefilled into its lane's cache.
_SAMPLE, _FEED, _WAIT, _PREFILL, _DONE, _JOIN, _JOINING = range(7)


class _Row:
    def __init__(self, env, episode: Episode, seed: int, lane: int = 0):
        self.env = env
        self.ep = episode
        self.rng = torch.Generator(device="cpu").manual_seed(seed)
        self.state = _JOINING
        self.feed: list[int] = []
        self.turn_start = 0
        self.future: Future | None = None
        self.lane = lane        # which model decodes it: 0 the policy, 1 the frozen opponent
        self.on_turn = False    # its future waits for another seat's move, not for an environment step

    @property
    def turn_len(self) -> int:
        return len(self.ep.token_ids) - self.turn_start


class _Lane:
    """One model's part of the decode loop: its KV cache over its rows (``slots``: cache row ->
    index into the chunk's rows), the last logits, attention mask and next positions."""

    def __init__(self, model, ctx):
        self.model, self.ctx = model, ctx
        self.cache = self.logits = self.attn = self.pos = None
        self.slots: list[int] = []


class AgentGenerator(WrappedGenerator):
    """Multi-turn rollouts from an ``HFGenerator`` and an environment factory; a ``Generator``
    for the trainer (``pad_id``, ``needs_sync``, ``version``, ``sync_weights``, ``close`` are the
    wrapped generator's) whose samples come from examples (``generate_examples``) rather than
    token prompts.

    make_env:       a no-argument function making a fresh environment (one per trajectory), or an
                    ``EnvWorkerPool`` (env_workers.py: the environments live in worker processes).
                    A game of several seats (a match, seats.py) gets a row per seat.
    budgets:        AgentBudgets (an env's own ``max_turns`` also applies; the smaller wins).
    tool_workers:   threads running environment steps (tool calls) concurrently.
    overlap_tools:  keep decoding other rows while a row's tools run (see the module docstring).
    kv_reuse:       extend the KV cache per turn (False: re-prefill every turn, the baseline).
    frozen_model:   the model that decodes a match's "frozen" seats (the starting weights, never
                    updated), in its own lane of the same decode loop.
    """

    def __init__(self, base, make_env: Callable[[], Any], budgets: AgentBudgets, *, tool_format: str = "auto",
                 tool_workers: int = 8, overlap_tools: bool = True, kv_reuse: bool = True, frozen_model=None):
        if not hasattr(base, "engine"):
            raise ValueError("multi-turn agents decode with the HF backend (rollout.backend=hf)")
        self.base = base
        self.tokenizer = base.tokenizer
        self.make_env = make_env
        self.budgets = budgets
        self.renderer = ChatRenderer(self.tokenizer, tool_format)
        self.overlap_tools = overlap_tools
        self.kv_reuse = kv_reuse
        self.frozen_model = frozen_model
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
        RolloutBatch whose ``episodes`` attribute holds each row's Episode and ``group_examples``
        each group's example. In a game of several seats every "policy" seat is a trajectory of
        its own and a group of its own (example i, its t-th policy seat: group i * seats + t), its
        example ``seats.seat_example``; "frozen" seats are decoded but not returned."""
        g = params.num_samples
        seeds = torch.randint(0, 2**62, (len(examples) * g,)).tolist()
        flat = [e for e in examples for _ in range(g)]
        if getattr(self.make_env, "concurrent", False):  # in worker processes (env_workers.py): opened concurrently
            each, envs = self.pool.map, [self.make_env() for _ in flat]
            opened = zip(envs, self.pool.map(lambda env, e: [dict(m) for m in env.reset(e)], envs, flat))
        else:  # in this process, each made and reset in order
            each, opened = map, map(self._open, flat)
        games: list[list[_Row]] = []  # per sample, its rows (one per seat)
        for e, seed, (env, messages) in zip(flat, seeds, opened):
            if isinstance(env, SeatTable):
                games.append([self._seat_row(e, env, k, opening, seed) for k, opening in enumerate(messages)])
                continue
            ep = self._episode(e.id, env, messages)
            games.append([_Row(env, ep, seed)])
            if getattr(env, "failed", None):  # its worker could not open it: the episode ends with nothing sampled
                ep.env_error, ep.truncated, ep.truncation, games[-1][0].state = env.failed, True, "env_error", _DONE
        seats = max((len(rows) for rows in games), default=1)
        per_chunk = max(1, self.base.batch_size // (g * seats)) * g  # games per chunk: a game's seats decode together
        for i in range(0, len(games), per_chunk):
            self._run([r for rows in games[i : i + per_chunk] for r in rows], params)
        # An environment may hold a resource (a server session, a process): freed now.
        list(each(lambda r: getattr(r.env, "close", lambda: None)(), [r for rows in games for r in rows]))
        trained = [[r for r in rows if r.lane == 0] for rows in games]
        per_game = len(trained[0]) if trained else 1
        if any(len(t) != per_game for t in trained):
            raise RuntimeError("the games of one batch have different numbers of policy seats")
        # Rows by group: example i, its t-th policy seat, sample j.
        ordered = [trained[i * g + j][t] for i in range(len(examples)) for t in range(per_game) for j in range(g)]
        episodes = [r.ep for r in ordered]
        if record:
            self.recorded.extend(episodes)
        batch = self._batch(episodes, torch.arange(len(examples) * per_game).repeat_interleave(g))
        batch.episodes = episodes
        matched = bool(games) and isinstance(games[0][0].env, SeatView)
        batch.group_examples = ([seat_example(e, r.env.seat) for e in examples for r in trained[0]] if matched
                                else list(examples))
        return batch

    def _episode(self, example_id: str, env, messages: list[dict]) -> Episode:
        tools = list(getattr(env, "tools", None) or [])
        shown, template_tools = self.renderer.prompt_messages(messages, tools)
        return Episode(example_id=example_id, messages=[dict(m) for m in shown],
                       prompt_ids=self.renderer.prompt_ids(messages, tools), tools=list(template_tools or []))

    def _seat_row(self, example, table: SeatTable, seat: int, opening, seed: int) -> _Row:
        """Seat ``seat``'s row: its prompt now when it moves first, else once its first turn comes."""
        view = SeatView(table, seat)
        lane = 1 if view.role == FROZEN else 0
        if lane and self.frozen_model is None:
            raise ValueError("a frozen seat needs the frozen copy of the model (AgentGenerator(frozen_model=...))")
        # Seats draw from their own streams: seat 0's is the game's seed (a one-seat game's).
        seed = seed if seat == 0 else (seed + seat * 0x9E3779B97F4A7C15) % 2**62
        if isinstance(opening, Future):  # its first turn comes after another seat's move
            ep = Episode(example_id=f"{example.id}/seat{seat}", messages=[], prompt_ids=[], seat=seat)
            row = _Row(view, ep, seed, lane)
            row.future, row.state, row.on_turn = opening, _JOIN, True
            return row
        ep = self._episode(f"{example.id}/seat{seat}", view, opening)
        ep.seat = seat
        return _Row(view, ep, seed, lane)

    def _open(self, example) -> tuple[Any, list]:
        env = self.make_env()
        if is_match(env):  # a game of several seats: one table, an opening (or a Future of one) per seat
            table = SeatTable(env)
            return table, table.reset(example)
        return env, [dict(m) for m in env.reset(example)]

    def _max_turns(self, row: _Row) -> int:
        own = getattr(row.env, "max_turns", None)
        return min(self.budgets.max_turns, own) if own else self.budgets.max_turns

    # -- the decode loop ------------------------------------------------------------------------
    def _run(self, rows: list[_Row], params: SamplingParams) -> None:
        model = self.base.engine
        models = [model] + ([self.frozen_model] if any(r.lane == 1 for r in rows) else [])
        was_training = model.training
        model.eval()
        try:
            with contextlib.ExitStack() as stack:
                for m in models:
                    stack.enter_context(decode_attention(m))
                lanes = [_Lane(m, autocast(model_device(m), self.base.autocast_dtype)) for m in models]
                self._decode(lanes, rows, params)
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

    def _join(self, lane: _Lane, rows: list[_Row], joining: list[int]) -> None:
        """Rows with a new prompt enter ``lane``: prefilled, then merged into its running cache (a
        fresh cache when no row of it is still going)."""
        cache, logits, attn, pos = self._prefill(lane.model, [rows[r] for r in joining], lane.ctx)
        if lane.cache is None or all(rows[r].state == _DONE for r in lane.slots):
            lane.cache, lane.logits, lane.attn, lane.pos, lane.slots = cache, logits, attn, pos, list(joining)
        else:
            lane.attn = merge_rows(lane.cache, lane.attn, cache, attn)
            lane.logits, lane.pos = torch.cat([lane.logits, logits]), torch.cat([lane.pos, pos])
            lane.slots = lane.slots + list(joining)
        for r in joining:
            rows[r].state = _SAMPLE

    def _decode(self, lanes: list[_Lane], rows: list[_Row], params: SamplingParams) -> None:
        while True:
            for lane in lanes:  # 1. Rows with fresh logits draw their next token.
                self._sample(lane, rows, params)
            # 2. Environment steps (and other seats' moves) that have finished (waiting when nothing else can run).
            self._collect(rows)
            if all(r.state == _DONE for r in rows):
                return
            for i, lane in enumerate(lanes):
                mine = [r for r, row in enumerate(rows) if row.lane == i]
                joining = [r for r in mine if rows[r].state in (_JOINING, _PREFILL)]
                if not self.kv_reuse:
                    # The baseline: every waiting row's whole conversation prefilled again, once no
                    # row of the lane is decoding or stepping (another seat's move is not waited for).
                    if joining and not any(rows[r].state in (_FEED, _SAMPLE) or (rows[r].state == _WAIT and not
                                                                                 rows[r].on_turn) for r in mine):
                        lane.cache = None
                        self._join(lane, rows, joining)
                        continue
                elif joining:  # their logits are sampled first: this lane's forward waits a round
                    self._join(lane, rows, joining)
                    continue
                self._forward(lane, rows)

    def _sample(self, lane: _Lane, rows: list[_Row], params: SamplingParams) -> None:
        eos_ids = self.base.eos_ids
        b = self.budgets
        slots = lane.slots
        sampling = [k for k, r in enumerate(slots) if rows[r].state == _SAMPLE]
        if not sampling:
            return
        lp = sampling_logprobs(lane.logits[sampling], params)
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

    def _forward(self, lane: _Lane, rows: list[_Row]) -> None:
        device = model_device(lane.model)
        slots = lane.slots
        feeding = [k for k, r in enumerate(slots) if rows[r].state == _FEED]
        if not feeding:
            return  # only waiting rows: _collect blocks until one returns
        # 3. Finished rows leave the cache once they are an eighth of it (a selection copies
        # the cache, so it is batched).
        done = [k for k, r in enumerate(slots) if rows[r].state == _DONE]
        if len(done) * 8 >= len(slots):
            keep = [k for k, r in enumerate(slots) if rows[r].state != _DONE]
            sel = torch.tensor(keep, device=device)
            lane.cache.batch_select_indices(sel)
            lane.attn, lane.pos = lane.attn[sel], lane.pos[sel]
            slots = lane.slots = [slots[k] for k in keep]
            feeding = [k for k, r in enumerate(slots) if rows[r].state == _FEED]
        # Holes (slots of rows that waited, or fed fewer tokens than the widest) cost attention
        # in every later step: once they are half the cache, each row's real slots are moved
        # together (a gather of the cached keys and values: no forward pass).
        if lane.attn.shape[1] >= 2 * int(lane.attn.sum(dim=1).max()) + self.compact_slack:
            lane.attn = self._compact(lane.cache, lane.attn)
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
        pos_cpu = lane.pos.cpu()
        for k in feeding:
            f = rows[slots[k]].feed
            inp[k, width - len(f):] = torch.tensor(f, dtype=torch.long)
            new[k, width - len(f):] = 1
            positions[k, width - len(f):] = pos_cpu[k] + torch.arange(len(f))
        lane.attn = torch.cat([lane.attn, new.to(device)], dim=1)
        with lane.ctx:
            lane.logits = lane.model(input_ids=inp.to(device), attention_mask=lane.attn,
                                     position_ids=positions.to(device), logits_to_keep=1,
                                     **cache_kwargs(lane.model, lane.cache)).logits[:, -1]
        lane.pos = lane.pos + new.sum(dim=1).to(device)
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

    def _stop(self, row: _Row, truncation: str) -> None:
        """The row ends before its episode did; a seat of a game abandons it (the others end too)."""
        row.ep.truncated, row.ep.truncation, row.state = True, truncation, _DONE
        if isinstance(row.env, SeatView):
            row.env.abandon(truncation)

    def _end_turn(self, row: _Row, *, stopped: bool, why: str | None = None) -> None:
        ep = row.ep
        turn_ids = ep.token_ids[row.turn_start:]
        text = self.tokenizer.decode(turn_ids, skip_special_tokens=True)
        calls = [{"name": c.name, "arguments": c.arguments, "error": c.error} for c in parse_tool_calls(text)]
        ep.turns.append(TurnRecord(start=row.turn_start, end=len(ep.token_ids), text=text, tool_calls=calls,
                                   obs_start=len(ep.token_ids), obs_end=len(ep.token_ids)))
        ep.messages.append({"role": "assistant", "content": text})
        if not stopped:  # a budget cut the turn: never silently, and the environment is not asked
            self._stop(row, why)
            return
        row.future = self.pool.submit(row.env.step, {"role": "assistant", "content": text})
        row.state = _WAIT

    def _collect(self, rows: list[_Row]) -> None:
        waiting = [r for r in rows if r.state in (_WAIT, _JOIN)]
        if not waiting:
            return
        busy = any(r.state in (_FEED, _SAMPLE, _JOINING, _PREFILL) for r in rows)
        stepping = [r.future for r in waiting if not r.on_turn]  # another seat's move is never waited for here
        if (not self.overlap_tools or not self.kv_reuse) and stepping:
            wait(stepping)
        elif not busy:
            wait([r.future for r in waiting], return_when=FIRST_COMPLETED)
        for row in waiting:  # in row order, so the same results are handled the same way
            if row.future.done():
                self._opened(row) if row.state == _JOIN else self._observe(row)

    def _opened(self, row: _Row) -> None:
        """A seat's first turn came (or the game ended before it): its prompt, rendered now."""
        ep, future = row.ep, row.future
        row.future, row.on_turn = None, False
        try:
            messages, final = future.result()
        except Exception as err:  # noqa: BLE001 - the game failed on another seat's move
            messages, final = [{"role": "user", "content": ep.example_id}], None
            ep.env_error, ep.truncated, ep.truncation, row.state = str(err)[:500], True, "env_error", _DONE
        opened = self._episode(ep.example_id, row.env, messages)
        ep.messages, ep.prompt_ids, ep.tools = opened.messages, opened.prompt_ids, opened.tools
        if row.state == _DONE:
            return
        row.state = _JOINING
        if final is not None:  # over before this seat moved: no turn to train, the game's result on an empty one
            ep.turns.append(TurnRecord(start=0, end=0, text="", reward=float(final.reward), info=dict(final.info)))
            ep.success = final.info.get("success")
            ep.done, row.state = True, _DONE
            if final.truncated:
                ep.truncated, ep.truncation = True, "env"

    def _observe(self, row: _Row) -> None:
        ep, turn = row.ep, row.ep.turns[-1]
        future, row.future = row.future, None
        try:
            value = future.result()
            while isinstance(value, Future):  # a seat's move was played: what it sees when the turn is back
                if not value.done():
                    row.future, row.on_turn = value, True
                    return
                value = value.result()
            row.on_turn = False
            result = as_step_result(value)
        except Exception as err:  # noqa: BLE001 - a broken environment ends this trajectory, not the run
            ep.env_error = (getattr(err, "reason", None) or f"{type(err).__name__}: {err}")[:500]
            self._stop(row, "env_error")
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
            self._stop(row, "max_turns")
            return
        stop_text = self.tokenizer.decode(ep.token_ids[-1:]) if ep.token_ids else None
        obs = self.renderer.observation_ids(result.observations, stop_text)
        if not obs:
            raise RuntimeError("the chat template rendered nothing for an observation turn (not even the next "
                               "assistant turn's opening); the model would have nothing to continue from")
        # The observation and at least one token of the next turn must fit.
        if len(ep.token_ids) + len(obs) + 1 > self.budgets.max_tokens:
            self._stop(row, "max_tokens")
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
