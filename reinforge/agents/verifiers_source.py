"""Train on a ``verifiers`` environment (PyPI ``verifiers==0.4.0``, the ``verifiers.v1`` API),
token-in/token-out (docs/agents.md).

    env: {name: verifiers, options: {taskset: my_taskset}}     # a module exporting a vf.Taskset
    task: {source: env}

The pieces:

- ``VerifiersTask``: the taskset's tasks as reinforge ``Example`` s (the verifiers ``Task`` rides
  in ``metadata["verifiers_task"]``), split into train and held-out by ``task.seed``;
- ``VerifiersGenerator``: the trainer's agent generator. It serves the policy on the loopback
  interface (``CompletionServer``) and runs ``num_samples`` verifiers episodes per example against
  it with verifiers' training client (``TrainClientConfig``): verifiers renders the prompt with the
  model's chat template (the ``renderers`` package), calls ``/inference/v1/generate`` with token
  ids, and records the ids and log-probs that come back in each trace's message graph. Each
  trainable ``Trace.branches[i]`` becomes one row: the prompt is the tokens before the first
  sampled token, the action mask verifiers' ``sampled_mask``, the sampler log-probs the recorded
  ones; every sampled span is checked against what the server actually sampled (same context,
  same ids, same log-probs) before it is trained on. Later turns extend the earlier ids (the
  renderer's bridge); where it cannot, verifiers re-renders and the trace forks into branches, each
  a row trained only on what was sampled in its own context. Untrainable traces (a simulated
  user's) are context only;
- ``VerifiersReward``: the trace's reward (``trace.reward``: the taskset's ``@vf.reward`` s,
  weighted) as the row's scalar reward.

Episodes run with the subprocess runtime and, by default, the in-process chat harness
(``reinforge.agents.verifiers_harness``): verifiers' bundled harnesses and its default sandbox
runtime need ``uv``, PyPI or Prime's service at run time.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import os
import shutil
import sys
import tempfile
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from reinforge.agents.loop import Episode, TurnRecord, WrappedGenerator
from reinforge.batch import RolloutBatch
from reinforge.agents.scoring import WrappedReward
from reinforge.rewards.compose import RewardOutcome, Scores
from reinforge.tasks.base import Example, Task, TaskError

INSTALL_HINT = 'pip install "reinforge[verifiers]"'
OPTIONS = ("taskset", "taskset_options", "harness", "harness_options", "env_id", "env_options", "renderer",
           "max_concurrent", "strict", "batching")


def require_verifiers():
    """``verifiers.v1``, or an ImportError naming the extra to install."""
    try:
        import verifiers.v1 as vf
    except ImportError as err:
        raise ImportError(f"env.name=verifiers needs the verifiers package (0.4): {INSTALL_HINT} "
                          f"({type(err).__name__}: {err})") from err
    # verifiers resolves a harness or taskset id by importing a top-level module of that name:
    # make the in-process harness and the bundled taskset importable under their ids.
    from reinforge.agents import verifiers_harness, vf_reinforge_task

    sys.modules.setdefault(verifiers_harness.HARNESS_ID, verifiers_harness)
    sys.modules.setdefault(vf_reinforge_task.TASKSET_ID, vf_reinforge_task)
    return vf


def _options(options: dict[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"env.options for verifiers: unknown option(s) {unknown}; accepted: {', '.join(OPTIONS)}")
    if not options.get("taskset"):
        raise ValueError("env.options.taskset: name the verifiers taskset (a module exporting its Taskset "
                         "subclass in __all__, as verifiers loads it)")
    return options


def env_config(options: dict[str, Any], *, max_turns: int | None = None) -> dict[str, Any]:
    """verifiers' env config (the ``[env]`` block of its CLI) for these ``env.options``: the
    taskset, the verifiers ``Env`` (``env_id``; default: the taskset's own, else the single-agent
    env), and for every agent role of that env the subprocess runtime and the harness (the
    in-process chat loop unless ``harness`` names another) unless ``env_options`` sets them.
    ``max_turns`` caps the trained roles' model turns."""
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.utils.loaders import env_config_type

    from reinforge.agents.verifiers_harness import HARNESS_ID

    opts = _options(options)
    out: dict[str, Any] = {"taskset": {"id": opts["taskset"], **dict(opts.get("taskset_options") or {})}}
    if opts.get("env_id"):
        out["id"] = opts["env_id"]
    extra = dict(opts.get("env_options") or {})
    cls = env_config_type(opts["taskset"], opts.get("env_id") or "")
    harness = {"id": opts.get("harness") or HARNESS_ID, **dict(opts.get("harness_options") or {})}
    for role, info in cls.model_fields.items():
        if not isinstance(info.default, AgentConfig):
            continue
        given = dict(extra.pop(role, None) or {})
        agent: dict[str, Any] = {"harness": harness, "runtime": {"type": "subprocess"}}  # default: Prime's sandbox
        if max_turns is not None and info.default.max_turns is None:
            agent["max_turns"] = max_turns
        out[role] = {**agent, **given}
    return {**out, **extra}


