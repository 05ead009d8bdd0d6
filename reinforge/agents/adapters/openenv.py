"""OpenEnv environments (``pip install reinforge[openenv]``; OpenEnv, the ``reset()/step()/state()``
environments of https://github.com/meta-pytorch/OpenEnv) as ``env.name: openenv``, run in the
trainer's process or served over HTTP/WebSocket:

    task: {source: env}
    env:  {name: openenv, options: {env_class: "my_env.server.my_environment:MyEnvironment"}}  # plus its kwargs
    env:  {name: openenv, options: {url: "http://localhost:8000"}}                             # a served one

An OpenEnv environment takes a typed action (a pydantic ``Action``) and returns a typed
``Observation`` carrying ``reward`` and ``done``. The model's turn becomes the action's one text
field (``action_field``: by default the action's only required string field, read from the class's
``step`` type hints, or from the server's ``/schema``); the observation's own fields (not ``reward``,
``done``, ``metadata``) become the next user turn (``observation_field`` picks one; by default the
only one, else ``name: value`` lines). ``observation.reward`` is the turn's reward (None: 0),
``done`` ends the episode (terminated: OpenEnv has no separate truncation). OpenEnv gives no
verdict on an episode: success is ``metadata["success"]`` when the environment sets it, else, with
``success_reward`` set, the final reward reaching it, else none (the outcome verifiers decide).

A local environment is one instance per trajectory, reset with the episode's seed when its
``reset`` takes one; its use of the global ``random``/``numpy.random`` is isolated by the adapter
core (adapters/base.py). A served one is one WebSocket session per trajectory (OpenEnv's
``GenericEnvClient``; no environment package is installed locally), opened at reset and closed
when the episode ends; the seed goes with the reset request. Serve it with at least as many
concurrent sessions (``max_concurrent_envs``) as trajectories decode at once
(``rollout.generation_batch_size``).
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
import typing
import weakref
from typing import Any

from reinforge.agents.adapters.base import register_text_env
from reinforge.config.base import ConfigError
from reinforge.config.callables import load_callable

__all__ = ["OpenEnvLocal", "OpenEnvServed", "make_openenv"]

_MISSING = "env.name=openenv needs OpenEnv: pip install 'reinforge[openenv]'"
_STANDARD = frozenset({"reward", "done", "metadata"})  # an Observation's base fields, not its content


def _openenv():
    try:
        import openenv.core  # noqa: F401 - the package, checked once here
        from openenv.core.env_server.types import Action, Observation
    except ImportError as err:
        raise ImportError(f"{_MISSING} ({err})") from None
    return Action, Observation


# -- rendering ---------------------------------------------------------------------------------------

def _render(fields: dict[str, Any], observation_field: str | None) -> str:
    """An observation's content fields as the text of a user turn."""
    if observation_field is not None:
        if observation_field not in fields:
            raise KeyError(f"observation_field={observation_field!r}: the observation has {sorted(fields)}")
        value = fields[observation_field]
        return value if isinstance(value, str) else json.dumps(value, default=str)
    if len(fields) == 1:
        (value,) = fields.values()
        return value if isinstance(value, str) else json.dumps(value, default=str)
    return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v, default=str)}" for k, v in fields.items())


def _only_text_field(properties: dict[str, Any], required: list[str], where: str) -> str:
    text = [k for k in required if k != "metadata" and properties.get(k, {}).get("type") == "string"]
    if len(text) != 1:
        raise TypeError(f"{where} has required fields {sorted(k for k in required if k != 'metadata')}: set "
                        "env.options.action_field to the string field the model's turn fills")
    return text[0]


def _check_observation_field(name: str, fields: set[str], where: str) -> None:
    if name not in fields - _STANDARD:
        raise TypeError(f"observation_field={name!r}: {where} has {sorted(fields - _STANDARD)}")


def _success(reward: float, metadata: dict, success_reward: float | None) -> bool | None:
    if metadata.get("success") is not None:
        return bool(metadata["success"])
    if success_reward is not None:
        return reward >= float(success_reward)
    return None


