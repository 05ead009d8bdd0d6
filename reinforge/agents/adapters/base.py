"""The adapter core: a gymnasium-style text environment as a reinforge environment.

An environment family is a function ``make(**options)`` returning an object with

    reset(seed: int | None = None) -> (observation: str, info: dict)
    step(action: str) -> (observation: str, reward: float, terminated: bool, truncated: bool, info: dict)
    close() -> None                                  # optional

:func:`register_text_env` registers such a family under a name, so that a config says

    task: {source: env}
    env:  {name: <name>, options: {env_id: ..., ...}}

and the environment's options are written once (``env.options``: they go to ``make``). The task
(:class:`TextEnvTask`) is one example per episode seed; the adapter (:class:`TextEnvAdapter`)
resets the environment with the example's seed, turns observations into user turns, and maps the
reward, termination, truncation and success onto the trajectory (docs/agents.md).

Randomness: many environments seed and draw from the global ``random`` and ``numpy.random``
streams in make/reset/step. Every such call runs with the globals swapped for the episode's own
streams (seeded from the episode seed) and swapped back afterwards, under one process-wide lock,
so the trainer's checkpointed RNG state is never disturbed and an episode draws the same numbers
whichever thread steps it and whatever ran before (runs are reproducible and resumable).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import logging
import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reinforge.agents.env import StepResult
from reinforge.agents.registry import ENVS, _same_function, register_env
from reinforge.tasks.base import Example, PromptFormat, Task, TaskError

__all__ = ["TEXT_ENVS", "BaselineNotApplicable", "TextEnvSpec", "TextEnvAdapter", "TextEnvTask", "TextMatchAdapter", "IsolatedRNG", "episode_seeds",
           "open_text_env", "register_text_env", "run_policy", "shown_part", "text_env_spec"]

logger = logging.getLogger("reinforge.agents")

OBSERVATION_MODES = ("append", "replace")
_SEED_RANGE = 2**31  # numpy's legacy seeding takes < 2**32; some games keep seeds in an int32

# One lock for every swap of the global RNG state: the globals are process-wide, so two threads
# swapping them at once would hand each other's streams around.
_GLOBAL_RNG_LOCK = threading.RLock()


class IsolatedRNG:
    """An episode's own global-RNG streams (``random`` and ``numpy.random``), seeded from ``seed``.
    ``with rng.active():`` runs a block with the globals set to these streams and restores the
    caller's state afterwards (the streams advance as the block drew from them)."""

    def __init__(self, seed: int):
        self._py = random.Random(seed).getstate()
        self._np = np.random.RandomState(int(seed) % 2**32).get_state()

    @contextlib.contextmanager
    def active(self):
        with _GLOBAL_RNG_LOCK:
            saved_py, saved_np = random.getstate(), np.random.get_state()
            random.setstate(self._py)
            np.random.set_state(self._np)
            try:
                yield
            finally:
                self._py, self._np = random.getstate(), np.random.get_state()
                random.setstate(saved_py)
                np.random.set_state(saved_np)


@dataclass(frozen=True)
class TextEnvSpec:
    """A registered text environment family (see :func:`register_text_env`)."""

    name: str
    make: Callable[..., Any]
    doc: str = ""
    observation: str = "append"
    success: Callable[[float, dict], bool] | None = None
    baselines: dict[str, Callable] = field(default_factory=dict)

    def __reduce__(self):
        # Pickled by name (the task sent to environment workers holds its spec): a worker has
        # imported the module that registered it, and ``make`` or a baseline may be a lambda.
        return (text_env_spec_named, (self.name,))


TEXT_ENVS: dict[str, TextEnvSpec] = {}


def text_env_spec_named(name: str) -> TextEnvSpec:
    """The registered text environment ``name`` (how a pickled spec is found again)."""
    if name not in TEXT_ENVS:
        raise LookupError(f"text environment {name!r} is not registered in this process: import the module that "
                          "registers it (`imports`)")
    return TEXT_ENVS[name]


