"""The HTTP endpoint of a long-running process: ``/metrics``, ``/status``, ``/status.json``, ``/healthz``.

A process may add read-only JSON routes (:meth:`StatusServer.add_route`): the stream
job answers interactive queries of its snapshots under ``/snapshots``.

One asyncio event loop on a daemon thread speaks HTTP/1.1 (GET only, see
:class:`_Connection`) with persistent connections: a client that keeps its connection open (every HTTP
client library pools them) costs no TCP handshake and no thread per request,
and the process's other threads (the stream job's driver) compete for the GIL
with one thread, not one per connection. A route's ``fast`` answer (microseconds:
a dict look-up, a memory-mapped file) runs on the loop; ``/status`` and
``/metrics``, which may gather from Kafka, and answers that read files run on a
small thread pool, so that a slow one never delays the others.

The status page sits next to the metrics so one port serves both (Kubernetes
probes use ``/healthz``).

It binds ``127.0.0.1`` unless told otherwise: the page shows topics, positions and
error texts. Binding any other address needs a bearer token (RFC 6750): every
request but ``/healthz`` must then carry ``Authorization: Bearer <token>`` (compared
in constant time), else it gets ``401``. Every string of the status document goes
through the log redaction (:func:`kernel.redact.redact_document`) before it is
served.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from kernel.config.endpoints import is_loopback
from kernel.exceptions import ConfigError
from kernel.redact import redact_document
from kernel.status.page import render_page

log = logging.getLogger(__name__)

StatusFn = Callable[[], dict[str, Any]]
RouteFn = Callable[[str, dict[str, list[str]]], tuple[int, Any]]
"""``(path, query parameters) -> (HTTP status, JSON document)``: a read-only route a process adds."""
FastRouteFn = Callable[[str, dict[str, list[str]]], tuple[int, Any] | None]
"""A route's answer when it takes microseconds (run on the event loop), ``None`` when it would not."""

LOOPBACK = "127.0.0.1"
"""The default address of every status and metrics endpoint."""


def require_token_off_loopback(addr: str, token: str | None, option: str) -> None:
    """Refuse to serve on a non-loopback ``addr`` without a bearer token.

    Args:
        addr: the address to bind.
        token: the bearer token (``None`` or empty: none).
        option: what sets the token, for the message (``metrics_token``, ``$THREES_METRICS_TOKEN``).

    Raises:
        ConfigError: ``addr`` is not a loopback address and there is no token.
    """
    if not is_loopback(addr) and not token:
        raise ConfigError(
            f"the status and metrics endpoint would bind {addr} without authentication: set {option} "
            f"(clients then send 'Authorization: Bearer <token>'), or bind {LOOPBACK}"
        )


# the listen backlog: a burst of new clients (interactive queries) must not wait for SYN retries (1 s, 3 s...)
_BACKLOG = 1024
_MAX_REQUEST_BYTES = 64 * 1024  # a GET's line and headers; a larger head gets 413


class _Response:
    """One answer: status, content type, body."""

    __slots__ = ("code", "ctype", "body", "extra")

    def __init__(self, code: int, ctype: str, body: bytes, extra: tuple[tuple[bytes, bytes], ...] = ()):
        self.code, self.ctype, self.body, self.extra = code, ctype, body, extra


_REASONS = {200: b"OK", 400: b"Bad Request", 401: b"Unauthorized", 404: b"Not Found", 405: b"Method Not Allowed",
            413: b"Content Too Large", 500: b"Internal Server Error", 503: b"Service Unavailable"}


