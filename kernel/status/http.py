"""The HTTP endpoint of a long-running process: ``/metrics``, ``/status``, ``/status.json``, ``/healthz``, ``/readyz``.

A process may add read-only JSON routes (:meth:`StatusServer.add_route`): the stream
job answers interactive queries of its snapshots under ``/snapshots``; and
state-changing routes (:meth:`StatusServer.add_action`): ``threes run``'s management API.

One asyncio event loop on a daemon thread speaks HTTP/1.1 (:mod:`kernel.status.wire`)
with persistent connections: a client that keeps its connection open (every HTTP
client library pools them) costs no TCP handshake and no thread per request,
and the process's other threads (the stream job's driver) compete for the GIL
with one thread, not one per connection. A route's ``fast`` answer (microseconds:
a dict look-up, a memory-mapped file) runs on the loop; ``/status`` and
``/metrics``, which may gather from Kafka, answers that read files and actions run on a
small thread pool, so that a slow one never delays the others.

The status page sits next to the metrics so one port serves both (Kubernetes
probes use ``/healthz`` and ``/readyz``, which answer ``ok`` and nothing else).

It binds ``127.0.0.1`` unless told otherwise: the page shows topics, positions and
error texts. Binding any other address needs a bearer token (RFC 6750): every
request but ``/healthz`` and ``/readyz`` must then carry ``Authorization: Bearer <token>``
(compared in constant time), else it gets ``401``; a state-changing request is guarded
even on loopback (:mod:`kernel.status.guard`). Refusals are JSON, ``{"error": ...}``.
Every string of the status document goes through the log redaction
(:func:`kernel.redact.redact_document`) before it is served.
"""

from __future__ import annotations

import asyncio
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
from kernel.status.guard import Guard, Refused
from kernel.status.page import render_page
from kernel.status.wire import Connection, Request, Response

log = logging.getLogger(__name__)

StatusFn = Callable[[], dict[str, Any]]
PageFn = Callable[[dict[str, Any], str], str]
"""``(status document, CSRF token) -> HTML``: a process's own status page (with forms that post the token)."""
ActionFn = Callable[[str, str, bytes], tuple[int, Any]]
"""``(method, path, body) -> (HTTP status, JSON document)``: a state-changing route (a management API)."""
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


def _json(code: int, doc: Any, extra: tuple[tuple[bytes, bytes], ...] = ()) -> Response:
    return Response(code, "application/json", orjson.dumps(doc, default=str), extra)


def error(code: int, message: str, extra: tuple[tuple[bytes, bytes], ...] = ()) -> Response:
    """A refusal as JSON: ``{"error": message}`` with ``code``."""
    return _json(code, {"error": message}, extra)


