"""Shared pieces of the local stack: layout, errors, readiness waits and URL redaction.

Everything the local stack writes lives under one folder (``.threes/`` by
default)::

    .threes/
      m2/          Maven's project-local repository
      downloads/   archives fetched by Maven (Elasticsearch zip)
      run/         PID records (``<service>.json``) and the stack lock
      logs/        one log per service (``<service>.log``) and Maven's logs
      kafka/ postgres/ elasticsearch/ s3/   installs, configs and data
      spark-jars-<version>/  Spark's Kafka and Avro connectors with their dependencies, per Spark version
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from kernel.exceptions import ThreesError

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
"""The only address any local service binds to or is reached at."""


class LocalStackError(ThreesError):
    """A local service could not be installed, started, reached or stopped.

    The message is one line that says what is wrong and what to do about it; as a
    :class:`~kernel.exceptions.ThreesError` the command line prints it as that one line
    (``threes.cli.run``), never a traceback.
    """


@dataclass(frozen=True)
class Layout:
    """Paths of the project-local folder.

    Attributes:
        home: Absolute path of the folder (``.threes``).
    """

    home: Path

    @property
    def m2(self) -> Path:
        """Maven's project-local repository."""
        return self.home / "m2"

    @property
    def downloads(self) -> Path:
        """Archives fetched by Maven."""
        return self.home / "downloads"

    @property
    def run(self) -> Path:
        """PID records and the stack lock."""
        return self.home / "run"

    @property
    def logs(self) -> Path:
        """Log folder."""
        return self.home / "logs"

    def log(self, name: str) -> Path:
        """Return the log file of service ``name``."""
        return self.logs / f"{name}.log"

    def pid_file(self, name: str) -> Path:
        """Return the PID record of service ``name``."""
        return self.run / f"{name}.json"

    def service_dir(self, name: str) -> Path:
        """Return the install/data folder of service ``name``."""
        return self.home / name

    def create(self) -> None:
        """Create the top-level folders (idempotent)."""
        for path in (self.home, self.m2, self.downloads, self.run, self.logs):
            path.mkdir(parents=True, exist_ok=True)


def wait_until(
    probe: Callable[[], object],
    *,
    timeout: float,
    what: str,
    log: Path | None = None,
    alive: Callable[[], bool] | None = None,
    interval: float = 0.5,
) -> None:
    """Call ``probe`` until it returns without raising, or fail after ``timeout`` seconds.

    Args:
        probe: Raises (any exception) while the thing is not ready.
        timeout: Seconds to wait.
        what: Name used in the error ("Elasticsearch").
        log: Log file named in the error.
        alive: Returns False when the process died: fail at once instead of waiting.
        interval: Seconds between probes.

    Raises:
        LocalStackError: On timeout or when the process died.
    """
    see = f"; see {log}" if log else ""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            probe()
            return
        except Exception as exc:  # any failure means "not ready yet"
            last = exc
        if alive is not None and not alive():
            raise LocalStackError(f"{what} exited during startup{see}")
        if time.monotonic() >= deadline:
            reason = f" (last error: {_short(last)})" if last else ""
            raise LocalStackError(f"{what} did not become healthy within {timeout:.0f} s{reason}{see}")
        time.sleep(interval)


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:160]


def now() -> datetime:
    """Return the current time, timezone-aware UTC."""
    return datetime.now(UTC)


def redact(url: str) -> str:
    """Return ``url`` with its password replaced by ``***`` (``scheme://user:***@host...``).

    A URL without ``://``, without userinfo or without a password is returned as is.
    """
    scheme, sep, rest = url.partition("://")
    userinfo, at, hostpart = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{hostpart}"
