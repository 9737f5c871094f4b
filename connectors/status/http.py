"""The HTTP endpoint of a long-running process: ``/metrics``, ``/status``, ``/status.json``, ``/healthz``.

A process may add read-only JSON routes (:meth:`StatusServer.add_route`): the stream
job answers interactive queries of its snapshots under ``/snapshots``.

A :class:`http.server.ThreadingHTTPServer` on a daemon thread, like
prometheus-client's own ``start_http_server``, with the status page next to the
metrics so one port serves both (Kubernetes probes use ``/healthz``).

It binds ``127.0.0.1`` unless told otherwise: the page shows topics, positions and
error texts. Binding any other address needs a bearer token (RFC 6750): every
request but ``/healthz`` must then carry ``Authorization: Bearer <token>`` (compared
in constant time), else it gets ``401``. Every string of the status document goes
through the log redaction (:func:`connectors.redact.redact_document`) before it is
served.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from connectors.config.models import is_loopback
from connectors.exceptions import ConfigError
from connectors.redact import redact_document
from connectors.status.page import render_page

log = logging.getLogger(__name__)

StatusFn = Callable[[], dict[str, Any]]
RouteFn = Callable[[str, dict[str, list[str]]], tuple[int, Any]]
"""``(path, query parameters) -> (HTTP status, JSON document)``: a read-only route a process adds."""

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


class _Server(ThreadingHTTPServer):
    # the listen backlog: socketserver's 5 makes a burst of clients (interactive queries) wait for
    # SYN retries (1 s, 3 s, 7 s...) before a thread even accepts them
    request_queue_size = 256


class StatusServer:
    """Serve a registry's metrics and a status document over HTTP.

    Args:
        status: returns the status document (:mod:`connectors.status.document`), called per request.
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
        self.httpd: ThreadingHTTPServer | None = None
        self.routes: dict[str, RouteFn] = {}

    def add_route(self, prefix: str, route: RouteFn) -> None:
        """Answer ``GET`` requests under ``prefix`` (e.g. ``/snapshots``) with ``route`` (JSON).

        The process registers what it can answer (the stream job: interactive queries of its
        snapshots) without this framework knowing it. A route's exception is a ``500`` with its
        class name only: no traceback reaches the client.
        """
        self.routes[prefix.rstrip("/")] = route

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
        server = self
        expected = f"Bearer {token}".encode() if token else None

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                path = self.path.split("?", 1)[0]
                if expected is not None and path != "/healthz":
                    given = (self.headers.get("Authorization") or "").encode()
                    if not hmac.compare_digest(given, expected):  # constant time: no timing oracle on the token
                        self.send_response(401)
                        self.send_header("WWW-Authenticate", 'Bearer realm="threes"')
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                try:
                    if path == "/metrics":
                        self._send(200, CONTENT_TYPE_LATEST, generate_latest(server.registry))
                    elif path in ("/status.json", "/status/json"):
                        body = json.dumps(redact_document(server.status()), default=str, indent=1).encode()
                        self._send(200, "application/json", body)
                    elif path in ("/", "/status"):
                        doc = redact_document(server.status())
                        html = render_page(doc, title=server.title, refresh_s=server.refresh_s)
                        self._send(200, "text/html; charset=utf-8", html.encode())
                    elif path == "/healthz":
                        self._send(200, "text/plain", b"ok\n")
                    elif (route := server._route(path)) is not None:
                        from urllib.parse import parse_qs, urlsplit

                        query = parse_qs(urlsplit(self.path).query, keep_blank_values=True)
                        code, doc = route(path, query)
                        self._send(code, "application/json", json.dumps(doc, default=str).encode())
                    else:
                        self._send(404, "text/plain", b"not found: try /status, /status.json or /metrics\n")
                except Exception as exc:  # noqa: BLE001 - a broken status must not kill the server thread
                    log.warning("status endpoint %s failed: %s", path, exc)
                    self._send(500, "text/plain", f"status unavailable: {type(exc).__name__}\n".encode())

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, fmt: str, *args: Any) -> None:
                log.debug("http %s", fmt % args)

        self.httpd = _Server((addr, port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, name=f"status-http-{port}", daemon=True).start()
        bound = self.httpd.server_address[1]
        log.info("status and metrics on http://%s:%d/status (/status.json, /metrics)%s", addr, bound,
                 " (bearer token required)" if token else "")
        return int(bound)

    def _route(self, path: str) -> RouteFn | None:
        for prefix, route in self.routes.items():
            if path == prefix or path.startswith(prefix + "/"):
                return route
        return None

    @property
    def address(self) -> tuple[str, int] | None:
        """The bound ``(address, port)``, ``None`` when not serving."""
        if self.httpd is None:
            return None
        host, port = self.httpd.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        """Stop serving."""
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
