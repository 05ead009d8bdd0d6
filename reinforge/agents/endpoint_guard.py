"""What guards the loopback model endpoint (reinforge/agents/server.py): who may call it, which
calls may become training rows, how much a caller may send, for how long, how many callers may be
connected at once, and which sampling parameters are accepted. Standard library only.

- ``Gate``: the run's secret (``secrets.token_urlsafe``), the episode keys derived from it
  (``<episode id>.<HMAC-SHA256 of the id>``) and the set of live episodes. Every request carries
  ``Authorization: Bearer <key>`` (the run secret or an episode key, compared in constant time);
  a request that would sample must belong to a live episode: its key's, or the one its
  ``X-Session-ID`` header names (with the run secret).
- ``BoundedHTTPServer``: at most ``max_connections`` connections at once (a thread each; one over
  the cap is answered 503 and closed from the accepting thread, with no thread), and a deadline
  per connection: its request (head and body) must arrive within ``io_timeout_s``, else a reaper
  thread shuts the socket (a stalled or dripping client cannot hold its thread).
- ``GuardedHandler``: the request head capped at ``MAX_HEAD_BYTES``; the body read only once the
  caller is authenticated and only with a ``Content-Length`` that is a non-negative integer no
  larger than the cap (411, 400, 413 otherwise, nothing read).
- ``number_param``: a sampling parameter checked finite and in its range (400 naming both).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import json
import logging
import math
import re
import secrets
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)

EPISODE_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
MAX_HEAD_BYTES = 64 * 1024  # request line and headers together
_DIGITS = re.compile(r"[0-9]{1,15}")


class RequestError(Exception):
    """A refused request: the HTTP status and the OpenAI-style error body's message, type, param."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def number_param(value, name: str, lo: float, hi: float, *, integer: bool = False, lo_open: bool = False):
    """``value`` as a float (an int with ``integer``) when it is a finite JSON number in
    [lo, hi] ((lo, hi] with ``lo_open``); else a 400 naming ``name`` and the range."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and isinstance(value, float):
        ok = math.isfinite(value) and (not integer or value.is_integer())
    if ok:
        ok = (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        what = "an integer" if integer else "a finite number"
        shown = f"{value!r}"[:40]
        raise RequestError(400, f"'{name}' must be {what} in {'(' if lo_open else '['}{_num(lo)}, {_num(hi)}]; "
                                f"got {shown}", param=name)
    return int(value) if integer else float(value)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


class Gate:
    """The run's secret, the episode keys made from it, and which episodes are live."""

    def __init__(self):
        self.secret = secrets.token_urlsafe(32)
        self._live: set[str] = set()
        self._lock = threading.Lock()

    def _mac(self, episode_id: str) -> str:
        digest = hmac.new(self.secret.encode(), episode_id.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def key(self, episode_id: str) -> str:
        """The API key of one episode: requests made with it belong to that episode."""
        return f"{episode_id}.{self._mac(episode_id)}"

    def open(self, episode_id: str) -> None:
        if not isinstance(episode_id, str) or not EPISODE_ID.fullmatch(episode_id):
            raise ValueError(f"an episode id is 1 to 128 of [A-Za-z0-9._:-]; got {episode_id!r}")
        with self._lock:
            self._live.add(episode_id)

    def close(self, episode_id: str) -> None:
        with self._lock:
            self._live.discard(episode_id)

    def live(self, episode_id: str | None) -> bool:
        with self._lock:
            return episode_id in self._live

    def authenticate(self, authorization: str | None) -> str | None:
        """The episode an episode key names, None for the run secret; a 401 for anything else."""
        scheme, _, token = (authorization or "").strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise RequestError(401, "this endpoint needs 'Authorization: Bearer <key>' (the key the run gave the "
                                    "environment)", "authentication_error")
        given = token.encode("utf-8", "replace")
        if hmac.compare_digest(given, self.secret.encode()):
            return None
        episode_id, dot, mac = token.rpartition(".")
        if dot and EPISODE_ID.fullmatch(episode_id) and hmac.compare_digest(mac.encode("utf-8", "replace"),
                                                                             self._mac(episode_id).encode()):
            return episode_id
        raise RequestError(401, "the API key is not this run's", "authentication_error")

    def episode(self, key_episode: str | None, session_id: str | None) -> str:
        """The live episode a request belongs to: its key's (``key_episode``, from
        ``authenticate``), else the one its ``X-Session-ID`` names; a 403 when none is live."""
        episode_id = key_episode or session_id
        if not episode_id:
            raise RequestError(403, "the request belongs to no episode: use an episode's key, or send "
                                    "'X-Session-ID: <episode id>' of a live episode", "no_live_episode")
        if not self.live(episode_id):
            raise RequestError(403, f"episode {episode_id[:128]!r} is not live (it finished, or was never opened): "
                                    "only a live episode's requests are served", "no_live_episode")
        return episode_id


class BoundedHTTPServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer with a cap on connections (threads) and a deadline per connection."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128  # the listen backlog: a flood is accepted (and refused) at once, not left to SYN retries

    def __init__(self, address, handler, *, max_connections: int, io_timeout_s: float):
        if max_connections < 1 or not io_timeout_s > 0:
            raise ValueError("max_connections must be >= 1 and io_timeout_s > 0")
        self.max_connections = int(max_connections)
        self.io_timeout_s = float(io_timeout_s)
        self.accepted_connections = 0  # given a thread
        self.refused_connections = 0  # over the cap
        self.expired_connections = 0  # shut by the reaper, past their deadline
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self._deadlines: dict[socket.socket, float | None] = {}
        self._guard = threading.Condition()
        self._stopping = False
        super().__init__(address, handler)
        self._reaper = threading.Thread(target=self._reap, daemon=True, name="reinforge-openai-reaper")
        self._reaper.start()

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.refused_connections += 1
            _refuse(request)
            return
        self.accepted_connections += 1
        self.set_deadline(request, self.io_timeout_s)
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._done(request)
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done(request)

    def _done(self, request) -> None:
        with self._guard:
            self._deadlines.pop(request, None)
        self._slots.release()

    def set_deadline(self, request, seconds: float | None) -> None:
        """The connection is shut ``seconds`` from now unless this is called again (None: no
        deadline, while the engine works on its request)."""
        with self._guard:
            self._deadlines[request] = None if seconds is None else time.monotonic() + seconds
            self._guard.notify()

    def _reap(self) -> None:
        with self._guard:
            while not self._stopping:
                now = time.monotonic()
                due = [s for s, d in self._deadlines.items() if d is not None and d <= now]
                for sock in due:
                    self._deadlines[sock] = None
                    self.expired_connections += 1
                    _shut(sock)
                nxt = min((d for d in self._deadlines.values() if d is not None), default=None)
                self._guard.wait(None if nxt is None else max(nxt - now, 0.01))

    def server_close(self) -> None:
        with self._guard:
            self._stopping = True
            for sock in self._deadlines:  # wake every handler still reading
                _shut(sock)
            self._guard.notify()
        super().server_close()

    def handle_error(self, request, client_address) -> None:
        log.debug("loopback endpoint: a connection from %s failed", client_address, exc_info=True)


def _shut(sock) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _refuse(request) -> None:
    """503 to a connection over the cap, written without blocking, then closed."""
    data = json.dumps(RequestError(503, "too many connections to the loopback endpoint; retry later",
                                   "server_busy").body()).encode()
    try:
        request.setblocking(False)
        request.send(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
                     b"Retry-After: 1\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
    except OSError:
        pass
    _shut(request)
    request.close()


class _HeadReader:
    """The handler's ``rfile`` with the request head (line and headers) capped at ``left``
    bytes; ``left = None`` once the head is read (the body is bounded by its Content-Length)."""

    def __init__(self, f, left: int):
        self.f, self.left = f, left

    def readline(self, size: int = -1) -> bytes:
        if self.left is None:
            return self.f.readline(size)
        if self.left <= 0:
            raise http.client.LineTooLong("request head")  # parse_request answers 431
        size = self.left if size is None or size < 0 else min(size, self.left)
        line = self.f.readline(size)
        self.left -= len(line)
        return line

    def __getattr__(self, name):
        return getattr(self.f, name)


class GuardedHandler(BaseHTTPRequestHandler):
    """A handler whose subclasses call ``read_json`` for the body and ``send_json`` to answer."""

    max_body_bytes = 8 << 20

    def setup(self) -> None:
        self.timeout = self.server.io_timeout_s  # each read and write on the socket, too
        super().setup()
        self.rfile = _HeadReader(self.rfile, MAX_HEAD_BYTES)

    def log_message(self, *args) -> None:  # quiet
        pass

    def send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.server.set_deadline(self.request, self.server.io_timeout_s)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Bearer realm="reinforge"')
        self.end_headers()
        self.wfile.write(data)

    def read_json(self) -> dict:
        """The body as a JSON object, read only with a valid Content-Length of at most
        ``max_body_bytes``; the connection's deadline is lifted once it is read."""
        self.rfile.left = None
        if self.headers.get("Transfer-Encoding"):
            raise RequestError(411, "chunked bodies are not accepted: send a Content-Length")
        lengths = self.headers.get_all("Content-Length") or []
        if not lengths:
            raise RequestError(411, "a Content-Length header is required")
        if len(set(lengths)) != 1 or not _DIGITS.fullmatch(lengths[0].strip()):
            raise RequestError(400, f"Content-Length must be one non-negative integer; got {', '.join(lengths)[:60]!r}")
        n = int(lengths[0])
        if n > self.max_body_bytes:
            raise RequestError(413, f"the body is {n} bytes; this endpoint accepts at most {self.max_body_bytes}")
        data = self.rfile.read(n)
        if len(data) != n:
            raise RequestError(400, f"the body ended after {len(data)} of its {n} bytes")
        self.server.set_deadline(self.request, None)
        try:
            request = json.loads(data or b"{}")
        except (ValueError, RecursionError) as err:
            raise RequestError(400, f"the body is not JSON ({type(err).__name__}: {str(err)[:200]})") from None
        if not isinstance(request, dict):
            raise RequestError(400, "the request body must be a JSON object")
        return request
