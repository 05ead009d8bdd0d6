"""An OpenAI-compatible ``/v1/chat/completions`` endpoint on the loopback interface, in front of
the HF rollout engine, recording the exact token ids and log-probs behind every response, so that
an agent written against the OpenAI client produces trajectories reinforge can train on.

    with CompletionServer(generator) as server:      # http://127.0.0.1:<port>/v1
        with server.episode() as ep:                  # one live episode: its requests are rows
            run_my_agent(base_url=server.url, api_key=ep.api_key)
    batch = server.rollout()                          # one row per conversation, token-in/token-out

Who may call (reinforge/agents/endpoint_guard.py): every request carries ``Authorization: Bearer
<key>``, the run's secret (``server.api_key``) or an episode's key (``open_episode().api_key``),
else 401; a request that samples must belong to a live episode (its key's, or the one its
``X-Session-ID`` names), else 403, so only the run's own episodes become training rows. Bodies
need a ``Content-Length`` of at most ``max_body_bytes``; at most ``max_connections`` connections
at once, each with ``io_timeout_s`` to send its request; prompts longer than ``max_model_len``
and sampling parameters out of range are refused (400) before the engine sees them.

Token-in/token-out across requests: a request whose messages begin with a conversation this server
already answered in the same episode (the same messages and the assistant message it returned)
continues that conversation's token ids: the sampled tokens as they were sampled, then only the
new messages' tokens, rendered as the agent loop renders observations (reinforge/agents/render.py).
Anything else starts a new conversation from the chat template.

Tool calls: the request's ``tools`` are shown as the agent loop shows them (the template's
``tools=``, else the fallback system prompt), and ``<tool_call>{json}</tool_call>`` in the sampled
text is returned as OpenAI ``tool_calls`` (``finish_reason: "tool_calls"``).

Batching (reinforge/rollout/serving.py): with ``batching=True`` (the default, for an in-process HF
generator over a full-attention model) every route's requests go to one ``BatchingEngine``:
requests in flight share decode steps, a request arriving while others decode joins the running
batch at the next step, and a prompt that starts with the ids of an earlier finished request (the
next turn of a conversation, another sample of a prompt) reuses that request's KV cache from an
LRU store of at most ``kv_cache_mb`` and prefills only the rest. Each request samples from its own
RNG, seeded by its ``seed`` (chat) or ``sampling_params.seed`` (generate) when given, else drawn
from torch's global RNG on arrival. ``batching=False``: one request at a time through
``generator.generate``, every prompt prefilled in full.

Token-in/token-out for clients that render prompts themselves: ``POST /inference/v1/generate``
(the route vLLM's token-in/token-out server mounts, which ``verifiers``' training client calls)
takes ``token_ids`` and ``sampling_params`` (``temperature``, ``top_p``, ``max_tokens``,
``stop_token_ids``) and returns the sampled ids with their log-probs; every call is kept in
``server.generations`` with its episode (verifiers sends its trace id as ``X-Session-ID``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from reinforge.agents.endpoint_guard import BoundedHTTPServer, Gate, GuardedHandler, RequestError, number_param
from reinforge.agents.loop import pad_trajectories
from reinforge.agents.render import ChatRenderer
from reinforge.agents.tools import parse_tool_calls, strip_tool_calls
from reinforge.batch import RolloutBatch
from reinforge.rollout.base import SamplingParams
from reinforge.rollout.serving import MAX_SEED, BatchingEngine, supports_batching

log = logging.getLogger(__name__)

DEFAULT_MAX_MODEL_LEN = 8192  # when neither the caller, the model config nor the tokenizer says
MAX_TEMPERATURE = 100.0
MAX_TOKENS_PARAM = 1 << 20  # a larger max_tokens is refused; any accepted one is capped at the server's
MAX_STOP_TOKEN_IDS = 1024


@dataclass(frozen=True)
class LiveEpisode:
    """An open episode: requests made with ``api_key`` (or with the run's key and
    ``X-Session-ID: <id>``) belong to it until ``CompletionServer.close_episode(id)``."""

    id: str
    api_key: str


@dataclass
class Conversation:
    """What the server sampled for one chain of requests: prompt ids, then every token after it,
    ``action_mask`` True on the sampled ones, ``logprobs`` their sampling log-probs."""

    messages: list[dict]
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    action_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    extended: bool = False  # a later request continued it
    episode: str | None = None  # the live episode whose request made it


@dataclass
class Generation:
    """One ``/inference/v1/generate`` call: the ids it was given, the ids it sampled with their
    log-probs, and the client's ``X-Session-ID`` (verifiers sends its trace id)."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    session_id: str | None = None  # the episode it belongs to


