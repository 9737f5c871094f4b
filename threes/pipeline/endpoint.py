"""``threes run``'s own HTTP endpoint: the status page, ``/status.json``, probes and the management API.

It binds ``127.0.0.1:8083`` by default (Kafka Connect's port; ``--api-host``/``--api-port``,
``$THREES_API_HOST``/``$THREES_API_PORT``). When the default port is taken, a free one is
used and said; a port given explicitly that is taken is an error. Another address than
loopback needs a token (``$THREES_API_TOKEN``), which every request then carries but
``/healthz`` and ``/readyz``. The state-changing requests always need one: without
``$THREES_API_TOKEN`` the run makes a random one.

The run writes where it serves and its token to a file beside its lock (mode 0600, the
owner only), ``<lock>.api.json``: ``threes ctl --config CONFIG`` and ``threes offsets
reset`` find the running API there; the file goes when the run ends.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernel.status.http import LOOPBACK, StatusServer

if TYPE_CHECKING:
    from threes.pipeline.supervisor import Supervisor

log = logging.getLogger(__name__)

DEFAULT_PORT = 8083
"""The management API's default port (Kafka Connect's)."""


def discovery_path(lock_file: Path) -> Path:
    """The file that tells where a run's API answers: ``<lock>.api.json``."""
    return lock_file.with_name(lock_file.name + ".api.json")


def read_discovery(lock_file: Path) -> dict[str, Any] | None:
    """``{"url", "token"}`` of the run holding ``lock_file``, ``None`` when none is written."""
    try:
        doc: dict[str, Any] = json.loads(discovery_path(lock_file).read_text())
    except (OSError, ValueError):
        return None
    return doc


class RunEndpoint:
    """The endpoint of one run (see the module docstring).

    Args:
        sup: the supervisor whose parts it shows and controls.
        host: the address to bind.
        port: the port (``None``: :data:`DEFAULT_PORT`, or a free one when it is taken).
        token: the bearer token (required off loopback; ``None`` on loopback: reads are open).
        lock_file: the run's lock (the discovery file goes beside it).
    """

    def __init__(self, sup: Supervisor, host: str, port: int | None, token: str | None, lock_file: Path):
        self.sup, self.host, self.port, self.token, self.lock_file = sup, host, port, token, lock_file
        self.admin_token = token or secrets.token_urlsafe(32)
        self.server: StatusServer | None = None

    def start(self) -> str:
        """Serve; returns the URL.

        Raises:
            OSError: an explicitly given port is taken.
            ConfigError: a non-loopback address without a token.
        """
        from kernel.redact import register_secret
        from threes.pipeline.api import ManagementApi, run_document
        from threes.pipeline.page import render_run_page

        register_secret(self.admin_token)
        sup = self.sup
        server = StatusServer(
            lambda: run_document(sup),
            title=f"threes run {sup.options.config}",
            ready=lambda: sup.phase == "running",
            page=render_run_page,
        )
        ManagementApi(sup).mount(server)
        try:
            bound = server.serve(
                DEFAULT_PORT if self.port is None else self.port, self.host, self.token, self.admin_token
            )
        except OSError:
            if self.port is not None:
                raise
            bound = server.serve(0, self.host, self.token, self.admin_token)
            log.warning("run: port %d is taken: the management API is on port %d", DEFAULT_PORT, bound)
        self.server = server
        shown = LOOPBACK if self.host in ("0.0.0.0", "::") else self.host
        url = f"http://{shown if ':' not in shown else f'[{shown}]'}:{bound}"
        path = discovery_path(self.lock_file)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({"url": url, "token": self.admin_token, "pid": os.getpid()}, handle)
        return url

    def close(self) -> None:
        """Stop serving and remove the discovery file."""
        if self.server is not None:
            self.server.close()
            self.server = None
        discovery_path(self.lock_file).unlink(missing_ok=True)