def register_text_env(name: str, make: Callable[..., Any], *, doc: str = "", observation: str = "append",
                      success: Callable[[float, dict], bool] | None = None,
                      baselines: dict[str, Callable] | None = None) -> None:
    """Register a gymnasium-style text environment family as ``env.name: name``.

    make:        ``make(**env.options)`` -> an object with ``reset(seed=None) -> (obs, info)`` and
                 ``step(action) -> (obs, reward, terminated, truncated, info)``.
    observation: "append": each observation is a new user turn (the past is never re-tokenized);
                 "replace": each observation is the environment's whole current state (e.g.
                 TextArena's growing history): the model is shown what changed since the last one.
    success:     ``success(terminal_reward, info) -> bool``, the episode's verdict when the
                 environment does not put ``"success"`` in its final ``info``.
    baselines:   name -> ``policy(observation, rng: random.Random) -> action``; the held-out
                 guardrails run each one over the held-out episodes (no model) and report its
                 success rate beside the model's.
    """
    if observation not in OBSERVATION_MODES:
        raise ValueError(f"register_text_env({name!r}): observation={observation!r}; accepted: "
                         f"{', '.join(OBSERVATION_MODES)}")
    if not callable(make):
        raise TypeError(f"register_text_env({name!r}): make must be callable, got {type(make).__name__}")
    for bname, policy in (baselines or {}).items():
        if not callable(policy):
            raise TypeError(f"register_text_env({name!r}): baseline {bname!r} is not callable")
    old = TEXT_ENVS.get(name)
    if old is not None and not _same_function(old.make, make):
        raise ValueError(f"a text environment named {name!r} is already registered")
    if old is None and name in ENVS:
        raise ValueError(f"an environment named {name!r} is already registered")
    spec = TextEnvSpec(name, make, doc or _first_line(make), observation, success, dict(baselines or {}))
    if old is not None:  # the same family registered again (a module imported twice) keeps the first
        return
    TEXT_ENVS[name] = spec

    def factory(task, **options):
        return open_text_env(TEXT_ENVS[name], options, task=task)

    def make_task(task_config, **options):
        return TextEnvTask(TEXT_ENVS[name], task_config, options)

    factory.__doc__ = spec.doc or f"the text environment {name}"
    factory.__qualname__ = f"text_env[{name}]"  # registry.register_env tells factories apart by qualname
    register_env(name, make_task=make_task)(factory)


def text_env_spec(name: str) -> TextEnvSpec | None:
    """The registered text environment ``name``, or None."""
    return TEXT_ENVS.get(name)


def _first_line(obj) -> str:
    return (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]


# -- episode seeds ------------------------------------------------------------------------------

def episode_seeds(seed: int, train_size: int, eval_size: int) -> tuple[list[int], list[int]]:
    """Distinct episode seeds for training and held-out episodes, derived from ``seed`` (the
    task's seed); no seed is in both lists."""
    held = _distinct(random.Random(f"reinforge/text-env/{seed}/eval"), eval_size, set())
    train = _distinct(random.Random(f"reinforge/text-env/{seed}/train"), train_size, set(held))
    return train, held


def _distinct(rng: random.Random, n: int, taken: set[int]) -> list[int]:
    out: list[int] = []
    seen = set(taken)
    while len(out) < n:
        s = rng.randrange(_SEED_RANGE)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