class _Connection(asyncio.Protocol):
    """One client connection: GET requests parsed as they arrive, answered in order (HTTP/1.1 keep-alive, pipelining).

    The server answers ``GET`` without a body and nothing else, so the parser is the few
    lines of RFC 9112 that takes: a request line, header lines up to the empty line, the
    connection's persistence (HTTP/1.1: kept unless ``Connection: close``; HTTP/1.0:
    closed unless ``keep-alive``). A request with a body (``Content-Length`` other than 0,
    or ``Transfer-Encoding``), a malformed line or a head over 64 KiB gets ``400``/``413``
    and the connection is closed. h11, a complete HTTP/1.1 state machine, was tried first:
    it took ~350 us per request on the shared 2-core machine at load ~15 (this parser and
    the answer together ~190 us there), and at 1,000 interactive queries/s that alone was a
    third of a core.
    """

    def __init__(self, server: StatusServer):
        self.server = server
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False  # an answer is being computed off the loop: parse nothing more until it is written
        self.keep = True  # keep the connection after the current answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.server._clients.add(self.transport)  # type: ignore[arg-type]
        sock = transport.get_extra_info("socket")
        if sock is not None:  # small answers: no Nagle delay waiting for the client's delayed ACK
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if self.busy and len(self.buffer) > 16 * _MAX_REQUEST_BYTES and self.transport is not None:
            self.transport.pause_reading()  # pipelined requests behind a slow answer: backpressure, not memory
        self._next()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.server._clients.discard(self.transport)
        self.transport = None

    def _next(self) -> None:
        while not self.busy and self.transport is not None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0 or end > _MAX_REQUEST_BYTES:  # a head over the limit, whether it came in one read or many
                if end > _MAX_REQUEST_BYTES or len(self.buffer) > _MAX_REQUEST_BYTES:
                    self._fail(413)
                return
            head, self.buffer = self.buffer[:end], self.buffer[end + 4 :]
            lines = head.split(b"\r\n")
            parts = lines[0].split(b" ")
            if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
                self._fail(400)
                return
            method, target, version = parts
            authorization, connection, body = b"", b"", False
            for line in lines[1:]:
                name, sep, value = line.partition(b":")
                if not sep:
                    self._fail(400)
                    return
                name, value = name.strip().lower(), value.strip()
                if name == b"authorization":
                    authorization = value
                elif name == b"connection":
                    connection = value.lower()
                elif name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
                    body = True
            if body:  # never read: the stream's framing is unknown from here on
                self._fail(400)
                return
            self.keep = b"close" not in connection if version == b"HTTP/1.1" else b"keep-alive" in connection
            self._request(method, target.decode("latin-1"), authorization)
            if not self.keep:
                return

    def _request(self, method: bytes, target: str, authorization: bytes) -> None:
        answer = self.server._answer_now(method, target, authorization)
        if answer is not None:
            self._write(answer)
            return
        self.busy = True  # answered on the pool: later requests of this connection wait their turn
        loop = asyncio.get_running_loop()
        future = loop.run_in_executor(self.server._pool, self.server._answer_slow, target)
        future.add_done_callback(self._written_later)

    def _written_later(self, future: asyncio.Future[_Response]) -> None:
        self.busy = False
        self._write(future.result())
        self._next()
        if self.transport is not None and not self.transport.is_reading():
            self.transport.resume_reading()

    def _write(self, answer: _Response) -> None:
        if self.transport is None:
            return
        head = [b"HTTP/1.1 %d %s" % (answer.code, _REASONS.get(answer.code, b"")),
                b"Content-Type: " + answer.ctype.encode(), b"Content-Length: %d" % len(answer.body),
                b"Cache-Control: no-store"]
        head += [name + b": " + value for name, value in answer.extra]
        if not self.keep:
            head.append(b"Connection: close")
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + answer.body)
        if not self.keep:
            self.transport.close()

    def _fail(self, status: int) -> None:
        self.keep = False
        self._write(_Response(status, "text/plain", f"bad request ({status})\n".encode()))


