"""How ``threes run`` runs a pipeline and how each of its parts is doing.

:class:`RunOptions` (what the command line asks for), :class:`PartState` (one part's status,
child process and restarts, read by the live view) and :func:`free_port` for a child's
metrics endpoint. The :class:`~threes.pipeline.supervisor.Supervisor` drives them.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from threes.pipeline.plan import COMPONENTS, Part
from threes.pipeline.processes import Child


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it), for a child's metrics endpoint."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunOptions:
    """How ``threes run`` runs a pipeline.

    Attributes:
        config: the pipeline YAML.
        only: the parts to run (:func:`threes.pipeline.plan.parse_only`).
        offsets_topic: where the sources keep their positions.
        log_dir: each part's log goes to ``<log_dir>/<part>.log``.
        start_timeout_s: give up when a part waits to start, or to be ready, longer than this
            (seconds; 0 waits forever).
        restart: restart a part that exits after it was ready (else the run stops).
        max_backoff_s: longest delay before a restart, seconds.
        flow_every_s: how often the live view's Kafka figures are read, seconds.
    """

    config: Path
    only: tuple[str, ...] = COMPONENTS
    offsets_topic: str = "_threes_offsets"
    log_dir: Path = Path(".threes/run")
    start_timeout_s: float = 600.0
    restart: bool = True
    max_backoff_s: float = 60.0
    flow_every_s: float = 2.0


@dataclass
class PartState:
    """A part of the run and how it is doing (read by the live view).

    Attributes:
        part: what it runs and waits for.
        status: ``waiting``, ``starting``, ``ready``, ``restarting``, ``stopping``, ``paused``, ``stopped`` or
            ``failed``.
        detail: what it waits for or what it does, for people.
        child: its current process (``None`` before the first start).
        since: ``time.monotonic()`` of the last status change.
        restarts: restarts so far.
        ever_ready: it became ready at least once.
        exit_code: the code of its last exit (``None``: still runs, or killed).
        paused: an operator paused it (management API); a paused source or stream job has no process,
            a paused sync process holds its partitions without consuming.
        last_error: the end of its log when it last exited with an error (``None``: never).
        revision: the config revision it runs (:func:`threes.pipeline.revisions.part_revisions`).
    """

    part: Part
    status: str = "waiting"
    detail: str = ""
    child: Child | None = None
    since: float = field(default_factory=time.monotonic)
    restarts: int = 0
    ever_ready: bool = False
    exit_code: int | None = None
    paused: bool = False
    last_error: str | None = None
    revision: str = ""
    _intent: str | None = None  # what follows the clean stop under way: "pause" or "restart"
    _stop_deadline: float | None = None
    _failures: int = 0
    _restart_at: float | None = None

    @property
    def name(self) -> str:
        """``sources``, ``stream`` or ``sync``."""
        return self.part.name

    def set(self, status: str, detail: str = "") -> None:
        """Change the status (``since`` moves only when the status does)."""
        if status != self.status:
            self.since = time.monotonic()
        self.status, self.detail = status, detail