class TextEnvTask(Task):
    """One example per episode seed (``task.train_size`` training ones, ``task.eval_size``
    held-out ones with seeds no training example has). The prompt is the environment's first
    observation, produced at reset, so an example's messages only name its episode. ``score`` is
    0: a text environment's verdict is its reward and success, not a reference answer."""

    def __init__(self, spec: TextEnvSpec, task_config, options: dict[str, Any]):
        self.spec = spec
        self.name = spec.name
        self.options = dict(options)
        self.format = PromptFormat(task_config.system_prompt, task_config.prompt_suffix,
                                   tuple({"user": s.user, "assistant": s.assistant} for s in task_config.few_shot))
        try:  # one environment made now, so bad options fail before any model loads
            open_text_env(spec, self.options).close()
        except TypeError as err:
            raise TaskError(f"env.options for environment {spec.name!r}: {err}") from None
        except ImportError as err:  # the adapter's package is missing: its message names the extra
            raise TaskError(str(err)) from None
        train, held = episode_seeds(int(task_config.seed), int(task_config.train_size), int(task_config.eval_size))
        self._train = [self._example("train", i, s) for i, s in enumerate(train)]
        self._eval = [self._example("eval", i, s) for i, s in enumerate(held)]

    def _example(self, split: str, i: int, seed: int) -> Example:
        label = json.dumps(self.options, sort_keys=True, default=str)
        return Example(id=f"{self.name}/{split}/{i}",
                       messages=[{"role": "user", "content": f"[{self.name} {label} episode, seed {seed}]"}],
                       answer=None, metadata={"seed": seed, "env": self.name})

    def train_examples(self) -> Sequence[Example]:
        return self._train

    def eval_examples(self) -> Sequence[Example]:
        return self._eval

    def score(self, answer: str, example: Example) -> float:
        return 0.0

    @property
    def baselines(self) -> dict[str, Callable]:
        return dict(self.spec.baselines)

    def run_baselines(self, examples: Sequence[Example], *, max_turns: int) -> dict[str, list[bool]]:
        """Each declared baseline's success on ``examples`` (episodes run without the model);
        baselines that raise BaselineNotApplicable for these options are left out."""
        out = {}
        for bname, policy in self.spec.baselines.items():
            try:
                out[bname] = run_policy(self.spec, self.options, examples, policy, max_turns=max_turns)
            except BaselineNotApplicable:
                continue
        return out


# -- the adapter --------------------------------------------------------------------------------

def _episode_seed(example: Example) -> int:
    seed = (example.metadata or {}).get("seed")
    if seed is None:
        raise TaskError(f"example {example.id!r} has no episode seed (metadata['seed']): a text environment "
                        "makes its own examples; set task.source: env")
    return int(seed)


class TextEnvAdapter:
    """One episode of a text environment as a reinforge ``Env`` (chat messages in and out).

    The environment is made once per trajectory (``make(**options)``, its draws from a fixed
    stream) and reset with the example's episode seed; each assistant turn's text is the action.
    ``step`` returns the environment's reward as the turn's reward, ends the episode when it is
    terminated or truncated (``StepResult.truncated`` marks the latter: not a success), and puts
    the episode's verdict in ``info["success"]``: the environment's own, else the family's
    ``success(reward, info)`` rule on termination, else None (outcome verifiers decide).
    """

    tools: list[dict] = []

    def __init__(self, spec: TextEnvSpec, options: dict[str, Any], *, task=None, env=None):
        self.spec = spec
        self.options = dict(options)
        self.max_turns: int | None = None
        self.format = getattr(task, "format", None) or PromptFormat()
        self._rng = IsolatedRNG(0)
        self.env = env if env is not None else make_text_env(spec, self.options)
        for attr in ("reset", "step"):
            if not callable(getattr(self.env, attr, None)):
                raise TypeError(f"text environment {spec.name!r}: make(**options) returned "
                                f"{type(self.env).__name__}, which has no {attr}() method")
        # An environment that declares ``uses_global_rng = False`` (one served by another process)
        # is called without the swap: the swap's process-wide lock would serialise its network waits.
        self._isolated = bool(getattr(self.env, "uses_global_rng", True))
        self.seed: int | None = None
        self.observation = ""  # the environment's current observation (whole, as it gave it)
        self.success: bool | None = None
        self.truncated = False
        self.done = False

    def reset(self, example: Example) -> list[dict]:
        self.seed = _episode_seed(example)
        self._rng = IsolatedRNG(self.seed)
        with self._rng_guard():
            out = self.env.reset(seed=self.seed)
        obs, _info = out if isinstance(out, tuple) else (out, {})
        self.observation = _text(obs)
        self.success, self.truncated, self.done = None, False, False
        return self.format.messages(self.observation)

    def step(self, message: dict) -> StepResult:
        action = str(message.get("content", ""))
        with self._rng_guard():
            out = self.env.step(action)
        try:
            obs, reward, terminated, truncated, info = out
        except (TypeError, ValueError):
            raise TypeError(f"text environment {self.spec.name!r}: step() must return (observation, reward, "
                            f"terminated, truncated, info); got {type(out).__name__}") from None
        info = dict(info or {})
        reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        shown = self._shown(_text(obs))
        self.observation = _text(obs)
        success = self._verdict(reward, terminated, truncated, info)
        self.done, self.truncated = terminated or truncated, truncated and not terminated
        if self.done:
            self.success = success
        record = {"env_info": {k: v for k, v in info.items() if _jsonable(v)}}
        if success is not None:
            record["success"] = success
        observations = [] if self.done else [{"role": "user", "content": shown}]
        return StepResult(observations, reward, self.done, record, truncated=self.truncated)

    def _rng_guard(self):
        return self._rng.active() if self._isolated else contextlib.nullcontext()

    def _verdict(self, reward: float, terminated: bool, truncated: bool, info: dict) -> bool | None:
        if truncated and not terminated:
            return False  # a truncated episode is not a success, whatever else it says
        if "success" in info and info["success"] is not None:
            return bool(info["success"])
        if terminated and self.spec.success is not None:
            return bool(self.spec.success(reward, info))
        return None

    def _shown(self, obs: str) -> str:
        return shown_part(self.spec.observation, self.observation, obs)

    def close(self) -> None:
        """Close the environment (the agent loop calls this when the episode is over); a failure
        to close is logged, never raised: the episode is already recorded."""
        close = getattr(self.env, "close", None)
        if callable(close):
            try:
                with self._rng_guard():
                    close()
            except Exception as err:  # noqa: BLE001 - any failure of the environment's own code
                logger.warning("closing text environment %r failed: %s: %s", self.spec.name, type(err).__name__, err)


