"""An OpenAI-compatible ``/v1/chat/completions`` endpoint on the loopback interface, in front of
the HF rollout engine, recording the exact token ids and log-probs behind every response, so that
an agent written against the OpenAI client produces trajectories reinforge can train on.

    with CompletionServer(generator) as server:      # http://127.0.0.1:<port>/v1
        run_my_agent(base_url=server.url, api_key="unused")
    batch = server.rollout()                          # one row per conversation, token-in/token-out

Token-in/token-out across requests: a request whose messages begin with a conversation this server
already answered (the same messages and the assistant message it returned) continues that
conversation's token ids: the sampled tokens as they were sampled, then only the new messages'
tokens, rendered as the agent loop renders observations (reinforge/agents/render.py). Anything else
starts a new conversation from the chat template. Each request re-prefills its context (the
engine keeps no cache between HTTP calls).

Tool calls: the request's ``tools`` are shown as the agent loop shows them (the template's
``tools=``, else the fallback system prompt), and ``<tool_call>{json}</tool_call>`` in the sampled
text is returned as OpenAI ``tool_calls`` (``finish_reason: "tool_calls"``). Requests are served one
at a time (one engine).

Token-in/token-out for clients that render prompts themselves: ``POST /inference/v1/generate``
(the route vLLM's token-in/token-out server mounts, which ``verifiers``' training client calls)
takes ``token_ids`` and ``sampling_params`` (``temperature``, ``top_p``, ``max_tokens``,
``stop_token_ids``) and returns the sampled ids with their log-probs; every call is kept in
``server.generations``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from reinforge.agents.loop import pad_trajectories
from reinforge.agents.render import ChatRenderer
from reinforge.agents.tools import TOOL_CALL, parse_tool_calls
from reinforge.batch import RolloutBatch
from reinforge.rollout.base import SamplingParams


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


@dataclass
class Generation:
    """One ``/inference/v1/generate`` call: the ids it was given, the ids it sampled with their
    log-probs, and the client's ``X-Session-ID`` (verifiers sends its trace id)."""

    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    session_id: str | None = None


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
    """Serves ``/v1/chat/completions`` (and ``/v1/models``) on 127.0.0.1:``port`` (0: a free
    port) with an ``HFGenerator``. ``max_tokens``: the default and the cap of a response."""

    def __init__(self, generator, *, port: int = 0, max_tokens: int = 256, tool_format: str = "auto",
                 model_name: str = "reinforge-policy", max_model_len: int | None = None):
        self.generator = generator
        self.tokenizer = generator.tokenizer
        self.renderer = ChatRenderer(self.tokenizer, tool_format)
        self.max_tokens = max_tokens
        self.model_name = model_name
        if max_model_len is None:  # what the model's positions allow (clients check prompts against it)
            engine = getattr(generator, "engine", None)
            max_model_len = getattr(getattr(engine, "config", None), "max_position_embeddings", None)
        self.max_model_len = max_model_len
        self.conversations: list[Conversation] = []
        self.generations: list[Generation] = []
        self._by_key: dict[str, Conversation] = {}
        self._engine = threading.Lock()
        server = self
        self._http = ThreadingHTTPServer(("127.0.0.1", port), _handler(server))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/v1"

    def start(self) -> "CompletionServer":
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True, name="reinforge-openai")
        self._thread.start()
        return self

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()

    def __enter__(self) -> "CompletionServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- one request ----------------------------------------------------------------------------
    def complete(self, request: dict) -> dict:
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("'messages' must be a non-empty list of chat messages")
        tools = request.get("tools") or None
        n = int(request.get("n", 1))
        if n != 1:
            raise ValueError("n > 1 is not supported: send one request per sample")
        max_tokens = min(int(request.get("max_tokens") or request.get("max_completion_tokens") or self.max_tokens),
                         self.max_tokens)
        temperature = float(request.get("temperature", 1.0))
        params = SamplingParams(num_samples=1, temperature=max(temperature, 1e-6), top_p=float(request.get("top_p", 1.0)),
                                max_new_tokens=max_tokens, greedy=temperature == 0.0)
        keys = [_canonical(m) for m in messages]
        parent, cut = None, 0
        for k in range(len(keys), 0, -1):  # the longest answered conversation this one continues
            parent = self._by_key.get("\n".join(keys[:k]))
            if parent is not None:
                cut = k
                break
        with self._engine:
            if parent is not None:
                stop = self.tokenizer.decode(parent.token_ids[-1:]) if parent.token_ids else None
                obs = self.renderer.observation_ids([_plain(m) for m in messages[cut:]], stop)
                conv = Conversation(list(messages), list(parent.prompt_ids), parent.token_ids + obs,
                                    parent.action_mask + [False] * len(obs), parent.logprobs + [0.0] * len(obs))
                parent.extended = True
            else:
                conv = Conversation(list(messages), self.renderer.prompt_ids([_plain(m) for m in messages], tools))
            out = self.generator.generate([conv.prompt_ids + conv.token_ids], params)
        k = int(out.completion_mask[0].sum())
        sampled = out.completion_ids[0, :k].tolist()
        lps = out.sampler_logprobs[0, :k].tolist()
        conv.token_ids += sampled
        conv.action_mask += [True] * k
        conv.logprobs += lps
        text = self.tokenizer.decode(sampled, skip_special_tokens=True)
        calls = [c for c in parse_tool_calls(text) if c.error is None]
        message: dict = {"role": "assistant", "content": TOOL_CALL.sub("", text).strip() if calls else text}
        if calls:
            message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                                      "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                     for c in calls]
        finish = "length" if bool(out.truncated[0]) else ("tool_calls" if calls else "stop")
        conv.messages.append(message)
        self.conversations.append(conv)
        self._by_key["\n".join(keys + [_canonical(message)])] = conv
        choice = {"index": 0, "message": message, "finish_reason": finish}
        if request.get("logprobs"):
            choice["logprobs"] = {"content": [{"token": self.tokenizer.decode([t]), "logprob": lp}
                                              for t, lp in zip(sampled, lps)]}
        prompt_len = len(conv.prompt_ids) + len(conv.token_ids) - k
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:16]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": [choice],
                "usage": {"prompt_tokens": prompt_len, "completion_tokens": k, "total_tokens": prompt_len + k},
                # Not OpenAI's: the exact ids behind this response (vLLM's return_token_ids does the same).
                "prompt_token_ids": conv.prompt_ids + conv.token_ids[:-k] if k else conv.prompt_ids + conv.token_ids,
                "completion_token_ids": sampled}

    def generate_tokens(self, request: dict, session_id: str | None = None) -> dict:
        """``POST /inference/v1/generate``: sample a continuation of ``token_ids``. The stop ids
        are the model's EOS plus the request's ``stop_token_ids`` (as vLLM does); the stop token
        is returned with the sample (``finish_reason: "stop"``), else ``"length"``."""
        ids = request.get("token_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("'token_ids' must be a non-empty list of token ids")
        vocab = len(self.tokenizer)
        if any(t < 0 or t >= vocab for t in ids):
            raise ValueError(f"'token_ids' holds ids outside the vocabulary (0..{vocab - 1})")
        sp = request.get("sampling_params") or {}
        if not isinstance(sp, dict):
            raise ValueError("'sampling_params' must be an object")
        if int(sp.get("n", 1)) != 1:
            raise ValueError("n > 1 is not supported: send one request per sample")
        max_tokens = min(int(sp.get("max_tokens") or self.max_tokens), self.max_tokens)
        if self.max_model_len is not None:
            if len(ids) >= self.max_model_len:
                raise ValueError(f"the prompt has {len(ids)} tokens; max_model_len is {self.max_model_len}")
            max_tokens = min(max_tokens, self.max_model_len - len(ids))
        temperature = float(1.0 if sp.get("temperature") is None else sp["temperature"])
        top_p = float(1.0 if sp.get("top_p") is None else sp["top_p"])
        params = SamplingParams(num_samples=1, temperature=max(temperature, 1e-6), top_p=top_p,
                                max_new_tokens=max_tokens, greedy=temperature == 0.0)
        stops = {int(t) for t in sp.get("stop_token_ids") or []}
        with self._engine:
            # Per-request stop ids: the engine reads its stop set per call, and the lock keeps
            # every other caller out while it is widened.
            saved = self.generator.eos_ids
            self.generator.eos_ids = saved | stops
            try:
                out = self.generator.generate([list(ids)], params)
            finally:
                self.generator.eos_ids = saved
        k = int(out.completion_mask[0].sum())
        sampled = out.completion_ids[0, :k].tolist()
        lps = out.sampler_logprobs[0, :k].tolist()
        finish = "length" if bool(out.truncated[0]) else "stop"
        rid = f"gen-{uuid.uuid4().hex[:16]}"
        self.generations.append(Generation(rid, list(ids), sampled, lps, finish, session_id))
        # vLLM's form under return_tokens_as_token_ids; verifiers' client checks each entry's token.
        content = [{"logprob": lp, "token": f"token_id:{t}"} for t, lp in zip(sampled, lps)]
        return {"request_id": rid, "model": self.model_name, "prompt_token_ids": list(ids),
                "choices": [{"index": 0, "token_ids": sampled, "logprobs": {"content": content},
                             "finish_reason": finish}]}

    # -- what to train on -----------------------------------------------------------------------
    def finished(self) -> list[Conversation]:
        """The conversations no later request continued (whole trajectories), in order."""
        return [c for c in self.conversations if not c.extended]

    def rollout(self, conversations: list[Conversation] | None = None, group_index: torch.Tensor | None = None) -> RolloutBatch:
        """A RolloutBatch of ``conversations`` (default: ``finished()``), one row each, with the
        sampled tokens in the action mask and the rest as context."""
        convs = self.finished() if conversations is None else conversations
        n = len(convs)
        return RolloutBatch(**pad_trajectories(convs, self.generator.pad_id), truncated=torch.zeros(n, dtype=torch.bool),
                            group_index=torch.arange(n) if group_index is None else group_index,
                            texts=self.tokenizer.batch_decode([c.token_ids for c in convs], skip_special_tokens=True),
                            versions=torch.full((n,), self.generator.version, dtype=torch.long))


def _plain(message: dict) -> dict:
    """A client's message as the chat template takes it (tool calls shown as the model wrote them)."""
    out = {"role": message.get("role", "user"), "content": message.get("content") or ""}
    if message.get("tool_calls"):
        calls = "".join(f"<tool_call>{json.dumps({'name': c['function']['name'], 'arguments': _json_args(c['function'].get('arguments'))})}</tool_call>"
                        for c in message["tool_calls"])
        out["content"] = (out["content"] + calls).strip()
    return out


def _handler(server: CompletionServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _send(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                model = {"id": server.model_name, "object": "model"}
                if server.max_model_len is not None:  # vLLM's field: clients check prompt lengths with it
                    model["max_model_len"] = server.max_model_len
                self._send(200, {"object": "list", "data": [model]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})

        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if path not in ("/v1/chat/completions", "/inference/v1/generate"):
                self._send(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                return
            try:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if not isinstance(request, dict):
                    raise ValueError("the request body must be a JSON object")
                if request.get("stream"):
                    raise ValueError("stream=true is not supported")
                if path == "/inference/v1/generate":
                    self._send(200, server.generate_tokens(request, self.headers.get("X-Session-ID")))
                    return
                self._send(200, server.complete(request))
            except (ValueError, TypeError, KeyError) as err:
                self._send(400, {"error": {"message": str(err), "type": "invalid_request_error"}})

    return Handler
