"""The sink contract: what the sync service hands a sink and what it expects back.

After quix-streams' ``sinks/base`` (``add`` -> ``flush`` -> ``write(batch)``, one
batch per topic partition) and Kafka Connect's ``SinkTask.put/flush``: the sync
service (:mod:`sync_service`) consumes update topics, cuts one
:class:`SinkBatch` per (topic, partition), and calls :meth:`Sink.write` from a
worker thread. The offsets a batch covers are committed only after ``write``
returned, so a sink never commits anything itself.

What ``write`` may do, and what the runtime does about it:

* return normally, with a list of :class:`RecordFailure` for records the target
  refused (a field Elasticsearch rejects, a value the database refuses): the
  runtime judges them (below); the batch is done;
* raise :class:`~kernel.exceptions.BatchRefusedError` (a statement carrying
  the batch failed because of some record, and the target did not say which):
  the runtime writes halves of the batch until the refused records stand alone;
* raise :class:`~kernel.exceptions.SinkBlockedError` (no privilege, missing
  table or column, read-only, disk full: any record would hit it): the
  partitions feeding the sink pause, ``blocked: ...`` shows in the status, and
  the sink is opened again and the batch written again after a backoff,
  without bound; nothing is dead-lettered, whatever ``errors.tolerance`` says;
* raise :class:`~kernel.exceptions.SinkBackpressureError` (HTTP 429, lock
  timeout): the partitions feeding the sink are paused and the whole batch is
  written again after ``retry_after`` seconds, without bound (the target is
  alive, only busy);
* raise :class:`~kernel.exceptions.RetriableError`: retried with jittered
  exponential backoff up to the service's retry policy, then the service stops
  without committing (nothing is lost, a restart resumes from the last commit);
* raise :class:`~kernel.exceptions.FatalError`: the service stops without
  committing the batch.

Writing the same batch twice must change nothing (the update-topic contract of
``kernel/updates.py``: a version per key, applied only when newer).

**Record error or target error: by blast radius** (``sync_service/isolation.py``
applies the rule, once for every sink). A refused record goes to the dead letter
topic only when

* the target named *its data* as the reason (:attr:`RecordFailure.about_data`: a
  value out of range or too long, an invalid value, a constraint on the data, a
  field the index mapping refuses, a record over ``max_record_bytes``), or
* another record of the same batch was applied: a retry of the record alone
  reproduces the refusal while its neighbours succeed (a document Elasticsearch
  answers 429 after every retry while the rest of its bulk is indexed).

Any other refusal, including that of a batch of one record that has no
neighbour to compare with, is the target's: the batch is blocked
(:class:`~kernel.exceptions.SinkBlockedError`), never dead-lettered. A
sink therefore raises :class:`~kernel.exceptions.SinkBlockedError` at
once for errors it knows every record would hit (PostgreSQL SQLSTATE 42501,
42P01, 42703, 25006, 53100; Elasticsearch ``cluster_block_exception``; S3
``AccessDenied``), and returns or raises the others with what it knows.

The records, batches and refusals are defined in :mod:`connectors.api.sink_records`, the limiters in
:mod:`connectors.api.limiter`; every name stays importable from here (the public SDK path).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import ClassVar

# re-exported: third parties import these from connectors.api.sink (the public SDK path)
from connectors.api.limiter import FixedLimiter as FixedLimiter
from connectors.api.limiter import Limiter as Limiter
from connectors.api.sink_records import RecordFailure as RecordFailure
from connectors.api.sink_records import SinkBatch as SinkBatch
from connectors.api.sink_records import SinkRecord as SinkRecord
from connectors.api.sink_records import latest_per_key as latest_per_key
from connectors.api.sink_records import records_from_columns as records_from_columns
from kernel.config.models import ConnectionConfig, SinkConnectorConfig
from kernel.config.policies import BatchPolicy


class Sink(ABC):
    """Base class of every sink connector (``{Technology}Sink``).

    Subclasses implement :meth:`write`, and usually :meth:`open`, :meth:`check`
    and :meth:`close`. The runtime calls ``open`` once, then ``write`` from up
    to ``limiter.limit`` worker threads at once, each time with a batch of a
    different partition, and ``close`` at shutdown. ``write`` must therefore be
    thread-safe, and idempotent (see the module docstring).

    Args:
        config: the sink's validated config (a ``SinkConnectorConfig`` subclass).
        connection: the connection config it names (its technology's ``ConnectionConfig`` subclass).
        limiter: concurrency to the target; a fixed limit of 1 when ``None``.

    Class attributes:
        splits_requests: ``True`` when ``write`` sends several requests and holds
            ``limiter.slot()`` around each itself; otherwise the runtime holds one
            slot around the whole ``write``.
        default_max_record_bytes: the target's own limit of one record, bytes (the
            default of the config's ``max_record_bytes``); ``None``: none known.
    """

    splits_requests: ClassVar[bool] = False
    default_max_record_bytes: ClassVar[int | None] = None

    @property
    def max_record_bytes(self) -> int | None:
        """The largest record this sink writes, bytes of key and value as consumed; ``None``: no limit.

        The config's ``max_record_bytes``, else the target's own limit
        (:attr:`default_max_record_bytes`). A larger record goes to the dead letter topic
        without being sent (the sink runtime checks it).
        """
        configured = getattr(self.config, "max_record_bytes", None)
        return configured if configured is not None else self.default_max_record_bytes

    def __init__(self, config: SinkConnectorConfig, connection: ConnectionConfig, *, limiter: Limiter | None = None):
        self.config = config
        self.connection = connection
        self.limiter: Limiter = limiter or FixedLimiter(1)
        self.name = config.name

    def open(self) -> None:  # noqa: B027 - optional hook
        """Connect and prepare the target (create a table or index, clean up leftovers).

        Raises:
            SetupError: the target cannot be reached.
            FatalError: the target cannot be prepared (missing table, no permission).
        """

    def check(self) -> None:  # noqa: B027 - optional hook
        """Verify, without side effects, that the target answers and accepts our credentials.

        Raises:
            SetupError: it does not.
        """

    @abstractmethod
    def write(self, batch: SinkBatch) -> list[RecordFailure]:
        """Apply a batch durably: when this returns, every record is in the target or refused.

        Args:
            batch: decoded records of one (topic, partition), in offset order.

        Returns:
            The records the target refused for good (to the dead letter topic).

        Raises:
            SinkBackpressureError: the target is busy; the batch is written again later.
            RetriableError: a transient failure; retried with backoff, bounded.
            FatalError: the target cannot be written; the service stops.
        """

    def batch_policy(self, default: BatchPolicy) -> BatchPolicy:
        """The batch limits for this sink's partitions (S3: one batch = one object).

        Args:
            default: the sync service's batch policy.

        Returns:
            The policy to use; ``default`` unless the sink has its own limits.
        """
        return default

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release clients and pools."""


def monotonic_ms() -> float:
    """Monotonic clock in milliseconds (batch ages)."""
    return time.monotonic() * 1000.0