def shown_part(mode: str, last: str, obs: str) -> str:
    """What the model is shown of a new observation ``obs`` after ``last``: all of it ("append"),
    or in "replace" mode what changed: the new part when the state grew from the last one, else
    the whole state (so the conversation's content is the current state, with no re-tokenizing)."""
    if mode == "replace" and last and obs.startswith(last):
        new = obs[len(last):].strip()
        if new:
            return new
    return obs


def make_text_env(spec: TextEnvSpec, options: dict[str, Any]):
    """``spec.make(**options)`` under a fixed stream of the global RNGs (its draws replay)."""
    with IsolatedRNG(0).active():
        return spec.make(**options)


def open_text_env(spec: TextEnvSpec, options: dict[str, Any], task=None):
    """One episode's environment: a ``TextEnvAdapter``, or for a game whose every seat is a
    trajectory (``make`` returned an object with ``seats``: self-play, a frozen opponent) a
    ``TextMatchAdapter`` (below)."""
    env = make_text_env(spec, options)
    if getattr(env, "seats", None):
        return TextMatchAdapter(spec, env, task=task)
    return TextEnvAdapter(spec, options, task=task, env=env)


def _text(obs) -> str:
    return obs if isinstance(obs, str) else str(obs)


def _jsonable(v) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


# -- games whose every seat is a trajectory (self-play, a frozen opponent) ------------------------
#
# A family's ``make(**options)`` returns such a game when it has ``seats`` (per seat "policy" or
# "frozen") and ``reset(seed)``, ``to_move() -> seat | None`` (None once over), ``observation(seat)
# -> str`` (what the seat to move sees; called once per turn of it), ``act(seat, action)``, and
# ``result() -> {seat: (reward, info)}`` once over (info may hold "success"). The adapter is the
# agent loop's match (agents/seats.py): every call inside the episode's own RNG streams, each seat
# shown what its observation added since its last turn ("replace") or all of it ("append").