class StatusServer:
    """Serve a registry's metrics and a status document over HTTP.

    Args:
        status: returns the status document (:mod:`kernel.status.document`), called per request.
        registry: the Prometheus registry of ``/metrics`` (default: the process's global one).
        title: the page's title.
        refresh_s: how often the page reloads itself, seconds (``<meta http-equiv="refresh">``).
        ready: whether the process is ready (``/readyz``; default: ready while it serves).
        page: renders ``/status`` from ``(document, CSRF token)`` (default: :func:`render_page`, no actions).

    Endpoints:
        ``/metrics`` Prometheus text format; ``/status`` HTML (no JavaScript);
        ``/status.json`` the document; ``/healthz`` ``200 ok`` while the process serves;
        ``/readyz`` ``200 ok`` once ``ready()``, else ``503``. The last two skip the token and say nothing else.
    """

    def __init__(self, status: StatusFn, registry: CollectorRegistry | None = None, *, title: str = "threes",
                 refresh_s: int = 5, ready: Callable[[], bool] | None = None, page: PageFn | None = None):
        self.status = status
        self.registry = registry or REGISTRY
        self.title = title
        self.refresh_s = refresh_s
        self.ready = ready or (lambda: True)
        self.page = page
        self.routes: dict[str, tuple[RouteFn, FastRouteFn | None]] = {}
        self.actions: dict[str, ActionFn] = {}
        self.guard: Guard | None = None
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

    def add_action(self, prefix: str, action: ActionFn) -> None:
        """Answer the state-changing requests (``POST``, ``PUT``, ``DELETE``) under ``prefix`` with ``action``.

        Each request passes :meth:`Guard.check_write` first (the admin token, or the status
        page's CSRF token from its own origin). ``action`` runs on the thread pool; its answer
        is JSON, except that a form post of the page that succeeded is sent back to ``/status``
        (``303``). An exception is a ``500`` with its class name only.

        Args:
            prefix: the path prefix (``/parts``).
            action: ``(method, path, body) -> (HTTP status, JSON document)``.
        """
        self.actions[prefix.rstrip("/")] = action

    def serve(self, port: int, addr: str = LOOPBACK, token: str | None = None, admin_token: str | None = None) -> int:
        """Start serving on a daemon thread; returns the bound port (``0`` picks a free one).

        Args:
            port: TCP port.
            addr: the address to bind (default loopback only).
            token: a bearer token every request but ``/healthz`` and ``/readyz`` must carry; required when
                ``addr`` is not a loopback address.
            admin_token: the bearer token of state-changing requests (default: ``token``).

        Raises:
            OSError: the port is taken.
            ConfigError: ``addr`` is not loopback and there is no token.
        """
        require_token_off_loopback(addr, token, "a bearer token")
        # bound here, in the caller's thread, so that a taken port raises OSError to the caller
        sock = socket.create_server((addr, port), backlog=_BACKLOG, reuse_port=False)
        sock.setblocking(False)
        host, bound = sock.getsockname()[:2]
        self.guard = Guard(token, admin_token, int(bound), addr)
        loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(4, thread_name_prefix=f"status-http-{port}")
        listening = loop.run_until_complete(loop.create_server(lambda: Connection(self), sock=sock))
        self._loop, self._listener = loop, listening
        self._bound = (str(host), int(bound))
        self._thread = threading.Thread(target=loop.run_forever, name=f"status-http-{bound}", daemon=True)
        self._thread.start()
        log.info("status and metrics on http://%s:%d/status (/status.json, /metrics)%s", addr, bound,
                 " (bearer token required)" if token else "")
        return int(bound)

    # -- answering (on the loop: _answer_now; on the pool: _answer_slow) --------------------------

    def _answer_now(self, request: Request) -> Response | None:
        """The answer when it is cheap (refusals, probes, inline routes); ``None``: compute on the pool."""
        path = request.path
        assert self.guard is not None
        if request.method != "GET":
            if self._action(path) is None:
                return error(405, "read-only: GET only", ((b"allow", b"GET"),))
            return None  # the guard reads the body's form: on the pool
        try:
            self.guard.check_read(request)
        except Refused as exc:
            return error(exc.code, str(exc), ((b"www-authenticate", b'Bearer realm="threes"'),))
        if path == "/healthz":
            return Response(200, "text/plain", b"ok\n")
        found = self._route(path)
        if found is not None and found[1] is not None:
            return self._run_route(found[1], path, request.target)
        return None

    def _answer_slow(self, request: Request) -> Response:
        if request.method != "GET":
            return self._act(request)
        path, target = request.path, request.target
        try:
            if path == "/readyz":
                return Response(200, "text/plain", b"ok\n") if self.ready() else Response(503, "text/plain", b"no\n")
            if path == "/metrics":
                return Response(200, CONTENT_TYPE_LATEST, generate_latest(self.registry))
            if path in ("/status.json", "/status/json"):
                body = json.dumps(redact_document(self.status()), default=str, indent=1).encode()
                return Response(200, "application/json", body)
            if path in ("/", "/status"):
                doc = redact_document(self.status())
                assert self.guard is not None
                html = (self.page(doc, self.guard.csrf) if self.page is not None
                        else render_page(doc, title=self.title, refresh_s=self.refresh_s))
                return Response(200, "text/html; charset=utf-8", html.encode())
        except Exception as exc:  # a broken status must not kill the server
            log.warning("status endpoint %s failed: %s", path, exc)
            return error(500, f"status unavailable: {type(exc).__name__}")
        found = self._route(path)
        answer = None if found is None else self._run_route(found[0], path, target)
        if answer is not None:
            return answer
        return error(404, "not found: try /status, /status.json or /metrics")

    def _act(self, request: Request) -> Response:
        """A state-changing request: guarded, then its action; a page's form post goes back to the page."""
        assert self.guard is not None
        try:
            form = self.guard.check_write(request)
        except Refused as exc:
            return error(exc.code, str(exc), ((b"www-authenticate", b'Bearer realm="threes"'),))
        action = self._action(request.path)
        assert action is not None
        try:
            code, doc = action(request.method, request.path, request.body if not form else b"")
        except Exception as exc:  # a broken action must not kill the server, nor show a traceback
            log.warning("action %s %s failed: %s", request.method, request.path, exc)
            return error(500, f"unavailable: {type(exc).__name__}")
        if form and code < 400:
            return Response(303, "text/plain", b"", ((b"location", b"/status"),))
        return _json(code, doc)

    def _run_route(self, route: FastRouteFn, path: str, target: str) -> Response | None:
        try:
            query = parse_qs(urlsplit(target).query, keep_blank_values=True) if "?" in target else {}
            answer = route(path, query)
            if answer is None:
                return None
            code, doc = answer
            body = doc if isinstance(doc, bytes) else orjson.dumps(doc, default=str)
            return Response(code, "application/json", body)
        except Exception as exc:  # a broken route must not kill the server
            log.warning("route %s failed: %s", path, exc)
            return error(500, f"unavailable: {type(exc).__name__}")

    def _route(self, path: str) -> tuple[RouteFn, FastRouteFn | None] | None:
        for prefix, found in self.routes.items():
            if path == prefix or path.startswith(prefix + "/"):
                return found
        return None

    def _action(self, path: str) -> ActionFn | None:
        for prefix, found in self.actions.items():
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