# -- the examples ------------------------------------------------------------------------------


class VerifiersTask(Task):
    """A verifiers taskset's tasks as examples: ``eval_size`` held out (after a shuffle by
    ``seed``), up to ``train_size`` of the rest for training. An example's messages are the task's
    system prompt and prompt; its answer is the task data's ``answer`` when it has one, else None
    (either way the taskset's rewards score the trace)."""

    name = "verifiers"

    def __init__(self, options: dict[str, Any], *, train_size: int | None = None, eval_size: int = 0, seed: int = 0):
        vf = require_verifiers()
        cfg = vf.resolve_env_config(env_config(options))
        from verifiers.v1.utils.loaders import load_taskset

        taskset = load_taskset(cfg.taskset)
        self.taskset_id = cfg.taskset.id
        if not taskset.bounded:
            if train_size is None:
                raise TaskError(f"verifiers taskset {self.taskset_id!r} is infinite: set task.train_size")
            taskset = taskset.take(train_size + eval_size)
        tasks = list(taskset)
        if not tasks:
            raise TaskError(f"verifiers taskset {self.taskset_id!r} has no tasks")
        order = list(range(len(tasks)))
        random.Random(seed).shuffle(order)
        held = sorted(order[:eval_size])
        rest = sorted(order[eval_size:])[: train_size if train_size is not None else None]
        self._eval = [self._example(tasks[i], "eval") for i in held]
        self._train = [self._example(tasks[i], "train") for i in rest]
        if not self._train:
            raise TaskError(f"verifiers taskset {self.taskset_id!r}: no training tasks left after holding out "
                            f"{eval_size}")

    def _example(self, task, split: str) -> Example:
        data = task.data
        messages = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
        if isinstance(data.prompt, str):
            messages.append({"role": "user", "content": data.prompt})
        else:
            messages.extend(m.model_dump(mode="json", exclude_none=True) for m in data.prompt or [])
        # A taskset whose task data carries an answer (reinforge_task does) lets the guardrails
        # score constant answers and the answer prior; the reward is still the trace's.
        answer = getattr(data, "answer", None)
        return Example(id=f"{self.taskset_id}/{split}/{data.idx}", messages=messages,
                       answer=None if answer is None else str(answer),
                       metadata={"verifiers_task": task, "verifiers_task_key": task.key})

    def train_examples(self) -> Sequence[Example]:
        return self._train

    def eval_examples(self) -> Sequence[Example]:
        return self._eval

    def score(self, answer: str, example: Example) -> float:
        """0: a verifiers task is scored from its trace (``VerifiersReward``), not from an answer."""
        return 0.0


def verifiers_task(cfg) -> VerifiersTask:
    """``task.source: env`` with ``env.name: verifiers``."""
    t = cfg.task
    return VerifiersTask(dict(cfg.env.options), train_size=t.train_size, eval_size=t.eval_size, seed=t.seed)


