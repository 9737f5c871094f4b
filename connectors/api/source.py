"""What a source connector author writes: a :class:`SourceTask` that yields :class:`SourceBatch` es.

The model is Kafka Connect's ``SourceTask`` (``poll()`` returns records that
each carry a *source offset*; the worker produces them and stores the offsets
once the broker acknowledged them), with three Python-shaped changes:

* ``poll()`` is a generator of batches for one polling cycle; the cycle ends
  when the task has caught up with its system, and the worker sleeps
  ``poll_interval_s`` before the next one. The position travels with the batch,
  not with each record, so the hot loop stays cheap.
* Records are plain ``(key, value)`` pairs of dicts (Avro records). ``value``
  ``None`` is a tombstone. A key may also be ``bytes`` already encoded (the
  tombstones that reconciliation finds in the state topic).
* Deletes without change data capture: :meth:`SourceTask.reconcile` receives the
  live keys of the state topic and yields tombstones for the keys whose entity
  vanished (and may re-emit entities the topic lacks).

A connector author never touches the producer, the offsets topic or the
schema store: the worker (:mod:`connectors.runtime.worker`) owns them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from kernel.config.models import ConnectionConfig, KafkaConfig, SourceConnectorConfig

if TYPE_CHECKING:
    import pyarrow as pa

Key = Mapping[str, Any] | bytes
Value = Mapping[str, Any] | None
SourceRecord = tuple[Key, Value]
"""``(key, value)``: key an Avro record as a dict (or encoded key bytes), value a dict or ``None`` (tombstone)."""


@dataclass
class SourceBatch:
    """Records of one poll step and the source position right after them.

    Attributes:
        records: ``(key, value)`` pairs, in the order they must reach the topic.
        position: the JSON-serializable source position once every record of
            this batch (and of every batch before it) is acknowledged, or
            ``None`` when this batch does not move the position (tombstones of
            a reconciliation, for example).
        headers: Kafka headers put on every record of the batch (the S3 source
            names the object a row came from); ``None`` for none.
        rows_read: rows read from the system for this batch, for progress and
            metrics (may exceed ``len(records)`` when rows were skipped on purpose).
        columns: the batch's entities column-wise instead of ``records``: a
            ``pyarrow.Table`` with one column per value field (Avro names, the
            types of :func:`schemas.arrow.arrow_type`), keys taken from the key
            fields. The worker encodes it in one call
            (:class:`~connectors.runtime.columnar.ColumnarEncoder`) instead of
            once per record; ``records`` is then empty. No tombstones.
        source_ts_ms: when the batch's changes were committed in the system,
            epoch milliseconds (the newest of them), if the connector knows it;
            the worker stamps every record with it (header ``threes.source_ts``),
            or with the time it read the batch when ``None``.
        continues: the batch is a part of one transaction of the system whose
            remaining records follow in the next batches (a change stream's large
            transaction, split every ``batch_records``). With ``exactly_once`` the
            worker commits no Kafka transaction after such a batch, so a system
            transaction is never split over Kafka transactions (a stop in the
            middle aborts the open one; it is read again).
    """

    # a Sequence (read-only, covariant): a connector may hand over its list[tuple[dict, dict]] as is
    records: Sequence[SourceRecord]
    position: dict[str, Any] | None
    headers: list[tuple[str, bytes]] | None = None
    rows_read: int | None = None
    columns: pa.Table | None = None
    source_ts_ms: int | None = None
    continues: bool = False

    def __post_init__(self) -> None:
        if self.rows_read is None:
            self.rows_read = len(self.records) if self.columns is None else self.columns.num_rows


def tombstone_batches(keys: Iterable[bytes], size: int) -> Iterator[SourceBatch]:
    """Tombstones for encoded keys whose entities are gone, ``size`` per batch (position unmoved).

    Args:
        keys: encoded key bytes (e.g. ``LiveKeys.unseen()``), consumed lazily.
        size: records per batch (the source's ``batch_records``).
    """
    batch: list[SourceRecord] = []
    for key in keys:
        batch.append((key, None))
        if len(batch) >= size:
            yield SourceBatch(batch, None)
            batch = []
    if batch:
        yield SourceBatch(batch, None)


@dataclass(frozen=True)
class SourceSchemas:
    """The Avro schemas a task writes: registered once in the schema store by the worker.

    Attributes:
        key: Avro record schema of the entity key (composite keys are several fields).
        value: Avro record schema of the entity.
    """

    key: dict[str, Any]
    value: dict[str, Any]


class LiveKeyView(Protocol):
    """The live keys of a state topic as a task reads them: encoded key bytes -> the ``source_header`` tag.

    A plain ``dict[bytes, str | None]`` is one (tests); the worker's
    :class:`~connectors.runtime.state.LiveKeys` is one on disk, and adds ``split``, ``unseen``
    and ``by_tag`` to compare in bounded memory (a task checks for them with ``hasattr``).
    """

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` (encoded key bytes) is live."""

    def __len__(self) -> int:
        """Live keys."""

    def __iter__(self) -> Iterator[bytes]:
        """The live keys (encoded)."""

    def items(self) -> Iterable[tuple[bytes, str | None]]:
        """``(encoded key, its tag)`` per live key; the tag is ``None`` when its record has no such header."""


@runtime_checkable
class BoundedLiveKeys(LiveKeyView, Protocol):
    """Live keys that compare in bounded memory (the worker's on-disk ``LiveKeys``); ``isinstance`` tells."""

    def split(self, keys: Iterable[bytes]) -> list[bytes]:
        """Mark the live ones of ``keys`` seen; return the others (not live), in their order."""

    def unseen(self) -> Iterator[bytes]:
        """The live keys never marked seen by :meth:`split`."""

    def by_tag(self) -> Iterator[tuple[str, list[bytes]]]:
        """``(tag, its live keys)`` per tag, one tag's keys at a time (keys without a tag left out)."""


@dataclass
class TopicState:
    """The live keys of a state topic, read to its end offsets by the worker for reconciliation.

    Attributes:
        live: encoded key bytes -> the value of the record's ``source_header``
            header (``None`` when absent) for every key whose latest record is
            not a tombstone: a :class:`~connectors.runtime.state.LiveKeys` on
            disk (reads like a mapping; compare in bounded memory with its
            ``split`` / ``unseen`` / ``by_tag``), or a plain ``dict`` in tests.
        encode_key: turns a key dict into the exact bytes the worker writes,
            so a task compares keys as bytes, the way compaction does.
    """

    live: LiveKeyView
    encode_key: Callable[[Mapping[str, Any]], bytes]
    end_offsets: dict[int, int] = field(default_factory=dict)


class SourceTask(ABC):
    """Base of every source connector (``{Technology}Source``).

    Subclasses set ``source_header`` when they tag records with where they came
    from, implement :meth:`open`, :meth:`poll` and usually :meth:`reconcile`,
    and translate transient failures of their system into
    :class:`~kernel.exceptions.RetriableError` (the worker retries the cycle
    with backoff) and permanent ones into :class:`~kernel.exceptions.FatalError`.

    Args:
        config: the connector's validated config model.
        connection: the validated connection the config names (its technology's
            :class:`~kernel.config.models.ConnectionConfig` subclass).
        kafka: the pipeline's Kafka config (read-only; the worker owns the clients).
        task_id: this task's index, ``0 <= task_id < task_count``.
        task_count: how many tasks the connector was split into.
    """

    source_header: ClassVar[str | None] = None

    def __init__(
        self,
        config: SourceConnectorConfig,
        connection: ConnectionConfig,
        *,
        kafka: KafkaConfig | None = None,
        task_id: int = 0,
        task_count: int = 1,
    ):
        self.config = config
        self.connection = connection
        self.kafka = kafka
        self.task_id = task_id
        self.task_count = task_count

    @classmethod
    def task_count_for(cls, config: SourceConnectorConfig) -> int:
        """How many tasks this connector runs as (Kafka Connect's ``tasks.max``); 1 unless overridden."""
        return 1

    @property
    def name(self) -> str:
        """The connector's name from config."""
        return self.config.name

    @abstractmethod
    def open(self, position: Mapping[str, Any] | None) -> SourceSchemas:
        """Connect, check the source exists, and resume from ``position``.

        Args:
            position: the last position the worker stored for this task, or
                ``None`` to start with a full snapshot.

        Returns:
            The key and value schemas of the records this task will yield.

        Raises:
            SetupError: the system cannot be reached.
            ConfigError: the table/index/bucket does not fit the config.
        """

    @abstractmethod
    def poll(self) -> Iterator[SourceBatch]:
        """Yield batches until caught up with the system (one polling cycle).

        Raises:
            RetriableError: a transient failure; the worker retries the cycle and
                the task resumes from its in-memory position.
            FatalError: the task cannot go on.
        """

    def reconcile(self, state: TopicState) -> Iterator[SourceBatch]:
        """Yield tombstones for keys live in the topic whose entity no longer exists.

        The default yields nothing (a source without deletes).

        Args:
            state: live keys of the state topic, read after every record
                produced so far was acknowledged.
        """
        return iter(())

    def records_behind(self) -> int | None:
        """Records the system holds past this task's position (for ``threes status``); ``None`` when unknown.

        Called from another thread than :meth:`poll` (the status endpoint), at
        most every few seconds: it must be a cheap read that changes nothing.
        """
        return None

    def reconciles(self) -> bool:
        """Whether this task takes part in reconciliation (one task may do it for all of its connector)."""
        return True

    def wants_reconcile(self) -> bool:
        """Whether the last cycle found something only a reconciliation can settle.

        The worker asks after every cycle, besides reconciling every
        ``reconcile_interval_s``: a finished bulk snapshot, a changed S3 object.
        """
        return False

    def commit(self, position: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook
        """The worker stored ``position``: every record before it is acknowledged (or committed, with transactions).

        Kafka Connect's ``SourceTask.commit()``: a source whose system keeps its
        own read position (a PostgreSQL replication slot) moves it here, never
        earlier. Called on the worker's thread, between batches.

        Args:
            position: a position this task yielded.
        """

    def describe_field(self, field: str) -> str:
        """Name a value field for an error message (the RDS source says ``column "amount"``)."""
        return f"field {field!r}"

    def describe_key(self, key: Key) -> str:
        """Name a record for an error message, e.g. ``table "t" key {'id': 5}``."""
        return f"key {dict(key) if isinstance(key, Mapping) else key!r}"

    def origin(self) -> str:
        """Where this task's records are read, for a dead letter's ``dlq.source.table`` (the RDS source: the table).

        The default is the connector's name.
        """
        return self.config.name

    def field_origin(self, field: str) -> str:
        """The system's name of a value field, for a dead letter's ``dlq.source.column`` (RDS: the column)."""
        return field

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections; called once, also after a failure."""
