"""Replay the rows of a CSV file or a SQL table as Avro events into a Kafka topic.

Each row becomes one record: the value is the row encoded with a value schema,
the key the row's natural key fields encoded with a key schema (a record; by
default the value schema's key fields, named ``<Name>Key``), both in the
project's single-object encoding with the writer schemas registered in the
schema topic (:mod:`schemas.serde`). Records are produced in the rows' order,
either as fast as the producer goes or at a fixed rate (events per second,
paced in small steps so a burst never runs ahead of the schedule by more than
about 10 ms). The Kafka record timestamp is the produce time, which is what
event -> sink latencies are measured from. A record's partition is the CRC-32
of its key bytes modulo the partition count (:func:`partition_for`), so equal
keys share a partition and anyone holding a key knows where it went. Rows that
come from an Arrow table (a CSV file, a dataset) are encoded a thousand at a
time by :class:`connectors.runtime.columnar.ColumnarEncoder`, the same bytes as
``fastavro``'s at about a fifth of its CPU; other rows one at a time.

Delivery: ``acks=all`` with an idempotent producer (:func:`kernel.kafka.clients.kafka_producer`),
so a record acknowledged is in the log once; :meth:`Replayer.run` returns only after
every record was acknowledged or failed, and reports failures by count.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from connectors.runtime.columnar import ColumnarEncoder, ColumnarUnsupported
from kernel.config.models import KafkaConfig
from kernel.exceptions import ConfigError, RetriableError, SetupError
from kernel.kafka import clients
from kernel.updates import with_source_ts
from threes.demo.rows import (
    Row,
    RowSource,
    arrow_rows,
    csv_source,
    filter_table,
    sort_table,
    sql_source,
    table_source,
)

log = logging.getLogger(__name__)

COLUMNAR_ROWS = 1_000
"""Rows of an Arrow table encoded per columnar call (the same bytes as ``fastavro`` one row at a time, for a
fraction of its CPU)."""

__all__ = [
    "ReplayStats", "Replayer", "Row", "RowSource", "arrow_rows", "csv_source", "ensure_event_topic", "filter_table",
    "key_schema_for", "partition_for", "sort_table", "sql_source", "table_source", "topic_partitions",
]


# -- keys and schemas ------------------------------------------------------------------------------


def key_schema_for(value_schema: dict[str, Any], key: Sequence[str]) -> dict[str, Any]:
    """The key schema of a value schema: a record of the key fields, named ``<Name>Key``.

    Args:
        value_schema: a record schema.
        key: the key field names, in key order.

    Returns:
        ``{"type": "record", "name": "<Name>Key", "namespace": ..., "fields": [...]}``.

    Raises:
        ConfigError: a key field is not in the schema, or is nullable (a key must exist).
    """
    fields = {f["name"]: f for f in value_schema["fields"]}
    out = []
    for name in key:
        if name not in fields:
            raise ConfigError(f"key field {name!r} is not in schema {value_schema.get('name')}")
        typ = fields[name]["type"]
        if isinstance(typ, list) and "null" in typ:
            raise ConfigError(
                f"key field {name!r} is nullable in schema {value_schema.get('name')}: a key needs a value"
            )
        out.append({"name": name, "type": typ})
    full = value_schema["name"]
    name = full.rsplit(".", 1)[-1] + "Key"
    schema: dict[str, Any] = {"type": "record", "name": name, "fields": out}
    namespace = value_schema.get("namespace") or (full.rsplit(".", 1)[0] if "." in full else None)
    if namespace:
        schema["namespace"] = namespace
    return schema


def ensure_event_topic(kafka: KafkaConfig, topic: str, partitions: int) -> bool:
    """Create an event topic (``cleanup.policy=delete``) when it is missing.

    Returns:
        ``True`` when created, ``False`` when it existed (whatever its partitions).

    Raises:
        SetupError: Kafka cannot be reached or refused the creation.
    """
    from confluent_kafka import KafkaException

    from kernel.kafka.topics import create_topic, internal_topic_options

    admin = clients.kafka_admin(kafka)
    try:
        meta = admin.list_topics(timeout=kafka.request_timeout_s)
    except KafkaException as exc:
        raise SetupError(f"Kafka at {kafka.bootstrap_servers} did not answer: {exc}",
                         "start the local stack with `threes local up`") from exc
    if topic in meta.topics and meta.topics[topic].error is None:
        return False
    created = create_topic(kafka.librdkafka_config(), topic, partitions=partitions,
                           timeout_s=kafka.request_timeout_s, metadata=meta, **internal_topic_options(kafka))
    if created is None:
        return False
    log.info("created event topic=%s partitions=%d", topic, partitions)
    return True


# -- the replayer ------------------------------------------------------------------------------------


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of a key: CRC-32 of the key bytes modulo the partition count.

    The same rule as librdkafka's ``consistent`` partitioner, made explicit so
    that whoever holds a key (the demo's checks) knows its partition.
    """
    return zlib.crc32(key) % partitions