# -- a local environment ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=32)
def _env_class(target: str):
    # Cached: the environment is made once per trajectory, and a file.py:Class would be executed again.
    return load_callable(target, "env.options.env_class")


class OpenEnvLocal:
    """An OpenEnv ``Environment`` instance in this process under the adapter contract."""

    def __init__(self, env, action_cls, action_field: str, *, observation_field: str | None,
                 success_reward: float | None):
        self.env = env
        self.action_cls = action_cls
        self.action_field = action_field
        self.observation_field = observation_field
        self.success_reward = success_reward
        try:
            params = inspect.signature(env.reset).parameters.values()
            self._takes_seed = any(p.name == "seed" or p.kind is p.VAR_KEYWORD for p in params)
        except (TypeError, ValueError):
            self._takes_seed = False

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        obs = self.env.reset(seed=seed) if self._takes_seed else self.env.reset()
        return self._text(obs), dict(getattr(obs, "metadata", None) or {})

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        obs = self.env.step(self.action_cls(**{self.action_field: str(action)}))
        reward = float(obs.reward or 0.0)
        done = bool(obs.done)
        info = dict(obs.metadata or {})
        if done:
            state = getattr(self.env, "state", None)
            if hasattr(state, "model_dump"):
                info["state"] = state.model_dump(mode="json")
            success = _success(reward, info, self.success_reward)
            if success is not None:
                info["success"] = success
        return self._text(obs), reward, done, False, info

    def _text(self, obs) -> str:
        return _render(obs.model_dump(mode="json", exclude=set(_STANDARD)), self.observation_field)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def _local(env_class: str | type, kwargs: dict[str, Any], action_field: str | None, observation_field: str | None,
           success_reward: float | None) -> OpenEnvLocal:
    Action, _Observation = _openenv()
    cls = _env_class(env_class) if isinstance(env_class, str) else env_class
    try:
        hints = typing.get_type_hints(cls.step)
    except Exception:  # noqa: BLE001 - unresolvable annotations: the action class cannot be read
        hints = {}
    action_cls = hints.get("action")
    if not (isinstance(action_cls, type) and issubclass(action_cls, Action)):
        raise TypeError(f"env_class={env_class!r}: its step(action) is not annotated with an OpenEnv Action class, "
                        "so the model's text cannot be made into an action")
    if action_field is None:
        schema = action_cls.model_json_schema()
        action_field = _only_text_field(schema.get("properties", {}), schema.get("required", []),
                                        f"action {action_cls.__name__}")
    elif action_field not in action_cls.model_fields:
        raise TypeError(f"action_field={action_field!r}: {action_cls.__name__} has {sorted(action_cls.model_fields)}")
    obs_cls = hints.get("return")
    if observation_field is not None and isinstance(obs_cls, type) and hasattr(obs_cls, "model_fields"):
        _check_observation_field(observation_field, set(obs_cls.model_fields), obs_cls.__name__)
    try:
        env = cls(**kwargs)
    except TypeError as err:
        raise TypeError(f"env_class={env_class!r} does not take these options: {err}") from None
    return OpenEnvLocal(env, action_cls, action_field, observation_field=observation_field,
                        success_reward=success_reward)


# -- a served environment ---------------------------------------------------------------------------

_SCHEMAS: dict[str, dict] = {}
_SCHEMAS_LOCK = threading.Lock()


def _schema(url: str, timeout_s: float) -> dict:
    """The server's /schema (also the check that it answers), fetched once per url."""
    with _SCHEMAS_LOCK:
        if url not in _SCHEMAS:
            import requests

            try:
                response = requests.get(f"{url}/schema", timeout=timeout_s)
                response.raise_for_status()
                _SCHEMAS[url] = response.json()
            except (requests.RequestException, ValueError) as err:
                raise ConfigError(f"env.options.url={url!r}: no OpenEnv server answers there ({type(err).__name__}: "
                                  f"{err}); start it (e.g. uvicorn my_env.server.app:app --port 8000) or fix the url"
                                  ) from None
        return _SCHEMAS[url]


