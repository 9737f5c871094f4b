"""The life cycle every local service shares: install, prepare, start, probe, stop."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from .common import Layout, now
from .process import PidRecord, ensure_ports_free, is_alive, owns, spawn, terminate
from .system import is_root

if TYPE_CHECKING:
    from .endpoints import Endpoints

logger = logging.getLogger(__name__)


class Service:
    """One service of the local stack, run as a native process bound to 127.0.0.1.

    Subclasses set the class attributes and implement :meth:`install`,
    :meth:`prepare`, :meth:`command`, :meth:`probe` and :meth:`address`.

    Attributes:
        name: Service name used on the command line and for files (``kafka``).
        title: Human name used in messages (``Kafka``).
        env_var: Environment variable that points at an already-running service.
        endpoint_vars: :class:`~threes.local.endpoints.Endpoints` field -> the environment variable
            that overrides it, for every endpoint of this service (``threes local env`` prints
            them; the first is :attr:`env_var`).
        ports: TCP ports on 127.0.0.1 the service listens on.
        health_timeout: Seconds to wait for the service to become healthy.
        stop_timeout: Seconds between the graceful signal and SIGKILL.
        run_as: OS user the server runs as when we are root (servers that refuse
            root: ``postgres``, ``mysql``); None runs it as ourselves.
    """

    # name, title and ports are per class except where one class runs several instances (the Spark workers)
    name: str
    title: str
    env_var: ClassVar[str]
    endpoint_vars: ClassVar[dict[str, str]]
    ports: tuple[int, ...]
    health_timeout: ClassVar[float] = 60.0
    stop_timeout: ClassVar[float] = 30.0
    run_as: ClassVar[str | None] = None

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.dir = layout.service_dir(self.name)

    @property
    def log(self) -> Path:
        """The service's log file (``logs/<name>.log``)."""
        return self.layout.log(self.name)

    @property
    def marker(self) -> str:
        """String in the command line of every process of ours for this service."""
        return f"{self.dir}/"

    @property
    def pid_file(self) -> Path:
        """PID record path."""
        return self.layout.pid_file(self.name)

    @property
    def os_user(self) -> str | None:
        """OS user that runs the server: :attr:`run_as` when we are root, else None (ourselves)."""
        return self.run_as if is_root() else None

    # -- to implement ---------------------------------------------------------------

    def install(self) -> None:
        """Download/install what is missing (idempotent; a no-op when installed)."""

    def prepare(self) -> None:
        """Write configuration and initialise storage (idempotent, repairs half-done work)."""

    def command(self) -> tuple[list[str], dict[str, str], Path]:
        """Return the command, extra environment and working directory of the process."""
        raise NotImplementedError

    def probe(self, endpoints: Endpoints) -> None:
        """Raise unless the service answers at ``endpoints`` (one quick attempt)."""
        raise NotImplementedError

    def address(self, endpoints: Endpoints) -> str:
        """Where the service is reached, without secrets."""
        raise NotImplementedError

    def bootstrap(self) -> None:
        """Run once the process we started answers (create databases...)."""

    # -- shared life cycle ----------------------------------------------------------

    def running(self) -> PidRecord | None:
        """Return the record of our live process, cleaning a stale record."""
        record = PidRecord.load(self.pid_file)
        if record is not None and owns(record.pid, record.marker):
            return record
        if self.pid_file.exists():
            logger.info("%s: removing stale PID record %s", self.name, self.pid_file)
            self.pid_file.unlink(missing_ok=True)
        return None

    def alive(self, record: PidRecord) -> bool:
        """Whether the process behind ``record`` is still up."""
        return is_alive(record.pid)

    def check_ports(self) -> None:
        """Fail fast when a port is held by a process that is not ours.

        Raises:
            LocalStackError: Naming the port and the environment variable to use instead.
        """
        ensure_ports_free(self.title, self.ports, self.env_var, self.layout.home)

    def start(self) -> PidRecord:
        """Start the process (ports must be free) and record its PID.

        Raises:
            LocalStackError: If a port is taken or the process cannot start.
        """
        self.check_ports()
        cmd, env, cwd = self.command()
        proc = spawn(cmd, log=self.log, cwd=cwd, env=env)
        record = PidRecord(proc.pid, now(), self.marker)
        record.save(self.pid_file)
        logger.info("%s: started (pid %d); log: %s", self.name, proc.pid, self.log)
        return record

    def stop(self) -> bool:
        """Stop our process, if running; return whether there was one."""
        record = self.running()
        if record is None:
            return False
        logger.info("%s: stopping pid %d", self.name, record.pid)
        terminate(record.pid, record.marker, self.stop_timeout)
        self.pid_file.unlink(missing_ok=True)
        return True