def topic_partitions(kafka: KafkaConfig, topic: str) -> int:
    """How many partitions a topic has.

    Raises:
        SetupError: the topic does not exist.
    """
    meta = clients.kafka_admin(kafka).list_topics(topic, timeout=kafka.request_timeout_s).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise SetupError(f"topic {topic!r} does not exist")
    return len(meta.partitions)


@dataclass
class ReplayStats:
    """Progress and outcome of a replay; the counters are updated while it runs.

    Attributes:
        total: rows to replay (``None`` when unknown).
        produced: records handed to the producer.
        acked: records the broker acknowledged.
        failed: records the broker refused or that timed out.
        first_error: the first delivery error, readable.
        started: wall-clock time (``time.time()``) of the first produce, or ``None``.
        finished: wall-clock time when every record was acknowledged or failed.
    """

    total: int | None = None
    produced: int = 0
    acked: int = 0
    failed: int = 0
    first_error: str | None = None
    started: float | None = None
    finished: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def delivered(self, err: Any, _msg: Any) -> None:
        """The producer's delivery callback: count the acknowledgement or the failure (the first one kept)."""
        with self._lock:
            if err is None:
                self.acked += 1
            else:
                self.failed += 1
                if self.first_error is None:
                    self.first_error = str(err)

    @property
    def elapsed_s(self) -> float:
        """Seconds from the first produce to the last acknowledgement (or to now while running)."""
        if self.started is None:
            return 0.0
        return (self.finished or time.time()) - self.started

    @property
    def rate(self) -> float:
        """Acknowledged records per second so far."""
        return self.acked / self.elapsed_s if self.elapsed_s > 0 else 0.0