class OpenEnvServed:
    """An OpenEnv environment served over WebSocket, one session per episode, under the adapter
    contract. The session opens at reset and closes when the episode ends (or at ``close``, or
    when this object is collected: a trajectory cut by the trainer's budgets steps no further)."""

    # Its randomness lives in the server's process: the adapter need not swap the global RNG
    # streams (and hold their process-wide lock) around its network round trips.
    uses_global_rng = False

    def __init__(self, url: str, action_field: str, *, observation_field: str | None, success_reward: float | None,
                 timeout_s: float):
        self.url = url
        self.action_field = action_field
        self.observation_field = observation_field
        self.success_reward = success_reward
        self.timeout_s = timeout_s
        self.client = None
        self._finalizer = None

    def _connect(self):
        from openenv.core import GenericEnvClient

        self.close()
        client = GenericEnvClient(base_url=self.url, connect_timeout_s=self.timeout_s,
                                  message_timeout_s=self.timeout_s).sync()
        self.client = client
        self._finalizer = weakref.finalize(self, _close_quietly, client)
        return client

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        result = self._connect().reset(**({"seed": seed} if seed is not None else {}))
        return _render(_content(result.observation), self.observation_field), {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        if self.client is None:
            raise RuntimeError("step() before reset()")
        result = self.client.step({self.action_field: str(action)})
        reward, done = float(result.reward or 0.0), bool(result.done)
        info: dict[str, Any] = {}
        text = _render(_content(result.observation), self.observation_field)
        if done:
            try:
                info["state"] = self.client.state()
            except Exception:  # noqa: BLE001 - the state is for the record only
                pass
            success = _success(reward, {}, self.success_reward)
            if success is not None:
                info["success"] = success
            self.close()
        return text, reward, done, False, info

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # closes the client once
        self.client, self._finalizer = None, None


def _content(observation) -> dict[str, Any]:
    return {k: v for k, v in dict(observation or {}).items() if k not in _STANDARD}


def _close_quietly(client) -> None:
    try:
        client.close()
    except Exception:  # noqa: BLE001 - a session already gone on the server's side
        pass


def _served(url: str, action_field: str | None, observation_field: str | None, success_reward: float | None,
            timeout_s: float) -> OpenEnvServed:
    _openenv()
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://", "ws://", "wss://")):
        raise TypeError(f"url={url!r}: an OpenEnv server's address, e.g. http://localhost:8000")
    http = "http" + url[2:] if url.startswith("ws") else url
    action = _schema(http, timeout_s).get("action", {})
    properties = action.get("properties", {})
    if action_field is None:
        action_field = _only_text_field(properties, action.get("required", []), f"the action of {url}")
    elif properties and action_field not in properties:
        raise TypeError(f"action_field={action_field!r}: the action of {url} has {sorted(properties)}")
    observed = _schema(http, timeout_s).get("observation", {}).get("properties", {})
    if observation_field is not None and observed:
        _check_observation_field(observation_field, set(observed), f"the observation of {url}")
    return OpenEnvServed(url, action_field, observation_field=observation_field, success_reward=success_reward,
                         timeout_s=timeout_s)


def make_openenv(env_class: str | type | None = None, url: str | None = None, *, action_field: str | None = None,
                 observation_field: str | None = None, success_reward: float | None = None,
                 timeout_s: float = 60.0, **kwargs: Any):
    """An OpenEnv environment: env.options.env_class (in process, plus its kwargs) or url (served); reinforge[openenv]."""
    if (env_class is None) == (url is None):
        raise TypeError("give exactly one of env_class ('module:Class', an OpenEnv Environment run in this process) "
                        "and url (a served one, e.g. http://localhost:8000)")
    if url is not None:
        if kwargs:
            raise TypeError(f"options {sorted(kwargs)} go to a local environment's class; a served one (url) is "
                            "configured where it is served")
        return _served(str(url), action_field, observation_field, success_reward, float(timeout_s))
    return _local(env_class, kwargs, action_field, observation_field, success_reward)


register_text_env("openenv", make_openenv,
                  doc="an OpenEnv environment (env.options.env_class, in process, or url, served; reinforge[openenv])",
                  observation="append")
