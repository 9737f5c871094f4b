"""Errors of threes, grouped by what the caller does about them.

The grouping follows meltano singer-sdk's ``exceptions.py`` and Kafka Connect's
``RetriableException`` / ``ConnectException`` split:

* :class:`ConfigError` - fix the config file; carries every problem with its path.
* :class:`SetupError` - a system cannot be reached or refuses our credentials.
* :class:`RetriableError` / :class:`SinkBackpressureError` - try again later.
* :class:`SinkBlockedError` - the target refuses every record (no privilege, a missing
  table or column, read-only, disk full): pause, try again later, never dead-letter.
* :class:`BatchRefusedError` - the target refused a write because of some record(s)
  without naming which: the sink runtime bisects the batch to find them.
* :class:`FatalError` - stop the task; retrying cannot help.
* :class:`SkippableRecordError` - send this one record to the dead letter queue.

Every error message is written for the person who runs the pipeline: it says
what is wrong and what to do, and never contains a secret.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class ThreesError(Exception):
    """Root of every error raised on purpose by threes."""


@dataclass(frozen=True)
class ConfigProblem:
    """One problem found in a config file.

    Attributes:
        path: the key path inside the document, e.g. ``sources[1].table``
            (empty for a problem with the file as a whole).
        message: what is wrong, without the offending value when it could be a secret.
        file: the config file's path as given by the user, or ``None`` for a dict.
        line: 1-based line of the key (or of its parent mapping when the key is
            missing), or ``None`` when unknown.
    """

    path: str
    message: str
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = self.file or "<config>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        return f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"


class ConfigError(ThreesError):
    """The configuration is invalid; ``problems`` lists every problem found at once."""

    def __init__(self, problems: Iterable[ConfigProblem] | str):
        if isinstance(problems, str):
            problems = [ConfigProblem(path="", message=problems)]
        self.problems: list[ConfigProblem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class SetupError(ThreesError):
    """A system cannot be reached, or it refuses the configured credentials.

    Args:
        message: what failed, e.g. ``"Kafka at 127.0.0.1:9092 did not answer"``.
        hint: what to do about it, e.g. ``"start it with `threes local up`"``.
    """

    def __init__(self, message: str, hint: str | None = None):
        self.hint = hint
        super().__init__(f"{message}. {hint}" if hint else message)


class RetriableError(ThreesError):
    """A transient failure: the same operation may succeed when tried again."""


class SinkBackpressureError(RetriableError):
    """The target asks us to slow down (HTTP 429, lock timeout, ...).

    The sync service pauses the partitions that feed the target and retries after
    ``retry_after`` seconds (quix-streams ``SinkBackpressureError``).

    Args:
        retry_after: seconds to wait before the next attempt.
        message: a description of what the target answered.
    """

    def __init__(self, retry_after: float, message: str = "target applied backpressure"):
        self.retry_after = retry_after
        super().__init__(f"{message} (retry after {retry_after:.3g} s)")


class SinkBlockedError(RetriableError):
    """The target refuses any record for a reason outside the records: their data is not the problem.

    No privilege on the table, a missing table or column (a migration under way), a
    read-only database or index, a full disk. Every record of the batch would hit it,
    so none is dead-lettered: the sync service pauses the partitions that feed the
    sink, reports ``blocked: <message>`` in its status document (``last_error``), and
    opens the sink again and writes the same batch after a backoff
    (``errors.restart_backoff_s`` doubling to ``errors.restart_max_backoff_s``),
    without bound and whatever ``errors.tolerance`` says. Offsets stay behind the batch.

    Args:
        message: what the target said, first (``permission denied for table items``).
    """


class BatchRefusedError(ThreesError):
    """The target refused a write of several records because of one or more of them, without naming which.

    A sink raises it when one statement or request carried the batch (a transaction,
    a ``COPY``, an object); the sink runtime then writes halves of the batch until the
    refused records stand alone (Debezium's JDBC sink unrolls a failed batch the
    same way), and judges each (see :class:`~connectors.runtime.sink.RecordFailure`).

    Args:
        message: what the target said.
        error: the target's error as an exception for the dead letter headers (its class
            name and message), without statement or parameters; this error when ``None``.
        about_data: ``True`` when the target named the data as the reason (a value out of
            range or too long, an invalid value, a constraint on the data); ``False`` when
            the reason may be the target's (an internal error).
    """

    def __init__(self, message: str, error: BaseException | None = None, *, about_data: bool = True):
        super().__init__(message)
        self.error = error
        self.about_data = about_data


class FatalError(ThreesError):
    """The task cannot go on; retrying will not help (bad schema, missing table...)."""


class SkippableRecordError(ThreesError):
    """One record cannot be processed; it goes to the dead letter queue with this reason."""
