"""A service of the local stack is found by its ports and health, not by the folder it was started from.

A folder's ``.threes/run`` records only what *that* folder started. From any other
folder (an empty one where ``threes demo`` runs, a second clone) the stack that runs
on the default loopback ports is still found: a service without a PID record here
whose port answers the same health probe ``up`` waits for is used as it is, shown by
``threes local status`` as running and started elsewhere, and never stopped by this
folder's ``down``. A port held by something that does not answer as the service is
one line that names the port, the service and what to do.

The folder the other stack was started from is read from the listening process's
command line (every process of the stack names its folder); through it ``status``
shows that stack's PID and log, and the endpoints use its CA file. When the process
is not visible (another user's, without root), the CA is unknown: Kafka's SASL_SSL
listener then needs ``THREES_TLS_CA``, and ``threes local env`` says so.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from .common import HOST, Layout
from .process import PidRecord, cmdline, listener_pid, owns, port_open
from .tls import tls_dir

if TYPE_CHECKING:
    from .endpoints import Endpoints
    from .service import Service


class Presence(StrEnum):
    """Where a service of the stack stands, seen from one folder (its ``.threes``)."""

    OURS = "ours"
    """This folder's PID record names a live process."""
    ELSEWHERE = "elsewhere"
    """No record here, but the service's port answers its health probe: started from another folder."""
    DOWN = "down"
    """No record here and its ports are free (or held by a leftover of this folder, which ``up`` stops)."""
    HELD = "held"
    """A port of the service is held by something that does not answer as the service."""


def decide(recorded: bool, held: Sequence[int], healthy: Callable[[], bool], leftover: bool = False) -> Presence:
    """Decide where a service stands from what is known of it.

    Args:
        recorded: This folder's PID record names a live process of the service.
        held: Those of the service's ports that accept TCP connections.
        healthy: Whether the service answers its health probe (called only when a port is held).
        leftover: The port's listener names this very folder: a leftover of ours without a
            record, which ``up`` stops before starting the service again.

    Returns:
        The :class:`Presence`.
    """
    if recorded:
        return Presence.OURS
    if not held or leftover:
        return Presence.DOWN
    return Presence.ELSEWHERE if healthy() else Presence.HELD


@dataclass(frozen=True)
class Found:
    """A service as found from one folder.

    Attributes:
        presence: Where it stands.
        port: The first of its ports held (``ELSEWHERE``, ``HELD``), else None.
        pid: The listener's process id when visible.
        home: The folder a service found elsewhere was started from, when its process names one.
        reason: Why the health probe failed (``HELD``), one line.
    """

    presence: Presence
    port: int | None = None
    pid: int | None = None
    home: Path | None = None
    reason: str = ""

    def record(self, name: str) -> PidRecord | None:
        """The other folder's PID record of service ``name`` (read only), when known and live."""
        if self.home is None:
            return None
        record = PidRecord.load(Layout(self.home).pid_file(name))
        return record if record is not None and owns(record.pid, record.marker) else None


def started_from(pid: int | None, name: str) -> Path | None:
    """The stack folder (``.../.threes``) process ``pid`` of service ``name`` was started from.

    Every process of the stack names a path under ``<home>/<service>/`` in its command line; the
    folder counts when it holds ``run/<name>.json``.

    Args:
        pid: The process (None: unknown).
        name: The service's name (``kafka``, ``postgres``...).
    """
    line = cmdline(pid) if pid else None
    if not line:
        return None
    for match in re.finditer(rf"(/[^\s:=]*?)/{re.escape(name)}/", line):
        home = Path(match.group(1))
        if Layout(home).pid_file(name).is_file():
            return home
    return None