class TextMatchAdapter:
    """One game of a several-seat text family under the match protocol of agents/seats.py."""

    tools: list[dict] = []

    def __init__(self, spec: TextEnvSpec, game, *, task=None):
        for attr in ("reset", "to_move", "observation", "act", "result"):
            if not callable(getattr(game, attr, None)):
                raise TypeError(f"text environment {spec.name!r}: a game with seats needs {attr}() "
                                f"({type(game).__name__} has none)")
        self.spec, self.game = spec, game
        self.seats = tuple(game.seats)
        self.max_turns: int | None = getattr(game, "max_turns", None)
        self.format = getattr(task, "format", None) or PromptFormat()
        self._rng = IsolatedRNG(0)
        self.seed: int | None = None
        self._seen = [""] * len(self.seats)  # each seat's last whole observation
        self._result: dict[int, tuple[float, dict]] | None = None

    def _guard(self):
        return self._rng.active() if getattr(self.game, "uses_global_rng", True) else contextlib.nullcontext()

    def reset(self, example: Example) -> None:
        self.seed = _episode_seed(example)
        self._rng = IsolatedRNG(self.seed)
        with self._guard():
            self.game.reset(seed=self.seed)
        self._seen = [""] * len(self.seats)
        self._result = None

    def to_move(self) -> int | None:
        with self._guard():
            seat = self.game.to_move()
        return None if seat is None else int(seat)

    def _view(self, seat: int) -> str:
        with self._guard():
            text = str(self.game.observation(seat))
        shown = shown_part(self.spec.observation, self._seen[seat], text)
        self._seen[seat] = text
        return shown

    def opening(self, seat: int) -> list[dict]:
        return self.format.messages(self._view(seat))

    def step(self, seat: int, message: dict) -> None:
        with self._guard():
            self.game.act(seat, str(message.get("content", "")))

    def observe(self, seat: int) -> StepResult:
        if self.to_move() is not None:
            return StepResult([{"role": "user", "content": self._view(seat)}], 0.0, False, {})
        if self._result is None:
            with self._guard():
                self._result = {int(k): (float(r), dict(i or {})) for k, (r, i) in self.game.result().items()}
        reward, info = self._result.get(seat, (0.0, {}))
        record: dict[str, Any] = {"env_info": {k: v for k, v in info.items() if _jsonable(v)}}
        if info.get("success") is not None:
            record["success"] = bool(info["success"])
        elif self.spec.success is not None:
            record["success"] = bool(self.spec.success(reward, info))
        return StepResult([], reward, True, record)

    def close(self) -> None:
        close = getattr(self.game, "close", None)
        if callable(close):
            with self._guard():
                close()


# -- baselines ----------------------------------------------------------------------------------

class BaselineNotApplicable(Exception):
    """Raised by a baseline policy that does not fit the environment it was given (e.g. a
    scripted player of one game, run on another): the baseline is left out of the report."""


def _wants_env(policy) -> bool:
    try:
        return "env" in inspect.signature(policy).parameters
    except (TypeError, ValueError):
        return False


def run_policy(spec: TextEnvSpec, options: dict[str, Any], examples: Sequence[Example],
               policy: Callable[..., str], *, max_turns: int, task=None,
               conversations: list | None = None) -> list[bool]:
    """Run ``policy(observation, rng) -> action`` (no model) over the episodes of ``examples``,
    at most ``max_turns`` actions each: whether each episode succeeded. The policy sees the
    environment's whole current observation; its ``rng`` is seeded from the episode seed. A
    policy with a parameter named ``env`` also gets the environment object (``env=``), e.g. to
    call its own random-action sampler; it runs inside the episode's isolated RNG streams.
    ``conversations``: a list that gets each episode's chat messages as the agent loop shows them
    (``task``'s system prompt and few-shot turns, then the actions and observations) and the
    number of them the opening had, ``{"messages": [...], "opening": n}``, for demonstrations
    (scripts/env_policy_demos.py)."""
    wants_env = _wants_env(policy)
    out = []
    for ex in examples:
        env = open_text_env(spec, options, task)
        if not isinstance(env, TextEnvAdapter):
            env.close()
            raise BaselineNotApplicable("every seat of this game is a trajectory (self-play, a frozen opponent): "
                                        "a baseline plays one seat against the environment")
        try:
            messages = env.reset(ex)
            opening = len(messages)
            rng = random.Random(f"reinforge/baseline/{env.seed}")
            for _ in range(max_turns):
                with env._rng.active():
                    action = policy(env.observation, rng, env=env.env) if wants_env else policy(env.observation, rng)
                messages.append({"role": "assistant", "content": str(action)})
                messages.extend(env.step(messages[-1]).observations)
                if env.done:
                    break
            if conversations is not None:
                conversations.append({"messages": messages, "opening": opening})
            out.append(bool(env.success) and env.done and not env.truncated)
        finally:
            env.close()
    return out