class Replayer:
    """Produce rows as keyed Avro events into one topic.

    Args:
        kafka: the Kafka connection.
        topic: the event topic (created with ``partitions`` when missing; not compacted).
        value_schema: the Avro record schema of the values (the writer schema).
        key: the key field(s) of each row.
        key_schema: the key's record schema; :func:`key_schema_for` when ``None``.
        partitions: partitions of the topic when it is created.
        rate: events per second, or ``None`` for as fast as possible.
        store: the schema store the writer schemas are registered in; a
            :class:`~schemas.store.SchemaStore` on ``kafka.schema_topic`` when ``None``.

    Raises:
        ConfigError: a key field is missing from the value schema.
        SetupError: Kafka cannot be reached.
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        topic: str,
        value_schema: dict[str, Any],
        key: Sequence[str],
        *,
        key_schema: dict[str, Any] | None = None,
        partitions: int = 4,
        rate: float | None = None,
        store: Any | None = None,
    ):
        from schemas.serde import AvroSerializer
        from schemas.store import SchemaStore

        if rate is not None and rate <= 0:
            raise ConfigError(f"rate must be > 0 events/s (got {rate})")
        self.kafka = kafka
        self.topic = topic
        self.key = list(key)
        self.rate = rate
        self.partitions = partitions
        key_schema = key_schema or key_schema_for(value_schema, self.key)
        key_fields = [f["name"] for f in key_schema["fields"]]
        if key_fields != self.key:
            raise ConfigError(f"key schema {key_schema.get('name')} has fields {key_fields}, the key is {self.key}")
        store = store if store is not None else SchemaStore(kafka.librdkafka_config(), kafka.schema_topic)
        self.value_serializer = AvroSerializer(value_schema, store)
        self.key_serializer = AvroSerializer(key_schema, store)
        try:  # rows of an Arrow table: keys and values encoded a batch of columns at a time, the same bytes
            self.columnar: ColumnarEncoder | None = ColumnarEncoder(
                value_schema, self.value_serializer.header, key_schema, self.key_serializer.header
            )
        except ColumnarUnsupported as exc:
            self.columnar = None
            log.debug("replay topic=%s: rows are encoded one at a time: %s", topic, exc)

    def _encoded(self, source: RowSource) -> Iterator[tuple[Row, bytes | None, bytes | None]]:
        """``(row, key, value)`` in row order; key and value are ``None`` when the row is left to the per-row encoder.

        Rows of an Arrow table are encoded :data:`COLUMNAR_ROWS` at a time by the
        columnar encoder (the same bytes as ``fastavro``'s); a batch it cannot
        write (a null in a non-null field...) and rows of other sources go one
        at a time, which names the row that does not match the schema.
        """
        table = source.table
        if table is None or self.columnar is None:
            for row in source.rows:
                yield row, None, None
            return
        for first in range(0, table.num_rows, COLUMNAR_ROWS):
            chunk = table.slice(first, COLUMNAR_ROWS)
            try:
                keys, values = self.columnar.encode(chunk)
            except (ValueError, TypeError, ArithmeticError, KeyError) as exc:  # pyarrow's are ValueError/TypeError
                log.debug("replay topic=%s rows %d+: encoded one at a time: %s", self.topic, first + 1, exc)
                for row in arrow_rows(chunk):
                    yield row, None, None
                continue
            yield from zip(arrow_rows(chunk), keys, values, strict=True)

    def run(
        self,
        source: RowSource,
        stats: ReplayStats | None = None,
        stop: threading.Event | None = None,
        on_produce: Callable[[int, Row], None] | None = None,
    ) -> ReplayStats:
        """Produce every row of ``source``, wait for every acknowledgement, and return the counts.

        Args:
            source: the rows.
            stats: counters to update while running (another thread may read them).
            stop: set it to stop producing early; what was produced is still flushed.
            on_produce: called with (row index, row) right after each row is handed to
                the producer (the demo samples latencies this way).

        Returns:
            The final :class:`ReplayStats`.

        Raises:
            SetupError: Kafka cannot be reached.
            RetriableError: some records were not acknowledged (the count and the first error).
            SkippableRecordError never: a row that does not match the schema is a
            :class:`~kernel.exceptions.ConfigError` naming the row.
        """
        stats = stats or ReplayStats()
        stats.total = source.total
        ensure_event_topic(self.kafka, self.topic, self.partitions)
        partitions = topic_partitions(self.kafka, self.topic)
        producer = clients.kafka_producer(self.kafka, linger_ms=50, batch_num_messages=10_000,
                                          queue_buffering_max_messages=200_000)
        step = max(1, int(self.rate / 100)) if self.rate else 1_000
        began = time.monotonic()
        stats.started = time.time()
        for index, (row, key, value) in enumerate(self._encoded(source)):
            if stop is not None and stop.is_set():
                break
            if key is None or value is None:
                key, value = self._encode_row(source, index, row)
            while True:
                try:
                    # threes.source_ts: the event enters the system now (freshness is measured from it)
                    producer.produce(self.topic, value=value, key=key, partition=partition_for(key, partitions),
                                     on_delivery=stats.delivered, headers=with_source_ts(None, int(time.time() * 1000)))
                    break
                except BufferError:
                    producer.poll(0.05)  # the local queue is full: let deliveries drain it
            stats.produced = index + 1
            if on_produce is not None:
                on_produce(index, row)
            if (index + 1) % step == 0:
                producer.poll(0)
                if self.rate:
                    ahead = (index + 1) / self.rate - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)
        remaining = producer.flush(120)
        stats.finished = time.time()
        self._report(source, stats, remaining)
        return stats

    def _encode_row(self, source: RowSource, index: int, row: Row) -> tuple[bytes, bytes]:
        """``(key, value)`` of one row, encoded on its own (a row the columnar encoder left).

        Raises:
            ConfigError: the row does not match the schema (named by its number in ``source``).
        """
        from schemas.exceptions import SerdeError

        try:
            return self.key_serializer({k: row[k] for k in self.key}), self.value_serializer(row)
        except (SerdeError, KeyError) as exc:
            raise ConfigError(f"{source.description}: row {index + 1} does not match the schema: {exc}") from exc

    def _report(self, source: RowSource, stats: ReplayStats, remaining: int) -> None:
        """Log the replay's summary line.

        Raises:
            RetriableError: some records were not acknowledged (the count and the first error).
        """
        log.info("replay topic=%s source=%s produced=%d acked=%d failed=%d elapsed_s=%.1f rate=%.0f/s",
                 self.topic, source.description, stats.produced, stats.acked, stats.failed, stats.elapsed_s,
                 stats.rate)
        if remaining or stats.failed:
            raise RetriableError(
                f"replay into {self.topic!r}: {stats.failed + remaining} of {stats.produced} record(s) not "
                f"acknowledged (first error: {stats.first_error or 'flush timeout'})"
            )
