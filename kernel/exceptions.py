"""Errors of threes, grouped by what the caller does about them.

The root taxonomy is defined in :mod:`schemas.exceptions`, the bottom layer, so the wire
format raises the same classes; the framework, the connectors and the runtimes import it
from here, where the sink runtime's own two are added (:mod:`sync_service.isolation`):

* :class:`ConfigError` - fix the config file; carries every problem with its path.
* :class:`SetupError` - a system cannot be reached or refuses our credentials.
* :class:`RetriableError` / :class:`SinkBackpressureError` - try again later.
* :class:`SinkBlockedError` - the target refuses every record (no privilege, a missing
  table or column, read-only, disk full): pause, try again later, never dead-letter.
* :class:`BatchRefusedError` - the target refused a write because of some record(s)
  without naming which: the sink runtime bisects the batch to find them.
* :class:`FatalError` - stop the task; retrying cannot help.
* :class:`SkippableRecordError` - send this one record to the dead letter queue.
"""

from __future__ import annotations

from schemas.exceptions import (
    ConfigError,
    ConfigProblem,
    FatalError,
    RetriableError,
    SetupError,
    SinkBackpressureError,
    SkippableRecordError,
    ThreesError,
)


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
    same way), and judges each (see :class:`~connectors.api.sink.RecordFailure`).

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


__all__ = [
    "BatchRefusedError",
    "ConfigError",
    "ConfigProblem",
    "FatalError",
    "RetriableError",
    "SetupError",
    "SinkBackpressureError",
    "SinkBlockedError",
    "SkippableRecordError",
    "ThreesError",
]