# -- the rollouts ------------------------------------------------------------------------------


@dataclass
class VerifiersEpisode(Episode):
    """One trainable branch of a verifiers trace, as the agent loop's Episode (so the trajectory
    files and agent metrics are the same), plus the trace's reward and identity."""

    reward: float = 0.0
    rewards: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    trace_id: str = ""
    branch: int = 0
    stop_condition: str | None = None
    agent: str = "agent"

    def to_record(self, tokenizer=None) -> dict[str, Any]:
        out = super().to_record(tokenizer)
        out.update(reward=self.reward, rewards=self.rewards, trace_id=self.trace_id, branch=self.branch,
                   agent=self.agent, stop_condition=self.stop_condition)
        return out


class BranchMismatch(RuntimeError):
    """A branch's tokens are not what the server sampled (in the context it sampled them in)."""


def sampled_spans(token_ids: list[int], mask: list[bool], logprobs: list[float], generations) -> list[tuple[int, int]]:
    """Match every sampled token of a branch to the server's generations: each span must be one
    generation's sampled ids, with its log-probs, preceded by exactly the ids it was prompted
    with. Returns the spans [start, end) in the branch; raises BranchMismatch otherwise."""
    by_prompt: dict[tuple[int, ...], list] = {}
    for g in generations:
        by_prompt.setdefault(tuple(g.prompt_ids), []).append(g)
    spans, p, n = [], 0, len(token_ids)
    while p < n:
        if not mask[p]:
            p += 1
            continue
        match = None
        for g in by_prompt.get(tuple(token_ids[:p]), []):
            k = len(g.token_ids)
            if k and token_ids[p : p + k] == g.token_ids and all(mask[p : p + k]):
                match = g
                break
        if match is None:
            raise BranchMismatch(f"sampled tokens at {p} of a branch are not a continuation the server sampled "
                                 "from that exact context (re-rendered or re-tokenized history?)")
        k = len(match.token_ids)
        if not all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(logprobs[p : p + k], match.logprobs)):
            raise BranchMismatch(f"the log-probs recorded for the tokens at {p} differ from the server's")
        spans.append((p, p + k))
        p += k
    return spans


def _forget_renderers(model_dir: str) -> None:
    """verifiers keeps its renderers (a tokenizer each) in a process-wide pool keyed by the model
    folder; drop this run's, whose folder is gone, so a sweep of runs in one process does not
    accumulate them."""
    try:
        from verifiers.v1.clients.train import ElasticRendererPool

        for key in [k for k in ElasticRendererPool._renderers if k and k[0] == model_dir]:
            ElasticRendererPool._renderers.pop(key, None)
    except (ImportError, AttributeError):  # pragma: no cover - another verifiers layout
        pass


def _truncation(trace) -> str | None:
    """Why verifiers cut a trace, in the agent loop's budget names where one matches (a reply
    that ran out of tokens is ``max_tokens_per_turn``)."""
    if not trace.is_truncated:
        return None
    if trace.stop_condition in ("max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens",
                                "compaction_failed"):
        return trace.stop_condition
    return "max_tokens_per_turn"