def _canonical(message: dict) -> str:
    """A message as compared across requests: role, text and tool calls (clients add fields)."""
    calls = [{"name": c.get("function", {}).get("name"), "arguments": _json_args(c.get("function", {}).get("arguments"))}
             for c in message.get("tool_calls") or []]
    return json.dumps({"role": message.get("role"), "content": message.get("content") or "", "tool_calls": calls},
                      sort_keys=True)


def _json_args(args):
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


class CompletionServer:
    """Serves ``/v1/chat/completions``, ``/inference/v1/generate`` and ``/v1/models`` on
    127.0.0.1:``port`` (0: a free port) with an ``HFGenerator``.

    max_tokens:      the default and the cap of a response's tokens.
    max_model_len:   prompt plus response tokens at most (None: the model config's
                     ``max_position_embeddings``, else the tokenizer's ``model_max_length``, else
                     8192); a longer prompt is refused on every route.
    max_body_bytes:  the largest request body read (413 above it).
    max_connections: connections served at once, a thread each (503 to one more).
    io_timeout_s:    seconds a connection has to send its request, and for each write of the answer.
    batching:        serve requests with a continuous-batching engine (shared decode steps, KV
                     reuse across turns); False, or a generator it cannot drive: one at a time.
    max_batch:       rows the batching engine decodes together at most.
    kv_cache_mb:     the batching engine's store of finished requests' KV caches (LRU; 0: none).
    """

    def __init__(self, generator, *, port: int = 0, max_tokens: int = 256, tool_format: str = "auto",
                 model_name: str = "reinforge-policy", max_model_len: int | None = None,
                 max_body_bytes: int = 8 << 20, max_connections: int = 64, io_timeout_s: float = 30.0,
                 batching: bool = True, max_batch: int = 64, kv_cache_mb: float = 512):
        self.generator = generator
        self.tokenizer = generator.tokenizer
        self.renderer = ChatRenderer(self.tokenizer, tool_format)
        self.max_tokens = max_tokens
        self.model_name = model_name
        if max_model_len is None:  # what the model's positions allow (clients check prompts against it)
            engine = getattr(generator, "engine", None)
            max_model_len = getattr(getattr(engine, "config", None), "max_position_embeddings", None)
        if max_model_len is None:
            limit = getattr(self.tokenizer, "model_max_length", None)
            max_model_len = limit if isinstance(limit, int) and 0 < limit < 10**7 else DEFAULT_MAX_MODEL_LEN
        self.max_model_len = int(max_model_len)
        self.max_body_bytes = int(max_body_bytes)
        self.conversations: list[Conversation] = []
        self.generations: list[Generation] = []
        self.gate = Gate()
        self._by_key: dict[str, Conversation] = {}
        self._keys_of: dict[str, list[str]] = {}
        self._engine = threading.Lock()  # one request in the engine at a time (batching=False)
        self._render = threading.Lock()  # a fast tokenizer must not be used by two threads at once
        self.batcher = (BatchingEngine(generator, max_batch=max_batch, cache_bytes=int(kv_cache_mb * (1 << 20)))
                        if batching and supports_batching(generator) else None)
        self._state = threading.Lock()  # what is recorded, and the episodes' conversations
        self._http = BoundedHTTPServer(("127.0.0.1", port), _handler(self), max_connections=max_connections,
                                       io_timeout_s=io_timeout_s)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    @property
    def api_key(self) -> str:
        """The run's secret: the key of every route (a sampling request also names its episode)."""
        return self.gate.secret

    def start(self) -> "CompletionServer":
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True, name="reinforge-openai")
        self._thread.start()
        return self

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        if self.batcher is not None:
            self.batcher.close()

    def __enter__(self) -> "CompletionServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def forget_cache(self) -> None:
        """Drop the batching engine's stored KV caches (they were computed under the weights of
        their time; entries from another ``generator.version`` are dropped anyway)."""
        if self.batcher is not None:
            self.batcher.clear_cache()

    # -- episodes -------------------------------------------------------------------------------
    def open_episode(self, episode_id: str | None = None) -> LiveEpisode:
        """Make ``episode_id`` (default: a fresh one) live: its requests are served and recorded."""
        episode_id = episode_id or f"ep-{uuid.uuid4().hex}"
        self.gate.open(episode_id)
        return LiveEpisode(episode_id, self.gate.key(episode_id))

    def close_episode(self, episode_id: str) -> None:
        """End ``episode_id``: its later requests are refused (403) and never recorded."""
        self.gate.close(episode_id)
        with self._state:
            for key in self._keys_of.pop(episode_id, []):
                self._by_key.pop(key, None)

    @contextmanager
    def episode(self, episode_id: str | None = None):
        ep = self.open_episode(episode_id)
        try:
            yield ep
        finally:
            self.close_episode(ep.id)

    def _record(self, episode: str | None, record) -> None:
        """Run ``record()`` if ``episode`` is still live (a request that outlived its episode is
        answered 403 and kept nowhere)."""
        with self._state:
            if episode is not None and not self.gate.live(episode):
                raise RequestError(403, f"episode {episode!r} finished while this request ran: it is not recorded",
                                   "no_live_episode")
            record()

    # -- one request ----------------------------------------------------------------------------
    def _sampling(self, sp: dict, prompt_len: int, max_tokens, field_name: str) -> SamplingParams:
        """Validated sampling parameters for a prompt of ``prompt_len`` tokens (400 naming the
        parameter and its range, or the prompt's length and the limit)."""
        n = sp.get("n")
        if n is not None and number_param(n, "n", 1, MAX_TOKENS_PARAM, integer=True) != 1:
            raise RequestError(400, "n > 1 is not supported: send one request per sample", param="n")
        if prompt_len >= self.max_model_len:
            raise RequestError(400, f"the prompt has {prompt_len} tokens; max_model_len is {self.max_model_len} "
                                    "(prompt and response together)", param=field_name)
        limit = self.max_tokens if max_tokens is None else number_param(max_tokens, "max_tokens", 1, MAX_TOKENS_PARAM,
                                                                        integer=True)
        temperature = 1.0 if sp.get("temperature") is None else number_param(sp["temperature"], "temperature", 0.0,
                                                                              MAX_TEMPERATURE)
        top_p = 1.0 if sp.get("top_p") is None else number_param(sp["top_p"], "top_p", 0.0, 1.0, lo_open=True)
        if sp.get("seed") is not None:
            number_param(sp["seed"], "seed", 0, MAX_SEED, integer=True)
        return SamplingParams(num_samples=1, temperature=max(temperature, 1e-6), top_p=top_p,
                              max_new_tokens=min(limit, self.max_tokens, self.max_model_len - prompt_len),
                              greedy=temperature == 0.0)

    def _run(self, ids: list[int], params: SamplingParams, stops=frozenset(), seed=None):
        """(sampled ids, their log-probs, truncated) of one completion of ``ids``; ``stops``: stop
        ids besides the model's EOS."""
        seed = None if seed is None else int(seed)
        if self.batcher is not None:
            req = self.batcher.submit(ids, params, stop_ids=stops, seed=seed).result()
            return req.tokens, req.logprobs, req.truncated
        with self._engine:
            # Per-request stop ids: the engine reads its stop set per call, and the lock keeps
            # every other caller out while it is widened.
            saved = self.generator.eos_ids
            self.generator.eos_ids = saved | set(stops)
            try:
                with torch.random.fork_rng(devices=[]) if seed is not None else _nothing():
                    if seed is not None:
                        torch.manual_seed(seed)
                    out = self.generator.generate([list(ids)], params)
            finally:
                self.generator.eos_ids = saved
        k = int(out.completion_mask[0].sum())
        return out.completion_ids[0, :k].tolist(), out.sampler_logprobs[0, :k].tolist(), bool(out.truncated[0])

    def complete(self, request: dict, episode: str | None = None) -> dict:
        """One chat completion; ``episode``: the live episode it belongs to (None: a direct
        call, recorded unconditionally)."""
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ValueError("'messages' must be a non-empty list of chat messages")
        tools = request.get("tools") or None
        max_tokens = request.get("max_completion_tokens")
        max_tokens = request.get("max_tokens") if max_tokens is None else max_tokens
        keys = [_canonical(m) for m in messages]
        scope = f"{episode}\n" if episode is not None else "\n"
        with self._state:
            parent, cut = None, 0
            for k in range(len(keys), 0, -1):  # the longest conversation of this episode it continues
                parent = self._by_key.get(scope + "\n".join(keys[:k]))
                if parent is not None:
                    cut = k
                    break
        with self._render:
            if parent is not None:
                stop = self.tokenizer.decode(parent.token_ids[-1:]) if parent.token_ids else None
                obs = self.renderer.observation_ids([_plain(m) for m in messages[cut:]], stop)
                conv = Conversation(list(messages), list(parent.prompt_ids), parent.token_ids + obs,
                                    parent.action_mask + [False] * len(obs), parent.logprobs + [0.0] * len(obs),
                                    episode=episode)
            else:
                conv = Conversation(list(messages), self.renderer.prompt_ids([_plain(m) for m in messages], tools),
                                    episode=episode)
        context = conv.prompt_ids + conv.token_ids
        params = self._sampling(request, len(context), max_tokens, "messages")
        sampled, lps, truncated = self._run(context, params, seed=request.get("seed"))
        k = len(sampled)
        conv.token_ids += sampled
        conv.action_mask += [True] * k
        conv.logprobs += lps
        with self._render:
            text = self.tokenizer.decode(sampled, skip_special_tokens=True)
        calls = [c for c in parse_tool_calls(text) if c.error is None]
        message: dict = {"role": "assistant", "content": strip_tool_calls(text).strip() if calls else text}
        if calls:
            message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                                      "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                     for c in calls]
        finish = "length" if truncated else ("tool_calls" if calls else "stop")
        conv.messages.append(message)
        key = scope + "\n".join(keys + [_canonical(message)])

        def record():
            if parent is not None:
                parent.extended = True
            self.conversations.append(conv)
            self._by_key[key] = conv
            if episode is not None:
                self._keys_of.setdefault(episode, []).append(key)

        self._record(episode, record)
        choice = {"index": 0, "message": message, "finish_reason": finish}
        if request.get("logprobs"):
            with self._render:
                choice["logprobs"] = {"content": [{"token": self.tokenizer.decode([t]), "logprob": lp}
                                                  for t, lp in zip(sampled, lps)]}
        prompt_len = len(context)
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": [choice],
                "usage": {"prompt_tokens": prompt_len, "completion_tokens": k, "total_tokens": prompt_len + k},
                # Not OpenAI's: the exact ids behind this response (vLLM's return_token_ids does the same).
                "prompt_token_ids": context, "completion_token_ids": sampled}

    def generate_tokens(self, request: dict, session_id: str | None = None) -> dict:
        """``POST /inference/v1/generate``: sample a continuation of ``token_ids``. The stop ids
        are the model's EOS plus the request's ``stop_token_ids`` (as vLLM does); the stop token
        is returned with the sample (``finish_reason: "stop"``), else ``"length"``.
        ``session_id``: the live episode it belongs to (None: a direct call, recorded)."""
        ids = request.get("token_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("'token_ids' must be a non-empty list of token ids")
        vocab = len(self.tokenizer)
        if any(t < 0 or t >= vocab for t in ids):
            raise ValueError(f"'token_ids' holds ids outside the vocabulary (0..{vocab - 1})")
        sp = request.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise ValueError("'sampling_params' must be an object")
        params = self._sampling(sp, len(ids), sp.get("max_tokens"), "token_ids")
        stop_ids = sp.get("stop_token_ids") or []
        if not isinstance(stop_ids, list) or len(stop_ids) > MAX_STOP_TOKEN_IDS:
            raise RequestError(400, f"'stop_token_ids' must be a list of at most {MAX_STOP_TOKEN_IDS} token ids",
                               param="stop_token_ids")
        stops = {number_param(t, "stop_token_ids", 0, vocab - 1, integer=True) for t in stop_ids}
        sampled, lps, truncated = self._run(list(ids), params, frozenset(stops), seed=sp.get("seed"))
        finish = "length" if truncated else "stop"
        rid = f"gen-{uuid.uuid4().hex[:16]}"
        self._record(session_id, lambda: self.generations.append(Generation(rid, list(ids), sampled, lps, finish,
                                                                             session_id)))
        # vLLM's form under return_tokens_as_token_ids; verifiers' client checks each entry's token.
        content = [{"logprob": lp, "token": f"token_id:{t}"} for t, lp in zip(sampled, lps)]
        return {"request_id": rid, "model": self.model_name, "prompt_token_ids": list(ids),
                "choices": [{"index": 0, "token_ids": sampled, "logprobs": {"content": content},
                             "finish_reason": finish}]}

    # -- what to train on -----------------------------------------------------------------------
    def finished(self, episode: str | None = None) -> list[Conversation]:
        """The conversations no later request continued (whole trajectories), in order; only
        ``episode``'s when given."""
        with self._state:
            return [c for c in self.conversations if not c.extended and (episode is None or c.episode == episode)]

    def rollout(self, conversations: list[Conversation] | None = None, group_index: torch.Tensor | None = None) -> RolloutBatch:
        """A RolloutBatch of ``conversations`` (default: ``finished()``), one row each, with the
        sampled tokens in the action mask and the rest as context."""
        convs = self.finished() if conversations is None else conversations
        n = len(convs)
        return RolloutBatch(**pad_trajectories(convs, self.generator.pad_id), truncated=torch.zeros(n, dtype=torch.bool),
                            group_index=torch.arange(n) if group_index is None else group_index,
                            texts=self.tokenizer.batch_decode([c.token_ids for c in convs], skip_special_tokens=True),
                            versions=torch.full((n,), self.generator.version, dtype=torch.long))


@contextmanager
def _nothing():
    yield


def _plain(message: dict) -> dict:
    """A client's message as the chat template takes it (tool calls shown as the model wrote them)."""
    out = {"role": message.get("role", "user"), "content": message.get("content") or ""}
    if message.get("tool_calls"):
        calls = "".join(f"<tool_call>{json.dumps({'name': c['function']['name'], 'arguments': _json_args(c['function'].get('arguments'))})}</tool_call>"
                        for c in message["tool_calls"])
        out["content"] = (out["content"] + calls).strip()
    return out


def _handler(server: CompletionServer):
    routes = ("/v1/chat/completions", "/inference/v1/generate")

    class Handler(GuardedHandler):
        max_body_bytes = server.max_body_bytes

        def _answer(self, route) -> None:
            try:
                self.send_json(200, route())
            except RequestError as err:
                self.send_json(err.status, err.body())
            except (ValueError, TypeError, KeyError, AttributeError) as err:  # the request's shape
                self.send_json(400, RequestError(400, str(err)).body())
            except OSError:  # the client went away, or its deadline passed
                raise
            except Exception as err:  # noqa: BLE001 - answered, not a dead connection
                log.exception("loopback endpoint: %s %s failed", self.command, self.path)
                self.send_json(500, RequestError(500, f"internal error ({type(err).__name__})", "server_error").body())

        def do_GET(self) -> None:
            def models() -> dict:
                server.gate.authenticate(self.headers.get("Authorization"))
                if self.path.split("?", 1)[0].rstrip("/") != "/v1/models":
                    raise RequestError(404, f"no route {self.path[:200]}", "not_found")
                # vLLM's max_model_len field: clients check prompt lengths with it
                model = {"id": server.model_name, "object": "model", "max_model_len": server.max_model_len}
                return {"object": "list", "data": [model]}

            self._answer(models)

        def do_POST(self) -> None:
            def post() -> dict:
                key_episode = server.gate.authenticate(self.headers.get("Authorization"))
                path = self.path.split("?", 1)[0].rstrip("/")
                if path not in routes:
                    raise RequestError(404, f"no route {self.path[:200]}", "not_found")
                episode = server.gate.episode(key_episode, self.headers.get("X-Session-ID"))
                request = self.read_json()
                if request.get("stream"):
                    raise RequestError(400, "stream=true is not supported", param="stream")
                if path == "/inference/v1/generate":
                    return server.generate_tokens(request, episode)
                return server.complete(request, episode)

            self._answer(post)

    return Handler