class StatusServer:
    """Serve a registry's metrics and a status document over HTTP.

    Args:
        status: returns the status document (:mod:`kernel.status.document`), called per request.
        registry: the Prometheus registry of ``/metrics`` (default: the process's global one).
        title: the page's title.
        refresh_s: how often the page reloads itself, seconds (``<meta http-equiv="refresh">``).

    Endpoints:
        ``/metrics`` Prometheus text format; ``/status`` HTML (no JavaScript);
        ``/status.json`` the document; ``/healthz`` ``200 ok`` while the process serves.
    """

    def __init__(self, status: StatusFn, registry: CollectorRegistry | None = None, *, title: str = "threes",
                 refresh_s: int = 5):
        self.status = status
        self.registry = registry or REGISTRY
        self.title = title
        self.refresh_s = refresh_s
        self.routes: dict[str, tuple[RouteFn, FastRouteFn | None]] = {}
        self._expected: bytes | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._listener: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._bound: tuple[str, int] | None = None
        self._clients: set[asyncio.Transport] = set()  # open connections (closed by close())

    def add_route(self, prefix: str, route: RouteFn, *, fast: FastRouteFn | None = None) -> None:
        """Answer ``GET`` requests under ``prefix`` (e.g. ``/snapshots``) with ``route`` (JSON).

        The process registers what it can answer (the stream job: interactive queries of its
        snapshots) without this framework knowing it. A route's exception is a ``500`` with its
        class name only: no traceback reaches the client.

        Args:
            prefix: the path prefix.
            route: ``(path, query parameters) -> (HTTP status, JSON document)``.
            fast: the same answer when it takes microseconds and blocks on nothing (no file
                read, no lock a slow thread holds), else ``None``: it runs on the server's event
                loop, with no hand-off to a thread; ``route`` runs on the server's thread pool
                when there is no ``fast`` or it returns ``None``.
        """
        self.routes[prefix.rstrip("/")] = (route, fast)

    def serve(self, port: int, addr: str = LOOPBACK, token: str | None = None) -> int:
        """Start serving on a daemon thread; returns the bound port (``0`` picks a free one).

        Args:
            port: TCP port.
            addr: the address to bind (default loopback only).
            token: a bearer token every request but ``/healthz`` must carry; required when
                ``addr`` is not a loopback address.

        Raises:
            OSError: the port is taken.
            ConfigError: ``addr`` is not loopback and there is no token.
        """
        require_token_off_loopback(addr, token, "a bearer token")
        self._expected = f"Bearer {token}".encode() if token else None
        # bound here, in the caller's thread, so that a taken port raises OSError to the caller
        sock = socket.create_server((addr, port), backlog=_BACKLOG, reuse_port=False)
        sock.setblocking(False)
        loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(4, thread_name_prefix=f"status-http-{port}")
        listening = loop.run_until_complete(loop.create_server(lambda: _Connection(self), sock=sock))
        self._loop, self._listener = loop, listening
        host, bound = sock.getsockname()[:2]
        self._bound = (str(host), int(bound))
        self._thread = threading.Thread(target=loop.run_forever, name=f"status-http-{bound}", daemon=True)
        self._thread.start()
        log.info("status and metrics on http://%s:%d/status (/status.json, /metrics)%s", addr, bound,
                 " (bearer token required)" if token else "")
        return int(bound)

    # -- answering (on the loop: _answer_now; on the pool: _answer_slow) --------------------------

    def _answer_now(self, method: bytes, target: str, authorization: bytes) -> _Response | None:
        """The answer when it is cheap (refusals, ``/healthz``, inline routes); ``None``: compute on the pool."""
        path = target.split("?", 1)[0]
        if method != b"GET":
            return _Response(405, "text/plain", b"read-only: GET only\n", ((b"allow", b"GET"),))
        if self._expected is not None and path != "/healthz":
            # constant time: no timing oracle on the token
            if not hmac.compare_digest(authorization, self._expected):
                return _Response(401, "text/plain", b"", ((b"www-authenticate", b'Bearer realm="threes"'),))
        if path == "/healthz":
            return _Response(200, "text/plain", b"ok\n")
        found = self._route(path)
        if found is not None and found[1] is not None:
            return self._run_route(found[1], path, target)
        return None

    def _answer_slow(self, target: str) -> _Response:
        path = target.split("?", 1)[0]
        try:
            if path == "/metrics":
                return _Response(200, CONTENT_TYPE_LATEST, generate_latest(self.registry))
            if path in ("/status.json", "/status/json"):
                body = json.dumps(redact_document(self.status()), default=str, indent=1).encode()
                return _Response(200, "application/json", body)
            if path in ("/", "/status"):
                doc = redact_document(self.status())
                html = render_page(doc, title=self.title, refresh_s=self.refresh_s)
                return _Response(200, "text/html; charset=utf-8", html.encode())
        except Exception as exc:  # a broken status must not kill the server
            log.warning("status endpoint %s failed: %s", path, exc)
            return _Response(500, "text/plain", f"status unavailable: {type(exc).__name__}\n".encode())
        found = self._route(path)
        answer = None if found is None else self._run_route(found[0], path, target)
        if answer is not None:
            return answer
        return _Response(404, "text/plain", b"not found: try /status, /status.json or /metrics\n")

    def _run_route(self, route: FastRouteFn, path: str, target: str) -> _Response | None:
        try:
            query = parse_qs(urlsplit(target).query, keep_blank_values=True) if "?" in target else {}
            answer = route(path, query)
            if answer is None:
                return None
            code, doc = answer
            body = doc if isinstance(doc, bytes) else orjson.dumps(doc, default=str)
            return _Response(code, "application/json", body)
        except Exception as exc:  # a broken route must not kill the server
            log.warning("route %s failed: %s", path, exc)
            return _Response(500, "text/plain", f"unavailable: {type(exc).__name__}\n".encode())

    def _route(self, path: str) -> tuple[RouteFn, FastRouteFn | None] | None:
        for prefix, found in self.routes.items():
            if path == prefix or path.startswith(prefix + "/"):
                return found
        return None

    @property
    def address(self) -> tuple[str, int] | None:
        """The bound ``(address, port)``, ``None`` when not serving."""
        return self._bound

    def close(self) -> None:
        """Stop serving: the listening socket and every open connection are closed."""
        loop, listener = self._loop, self._listener
        if loop is None or listener is None:
            return

        async def stop() -> None:
            listener.close()
            for transport in list(self._clients):  # idle keep-alive connections too
                transport.close()
            await listener.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        loop.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
        self._loop = self._listener = self._thread = self._pool = None
        self._bound = None
