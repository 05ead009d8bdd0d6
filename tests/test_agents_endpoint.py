"""What protects the loopback model endpoint (reinforge/agents/server.py, endpoint_guard.py): the
run's key on every route, rows only from live episodes, bounded bodies, connections, time, prompt
lengths, and validated sampling parameters. A real server on 127.0.0.1, real sockets, the tiny
model."""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from reinforge.agents.server import CompletionServer
from reinforge.rollout import HFGenerator

from conftest import eos_biased_model, make_tokenizer

CHAT = "/v1/chat/completions"
GENERATE = "/inference/v1/generate"
HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def parts():
    tok = make_tokenizer()
    return tok, eos_biased_model(tok, bias=3.0)


def _server(parts, **kw) -> CompletionServer:
    """A started server whose ``generator.calls`` counts the requests that reach its engine (the
    batching engine, or ``generator.generate`` with ``batching=False``)."""
    tok, model = parts
    kw.setdefault("max_tokens", 6)
    server = CompletionServer(HFGenerator(model, tok), **kw)
    server.generator.calls = 0
    run = server._run

    def counted(*a, **k):
        server.generator.calls += 1
        return run(*a, **k)

    server._run = counted
    return server.start()


def call(server, path, body=None, *, key=None, session=None, method="POST", raw: bytes | None = None):
    """(status, JSON body) of one request; ``key``: the bearer token (None: no header)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if session is not None:
        headers["X-Session-ID"] = session
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    root = server.url[: -len("/v1")]
    req = urllib.request.Request(root + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def raw_exchange(server, data: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """What the server answers to ``data`` sent on a fresh socket, and how long it took."""
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", server._http.server_address[1])) as s:
        s.settimeout(timeout)
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    return out, time.perf_counter() - t0


def test_every_route_needs_the_runs_key_and_a_refused_request_reaches_nothing(parts):
    server = _server(parts)
    other = _server(parts)
    try:
        ep = server.open_episode()
        foreign = other.open_episode(ep.id)  # the same episode id, another run's key
        for key in (None, "", "unused", "EMPTY", server.api_key[:-1], foreign.api_key, other.api_key,
                    f"{ep.id}.{'A' * 43}"):
            for path, body, method in ((CHAT, {"messages": HI}, "POST"), (GENERATE, {"token_ids": [5, 6]}, "POST"),
                                       ("/v1/models", None, "GET"), ("/v1/nothing", {}, "POST")):
                status, err = call(server, path, body, key=key, session=ep.id, method=method)
                assert status == 401 and err["error"]["type"] == "authentication_error", (key, path, status)
        assert server.generator.calls == 0 and server.conversations == [] and server.generations == []
        # A plain "Basic" scheme, or the key in another header, is no key either.
        req = urllib.request.Request(server.url + "/models", headers={"Authorization": f"Basic {server.api_key}",
                                                                      "X-Api-Key": server.api_key})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(req, timeout=30)
        assert err.value.code == 401 and err.value.headers["WWW-Authenticate"].startswith("Bearer")
        # The run's key and an episode's key both open every route.
        assert call(server, "/v1/models", key=server.api_key, method="GET")[0] == 200
        assert call(server, "/v1/models", key=ep.api_key, method="GET")[0] == 200
        assert call(server, CHAT, {"messages": HI}, key=ep.api_key)[0] == 200
        assert call(server, GENERATE, {"token_ids": [5, 6]}, key=server.api_key, session=ep.id)[0] == 200
        assert server.generator.calls == 2
    finally:
        server.close()
        other.close()


def test_only_a_live_episodes_requests_become_rows(parts):
    server = _server(parts)
    try:
        # The run's key without an episode, or naming one never opened: refused before the engine.
        for session in (None, "made-up", "../../etc"):
            for path, body in ((CHAT, {"messages": HI}), (GENERATE, {"token_ids": [5, 6]})):
                status, err = call(server, path, body, key=server.api_key, session=session)
                assert status == 403 and err["error"]["type"] == "no_live_episode", (session, path)
        assert server.generator.calls == 0
        with server.episode() as a:
            status, r = call(server, CHAT, {"messages": HI}, key=a.api_key)
            assert status == 200
            reply = r["choices"][0]["message"]
            # Another live episode sends a's conversation on: it starts its own, a's row stays whole.
            with server.episode("b") as b:
                status, _ = call(server, CHAT, {"messages": HI + [reply, {"role": "user", "content": "go on"}]},
                                 key=b.api_key)
                assert status == 200
            assert [c.episode for c in server.finished()] == [a.id, "b"]
            assert server.finished(a.id)[0].token_ids == r["completion_token_ids"]
        # Both finished: their keys and ids no longer sample, and nothing more is recorded.
        rows, calls = len(server.conversations), server.generator.calls
        for key, session in ((a.api_key, None), (server.api_key, a.id), (b.api_key, None), (server.api_key, "b")):
            status, err = call(server, CHAT, {"messages": HI}, key=key, session=session)
            assert status == 403 and "not live" in err["error"]["message"]
            assert call(server, GENERATE, {"token_ids": [5]}, key=key, session=session)[0] == 403
        assert (len(server.conversations), server.generator.calls, server.generations) == (rows, calls, [])
        assert len(server.rollout()) == 2
    finally:
        server.close()


def test_a_request_that_outlives_its_episode_is_not_recorded(parts):
    server = _server(parts)
    try:
        ep = server.open_episode()
        real = server._run

        def slow(*a, **k):  # the episode ends while the engine works on its request
            server.close_episode(ep.id)
            return real(*a, **k)

        server._run = slow
        status, err = call(server, GENERATE, {"token_ids": [5, 6]}, key=ep.api_key)
        assert status == 403 and "finished while this request ran" in err["error"]["message"]
        assert server.generations == [] and server.conversations == []
    finally:
        server.close()


def _head(path: str, *lines: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\n" + "".join(f"{line}\r\n" for line in lines) + "\r\n").encode()


def test_bodies_are_bounded_and_refused_without_being_read(parts):
    server = _server(parts, max_body_bytes=1 << 20)
    try:
        ep = server.open_episode()
        auth = f"Authorization: Bearer {ep.api_key}"
        cases = {
            "Content-Length: 300000000": b"HTTP/1.0 413",  # the red team's 300 MB, announced only
            "Content-Length: -1": b"HTTP/1.0 400",
            "Content-Length: 12abc": b"HTTP/1.0 400",
            "Content-Length: 1e9": b"HTTP/1.0 400",
            "Transfer-Encoding: chunked": b"HTTP/1.0 411",
            "X-Nothing: 1": b"HTTP/1.0 411",  # no Content-Length
        }
        for line, expected in cases.items():
            out, took = raw_exchange(server, _head(CHAT, auth, line) + b'{"messages": []}')
            assert out.startswith(expected), (line, out[:80])
            assert took < 2.0, (line, took)  # answered at once: the server never waited for the body
        # Without the key, even a body of the right size is not read (401 first).
        out, took = raw_exchange(server, _head(CHAT, "Content-Length: 300000000") + b"{}")
        assert out.startswith(b"HTTP/1.0 401") and took < 2.0
        # Two Content-Lengths that disagree: refused.
        out, _ = raw_exchange(server, _head(CHAT, auth, "Content-Length: 2", "Content-Length: 3") + b"{}")
        assert out.startswith(b"HTTP/1.0 400")
        # A head past 64 KiB (many long headers) is refused with 431.
        out, _ = raw_exchange(server, _head(CHAT, auth, *[f"X-Pad-{i}: {'p' * 8000}" for i in range(10)]))
        assert out.startswith(b"HTTP/1.0 431")
        # Not JSON, or JSON that is not an object.
        for body in (b"{", b"[1, 2]", b"[" * 100_000):
            out, _ = raw_exchange(server, _head(CHAT, auth, f"Content-Length: {len(body)}") + body)
            assert out.startswith(b"HTTP/1.0 400"), out[:80]
        assert server.generator.calls == 0
    finally:
        server.close()


def test_stalled_connections_hold_no_more_threads_than_the_cap_and_are_dropped(parts):
    # With room (the default cap, 64): 50 silent connections, and an honest request still passes.
    server = _server(parts)
    base = threading.active_count()
    silent = [socket.create_connection(("127.0.0.1", server._http.server_address[1])) for _ in range(50)]
    try:
        ep = server.open_episode()
        time.sleep(0.5)
        assert threading.active_count() - base <= 50
        assert call(server, CHAT, {"messages": HI}, key=ep.api_key)[0] == 200
    finally:
        for s in silent:
            s.close()
        server.close()
    # Over the cap: the red team's 200 stalled connections hold 8 threads, not 200; the rest are
    # answered 503 from the accepting thread; the 8 are shut when their 1 s deadline passes, even
    # one that drips a byte at a time; then honest requests pass again.
    server = _server(parts, max_connections=8, io_timeout_s=1.0)
    base = threading.active_count()
    port = server._http.server_address[1]
    try:
        ep = server.open_episode()
        drip = socket.create_connection(("127.0.0.1", port))
        stalled = [socket.create_connection(("127.0.0.1", port)) for _ in range(199)]
        drip.settimeout(0.25)
        t0, dropped, most = time.perf_counter(), None, 0
        while time.perf_counter() - t0 < 20.0:
            most = max(most, threading.active_count() - base)
            if dropped is None:
                try:
                    drip.sendall(b"P")
                    if drip.recv(1) == b"":
                        dropped = time.perf_counter() - t0
                except socket.timeout:
                    pass
                except OSError:
                    dropped = time.perf_counter() - t0
            http = server._http
            if dropped is not None and http.refused_connections + http.accepted_connections >= 200:
                break
            time.sleep(0.05)
        assert most <= 8  # never more threads than the cap
        assert dropped is not None and dropped < 3.0  # its deadline, though each byte came in time
        assert server._http.refused_connections + server._http.accepted_connections == 200
        assert server._http.expired_connections >= 1
        told = 0
        for s in stalled:
            s.settimeout(3.0)
            try:
                told += s.recv(200).startswith(b"HTTP/1.0 503")  # refused, and told why
            except (socket.timeout, ConnectionResetError):
                pass
        assert told == server._http.refused_connections >= 150
        time.sleep(0.2)
        assert threading.active_count() - base <= 1
        assert call(server, CHAT, {"messages": HI}, key=ep.api_key)[0] == 200
        for s in stalled:
            s.close()
        drip.close()
    finally:
        server.close()


def test_prompt_length_is_checked_on_every_route(parts):
    server = _server(parts, max_model_len=300)
    try:
        ep = server.open_episode()
        long_chat = [{"role": "user", "content": "a" * 2000}]  # ~2,000 tokens with a character tokenizer
        status, err = call(server, CHAT, {"messages": long_chat}, key=ep.api_key)
        assert status == 400 and err["error"]["param"] == "messages"
        assert "max_model_len is 300" in err["error"]["message"] and "has 20" in err["error"]["message"]
        status, err = call(server, GENERATE, {"token_ids": [5] * 300}, key=ep.api_key)
        assert status == 400 and "300 tokens; max_model_len is 300" in err["error"]["message"]
        assert server.generator.calls == 0
        # Just under the limit: the response is cut to what is left of it.
        status, r = call(server, GENERATE, {"token_ids": [5] * 298, "sampling_params": {"max_tokens": 6,
                                                                                        "temperature": 0}},
                         key=ep.api_key)
        assert status == 200 and len(r["choices"][0]["token_ids"]) <= 2
        status, models = call(server, "/v1/models", key=ep.api_key, method="GET")
        assert models["data"][0]["max_model_len"] == 300
    finally:
        server.close()


BAD_SAMPLING = [
    ("temperature", math.nan, "[0, 100]"), ("temperature", math.inf, "[0, 100]"), ("temperature", -0.5, "[0, 100]"),
    ("temperature", 1e9, "[0, 100]"), ("temperature", "1", "[0, 100]"), ("temperature", True, "[0, 100]"),
    ("top_p", 0, "(0, 1]"), ("top_p", 1.5, "(0, 1]"), ("top_p", -math.inf, "(0, 1]"), ("top_p", math.nan, "(0, 1]"),
    ("max_tokens", 0, "[1, 1048576]"), ("max_tokens", -5, "[1, 1048576]"), ("max_tokens", 10**12, "[1, 1048576]"),
    ("max_tokens", 2.5, "[1, 1048576]"), ("max_tokens", "10", "[1, 1048576]"), ("max_tokens", math.nan, "[1, 1048576]"),
    ("n", 2, "n > 1"), ("n", math.nan, "'n'"),
]


@pytest.mark.parametrize("route", ["chat", "generate"])
def test_sampling_parameters_are_validated(parts, route):
    server = _server(parts)
    try:
        ep = server.open_episode()
        for name, value, shown in BAD_SAMPLING:
            if route == "chat":
                body = {"messages": HI, name: value}
            else:
                body = {"token_ids": [5, 6], "sampling_params": {name: value}}
            status, err = call(server, CHAT if route == "chat" else GENERATE, key=ep.api_key,
                               raw=json.dumps(body).encode())  # NaN and Infinity as Python's json writes them
            assert status == 400, (name, value, status)
            assert err["error"]["param"] == name and shown in err["error"]["message"], err
        if route == "generate":
            for stops in ([10**6], [-1], ["a"], list(range(2000)), 5):
                body = {"token_ids": [5, 6], "sampling_params": {"stop_token_ids": stops}}
                status, err = call(server, GENERATE, body, key=ep.api_key)
                assert status == 400 and err["error"]["param"] == "stop_token_ids", stops
        assert server.generator.calls == 0 and server.conversations == [] and server.generations == []
        for ok in ({"temperature": 0}, {"temperature": 0.7, "top_p": 0.9, "max_tokens": 3}, {"max_tokens": 4096},
                   {"temperature": None, "top_p": None}):
            body = {"messages": HI, **ok} if route == "chat" else {"token_ids": [5, 6], "sampling_params": ok}
            assert call(server, CHAT if route == "chat" else GENERATE, body, key=ep.api_key)[0] == 200, ok
    finally:
        server.close()


@pytest.mark.skipif(not hasattr(os, "fork") or os.geteuid() != 0, reason="needs root to act as another user")
def test_another_local_user_is_refused_and_cannot_read_the_key_from_the_environment(parts):
    """uid 65534 (nobody), as the red team called: without the key it is answered 401; the key
    given to verifiers through the trainer's environment is not readable from /proc by it."""
    server = _server(parts)
    os.environ["REINFORGE_TEST_ENDPOINT_API_KEY"] = server.api_key
    try:
        ep = server.open_episode()
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: another user, who knows the port and the episode id but not the key
            out = {}
            try:
                os.setgid(65534)
                os.setuid(65534)
                for key in (None, "EMPTY"):
                    out[str(key)] = call(server, CHAT, {"messages": HI}, key=key, session=ep.id)[0]
                try:
                    with open(f"/proc/{os.getppid()}/environ", "rb") as f:
                        out["environ"] = "readable" if server.api_key.encode() in f.read() else "no key"
                except OSError as err:
                    out["environ"] = type(err).__name__
            except BaseException as err:  # noqa: BLE001 - reported to the parent
                out["error"] = repr(err)
            os.write(write_fd, json.dumps(out).encode())
            os._exit(0)
        os.close(write_fd)
        os.waitpid(pid, 0)
        with os.fdopen(read_fd) as f:
            out = json.loads(f.read())
        assert out == {"None": 401, "EMPTY": 401, "environ": "PermissionError"}, out
        assert server.generator.calls == 0 and server.conversations == []
    finally:
        os.environ.pop("REINFORGE_TEST_ENDPOINT_API_KEY", None)
        server.close()