class VerifiersGenerator(WrappedGenerator):
    """The trainer's generator for a verifiers environment (the ``AgentGenerator`` interface:
    ``generate_examples``, ``pop_recorded``, and the wrapped HF generator's ``pad_id``,
    ``needs_sync``, ``version``, ``sync_weights``, ``close``).

    options:        ``env.options``: taskset (and taskset_options), harness (and harness_options),
                    env_id (a verifiers Env, e.g. "user-sim") and env_options (its config keys,
                    per role too), renderer (renderers' RendererConfig, e.g. {name: default,
                    tool_parser: qwen3}; None: resolved from the tokenizer folder, which outside
                    renderers' model map is DefaultRenderer), max_concurrent (episodes in flight,
                    default 1 so the server
                    sees requests in a reproducible order), strict (raise on a branch that does
                    not match the server's samples, default True; False drops the branch),
                    batching (default True: the endpoint's continuous-batching engine, which decodes
                    the episodes' concurrent requests together and reuses a conversation's KV cache
                    across its turns; False: one request at a time, each prefilled in full).
    model_dir:      a folder the renderer loads the tokenizer and chat template from (None: the
                    generator's own tokenizer, saved to a temporary folder, so verifiers renders
                    with exactly the tokenizer the trainer uses).
    max_tokens:     tokens the model may sample per model call.
    max_turns:      verifiers' per-run turn limit (None: none).
    """

    def __init__(self, base, options: dict[str, Any], *, max_tokens: int, model_dir: str | None = None,
                 max_turns: int | None = None):
        from reinforge.agents.server import CompletionServer

        vf = require_verifiers()
        self.vf = vf
        # verifiers logs two INFO lines per rollout and aiohttp one per request: thousands a step.
        # The trajectories are in the run directory; keep warnings.
        for name in ("verifiers", "aiohttp.access"):
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)
        self.base = base
        self.tokenizer = base.tokenizer
        opts = _options(dict(options))
        self.max_concurrent = int(opts.get("max_concurrent") or 1)
        self.strict = bool(opts.get("strict", True))
        batching = opts.get("batching", True)
        if not isinstance(batching, bool):
            raise ValueError(f"env.options.batching must be true or false, got {batching!r}")
        self.renderer = opts.get("renderer")  # renderers' RendererConfig (None: chosen from the tokenizer)
        self.env = vf.load_environment(vf.resolve_env_config(env_config(opts, max_turns=max_turns)))
        self.recorded: list[VerifiersEpisode] = []
        self.dropped_branches = 0
        self.server = self._tmp = self._loop = self._serving = self._key_var = None
        self._closed = False
        try:
            if model_dir is None:
                self._tmp = tempfile.mkdtemp(prefix="reinforge-vf-tokenizer-")
                self.tokenizer.save_pretrained(self._tmp)
                model_dir = self._tmp
            self.model_dir = str(model_dir)
            # Room for every episode in flight (a few agents each) under the server's connection cap.
            self.server = CompletionServer(base, max_tokens=max_tokens, batching=batching,
                                           max_connections=max(64, 8 * self.max_concurrent)).start()
            # verifiers' training client: it renders with the tokenizer in model_dir and calls the
            # server's /inference/v1/generate (built here so a bad renderer option fails at once).
            # It reads its key from the environment variable it is told; verifiers' subprocess
            # runtime keeps every *API_KEY* variable out of the programs it starts.
            self._key_var = f"REINFORGE_VERIFIERS_API_KEY_{uuid.uuid4().hex[:12]}"
            os.environ[self._key_var] = self.server.api_key
            self._client = vf.TrainClientConfig(base_url=self.server.url, api_key_var=self._key_var,
                                                renderer_model_name=self.model_dir, renderer=self.renderer)
            # verifiers is asyncio: one loop on a thread for the whole run, the env serving on it
            # (its interception server stays up between steps).
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="reinforge-verifiers")
            self._thread.start()
            self._call(self._open())
        except BaseException:
            self.close(base=False)  # the caller still owns the wrapped generator
            raise

    def close(self, base: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        if self._loop is not None and self._loop.is_running():
            if self._serving is not None:
                try:
                    self._call(self._serving.__aexit__(None, None, None))
                finally:
                    self._serving = None
            self._call(self._loop.shutdown_default_executor())  # the renderer's worker threads
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
            self._loop.close()
            _forget_renderers(self.model_dir)
        if self.server is not None:
            self.server.close()
        if self._key_var is not None:
            os.environ.pop(self._key_var, None)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        if base:
            self.base.close()

    # -- rollouts -------------------------------------------------------------------------------
    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _open(self) -> None:
        serving = self.env.serving()
        await serving.__aenter__()
        self._serving = serving  # only once entered: close() exits it

    def _context(self, params):
        vf = self.vf
        sampling = vf.Sampling(temperature=0.0 if params.greedy else params.temperature,
                               top_p=1.0 if params.greedy else params.top_p,
                               max_tokens=min(params.max_new_tokens, self.server.max_tokens))
        return vf.ModelContext(model=self.server.model_name, client=self._client, sampling=sampling)

    async def _episodes(self, tasks: list, params) -> list:
        """Every task's verifiers episode. Each agent run's trace is a live episode of the server
        from the moment verifiers mints it (before its first model call, whose ``X-Session-ID``
        is the trace id) until the episode ends: the server serves and records only those."""
        ctx = self._context(params)
        gate = asyncio.Semaphore(self.max_concurrent)
        opened: list[str] = []

        def live(trace) -> None:
            opened.append(trace.id)
            self.server.open_episode(trace.id)

        def discarded(trace) -> None:  # a retried agent run: the abandoned attempt's trace
            self.server.close_episode(trace.id)

        async def one(task):
            async with gate:
                return await self.env.run_episode(task, ctx, on_trace=live, on_discard=discarded)

        try:
            return list(await asyncio.gather(*(one(t) for t in tasks)))
        finally:
            for trace_id in opened:
                self.server.close_episode(trace_id)

    @torch.no_grad()
    def generate_examples(self, examples: Sequence[Example], params, *, record: bool = False) -> RolloutBatch:
        """``params.num_samples`` verifiers episodes per example; one row per trainable branch of
        each trace (rows of one example contiguous), with ``episodes`` holding each row's
        VerifiersEpisode."""
        g = params.num_samples
        tasks = []
        for e in examples:
            task = e.metadata.get("verifiers_task")
            if task is None:
                raise ValueError(f"example {e.id!r} carries no verifiers task (task.source must be env)")
            tasks.extend([task] * g)
        start = len(self.server.generations)
        self.server.forget_cache()  # the weights may have changed since the last batch
        results = self._call(self._episodes(tasks, params))
        generations = self.server.generations[start:]
        del self.server.generations[start:]  # the server keeps no history between batches
        by_session: dict[str | None, list] = {}
        for gen in generations:
            by_session.setdefault(gen.session_id, []).append(gen)
        episodes: list[VerifiersEpisode] = []
        groups: list[int] = []
        for i, vf_episode in enumerate(results):
            example = examples[i // g]
            rows = []
            for trace in vf_episode.traces:
                rows.extend(self._rows(example, trace, by_session.get(trace.id, [])))  # its own calls only
            if not rows:  # a failed episode: a row without actions (no gradient), reward 0
                rows = [self._empty_row(example, vf_episode)]
            episodes.extend(rows)
            groups.extend([i // g] * len(rows))
        if all(not e.token_ids for e in episodes):
            errors = [f"{er.type}: {er.message}" for ep in results for er in ep.errors][:3]
            errors += [f"{er.type}: {er.message}" for ep in results for t in ep.traces for er in t.errors][:3]
            raise RuntimeError(f"no verifiers episode sampled any token; first errors: {errors}")
        if record:
            self.recorded.extend(episodes)
        batch = self._batch(episodes, torch.tensor(groups, dtype=torch.long))
        batch.episodes = episodes
        return batch

    def _rows(self, example: Example, trace, generations) -> list[VerifiersEpisode]:
        if not trace.agent.trainable:  # e.g. a simulated user's side: context, never training data
            return []
        rows = []
        rewards = {k: float(r.value) for k, r in trace.rewards.items() if r is not None}
        error = "; ".join(f"{e.type}: {e.message}" for e in trace.errors)[:500] or None
        for branch in trace.branches:
            ids, mask, lps = branch.token_ids, branch.sampled_mask, branch.logprobs
            if not branch.trainable or not any(mask):
                continue
            try:
                spans = sampled_spans(ids, mask, lps, generations)
            except BranchMismatch as err:
                if self.strict:
                    raise BranchMismatch(f"trace {trace.id} branch {branch.index}: {err}") from None
                self.dropped_branches += 1
                continue
            first = spans[0][0]
            ep = VerifiersEpisode(
                example_id=example.id,
                messages=[m.model_dump(mode="json", exclude_none=True) for m in branch.messages],
                prompt_ids=ids[:first], token_ids=ids[first:], action_mask=mask[first:],
                logprobs=[lp if m else 0.0 for lp, m in zip(lps[first:], mask[first:])],
                done=bool(trace.ok), truncated=bool(trace.is_truncated),
                truncation=_truncation(trace),
                env_error=error, reward=float(trace.reward), rewards=rewards, metrics=dict(trace.metrics),
                trace_id=trace.id, branch=branch.index, stop_condition=trace.stop_condition, agent=trace.agent.name,
            )
            for k, (s, e) in enumerate(spans):
                nxt = spans[k + 1][0] if k + 1 < len(spans) else len(ids)
                ep.turns.append(TurnRecord(start=s - first, end=e - first,
                                           text=self.tokenizer.decode(ids[s:e], skip_special_tokens=True),
                                           obs_start=e - first, obs_end=nxt - first))
            rows.append(ep)
        return rows

    def _empty_row(self, example: Example, vf_episode) -> VerifiersEpisode:
        from reinforge.tasks import encode_prompt

        errors = [f"{e.type}: {e.message}" for e in vf_episode.errors]
        errors += [f"{e.type}: {e.message}" for t in vf_episode.traces for e in t.errors]
        return VerifiersEpisode(example_id=example.id, messages=list(example.messages),
                                prompt_ids=encode_prompt(self.tokenizer, example), truncated=True,
                                truncation="env_error", env_error="; ".join(errors)[:500] or "no trainable branch")


# -- the reward --------------------------------------------------------------------------------


class VerifiersReward(WrappedReward):
    """Scores rows from ``VerifiersGenerator`` with their trace's reward (``trace.reward``, the
    weighted sum of the taskset's ``@vf.reward`` s); ``correct`` when it reaches
    ``correct_threshold`` and the trace finished without error. ``reward_fn`` (the config's
    ``reward`` section) contributes only its length shaping; its verifiers are not run."""

    def __init__(self, reward_fn, *, correct_threshold: float = 1.0):
        self.reward_fn = reward_fn
        self.correct_threshold = float(correct_threshold)

    def score(self, rollout, examples: Sequence) -> Scores:
        episodes = getattr(rollout, "episodes", None)
        if episodes is None or len(episodes) != len(rollout):
            raise ValueError("verifiers rewards score rollouts from VerifiersGenerator.generate_examples")
        outcomes = []
        for ep in episodes:
            errors = [ep.env_error] if ep.env_error else []
            correct = ep.reward >= self.correct_threshold and ep.done and not ep.truncated
            outcomes.append(RewardOutcome(float(ep.reward), bool(correct), dict(ep.rewards), errors))
        rewards = torch.tensor([o.reward for o in outcomes], dtype=torch.float32)
        shaping = getattr(self.reward_fn, "shaping", None)
        shaped = rewards if shaping is None else rewards + shaping(rollout.action_lengths)
        return Scores(outcomes=outcomes, rewards=rewards, shaped=shaped)


def build_verifiers_agent(cfg, generator, reward_fn):
    """The generator and reward of ``env.name: verifiers`` (reinforge.agents.build_agent)."""
    e = cfg.env
    agent = VerifiersGenerator(generator, dict(e.options), max_tokens=e.max_tokens_per_turn or cfg.rollout.max_new_tokens,
                               max_turns=e.max_turns)
    return agent, VerifiersReward(reward_fn, correct_threshold=cfg.reward.correct_threshold)
