"""The HTTP endpoint of a long-running process: ``/metrics``, ``/status``, ``/status.json``, ``/healthz``.

A :class:`http.server.ThreadingHTTPServer` on a daemon thread, like
prometheus-client's own ``start_http_server``, with the status page next to the
metrics so one port serves both (Kubernetes probes use ``/healthz``).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

from connectors.status.page import render_page

log = logging.getLogger(__name__)

StatusFn = Callable[[], dict[str, Any]]


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

    def serve(self, port: int, addr: str = "0.0.0.0") -> int:  # noqa: S104 - scraped and probed from outside
        """Start serving on a daemon thread; returns the bound port (``0`` picks a free one).

        Raises:
            OSError: the port is taken.
        """
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                path = self.path.split("?", 1)[0]
                try:
                    if path == "/metrics":
                        self._send(200, CONTENT_TYPE_LATEST, generate_latest(server.registry))
                    elif path in ("/status.json", "/status/json"):
                        body = json.dumps(server.status(), default=str, indent=1).encode()
                        self._send(200, "application/json", body)
                    elif path in ("/", "/status"):
                        html = render_page(server.status(), title=server.title, refresh_s=server.refresh_s)
                        self._send(200, "text/html; charset=utf-8", html.encode())
                    elif path == "/healthz":
                        self._send(200, "text/plain", b"ok\n")
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

        self.httpd = ThreadingHTTPServer((addr, port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, name=f"status-http-{port}", daemon=True).start()
        bound = self.httpd.server_address[1]
        log.info("status and metrics on http://%s:%d/status (/status.json, /metrics)", addr, bound)
        return int(bound)

    def close(self) -> None:
        """Stop serving."""
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