def find(svc: Service, endpoints: Endpoints) -> Found:
    """Find ``svc`` by its PID record, else by its ports and health probe.

    Args:
        svc: The service, of this folder's layout.
        endpoints: Where it is reached (the default loopback ports unless overridden).
    """
    if svc.running() is not None:
        return Found(Presence.OURS)
    held = [port for port in svc.ports if port_open(port)]
    if not held:
        return Found(Presence.DOWN)
    pid = listener_pid(held[0])
    home = started_from(pid, svc.name)
    reason: list[str] = []

    def healthy() -> bool:
        try:
            svc.probe(with_ca(endpoints, svc.layout, home))
            return True
        except Exception as exc:  # any failure: it does not answer as the service
            reason.append(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            return False

    presence = decide(False, held, healthy, leftover=home == svc.layout.home)
    return Found(presence, held[0], pid, home if presence is Presence.ELSEWHERE else None, "".join(reason))


def with_ca(endpoints: Endpoints, layout: Layout, home: Path | None) -> Endpoints:
    """``endpoints`` with a CA file that exists: this folder's, else ``home``'s, else none (no TLS check).

    A ``THREES_TLS_CA`` given in the environment is kept as it is.
    """
    if not endpoints.tls_ca_location or Path(endpoints.tls_ca_location).is_file():
        return endpoints
    if endpoints.tls_ca_location != str(tls_dir(layout) / "ca.pem"):
        return endpoints  # given by the environment: its problem is reported where it is used
    other = tls_dir(Layout(home)) / "ca.pem" if home is not None else None
    return dataclasses.replace(endpoints, tls_ca_location=str(other) if other and other.is_file() else "")


def held_message(title: str, port: int, env_var: str, pid: int | None = None, reason: str = "") -> str:
    """One line for a port held by something that is not the healthy service: which, and what to do."""
    who = f" by pid {pid} ({(cmdline(pid) or '?')[:60]})" if pid else ""
    why = f" and does not answer as {title} ({reason[:120]})" if reason else ""
    return (
        f"port {HOST}:{port} needed by {title} is already in use{who}{why}; stop that process, "
        f"or set {env_var} to use an already-running {title} instead"
    )


@dataclass(frozen=True)
class ServiceStatus:
    """State of one service.

    Attributes:
        name: Service name (``kafka``, ``postgres``, ``elasticsearch``, ``s3``, ``mysql``).
        running: Whether our process is alive (for an external service or one started
            elsewhere: whether it answers).
        pid: The process id, None when not running, external or not visible.
        address: Where it is reached (no secrets).
        since: When the process was started (UTC), None when not running, external or unknown.
        log_path: The service's log file, None when external or unknown.
        external: True when an environment variable points at a service we do not run.
        elsewhere: The service answers on its port but was not started from this folder.
        started_in: The folder it was started from (``elsewhere``), when its process names one.
        problem: One line when a port is held by something that is not the service.
    """

    name: str
    running: bool
    pid: int | None
    address: str
    since: datetime | None
    log_path: Path | None
    external: bool
    elsewhere: bool = False
    started_in: Path | None = None
    problem: str = ""


def status_of(svc: Service, endpoints: Endpoints, external: bool) -> ServiceStatus:
    """The :class:`ServiceStatus` of ``svc`` (external: whether it answers; else :func:`find`)."""
    address = svc.address(endpoints)
    if external:
        try:
            svc.probe(endpoints)
            answering = True
        except Exception:  # any failure means "not answering"
            answering = False
        return ServiceStatus(svc.name, answering, None, address, None, None, True)
    found = find(svc, endpoints)
    if found.presence is Presence.ELSEWHERE:
        other = found.record(svc.name)
        log = Layout(found.home).log(svc.name) if found.home else None
        return ServiceStatus(
            svc.name,
            True,
            other.pid if other else found.pid,
            address,
            other.started if other else None,
            log,
            False,
            True,
            found.home,
        )
    record = svc.running() if found.presence is Presence.OURS else None
    problem = ""
    if found.presence is Presence.HELD and found.port is not None:
        problem = held_message(svc.title, found.port, svc.env_var, found.pid, found.reason)
    return ServiceStatus(
        name=svc.name,
        running=record is not None,
        pid=record.pid if record else None,
        address=address,
        since=record.started if record else None,
        log_path=svc.log,
        external=False,
        problem=problem,
    )
