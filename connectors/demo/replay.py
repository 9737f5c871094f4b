"""Replay the rows of a CSV file or a SQL table as Avro events into a Kafka topic.

Each row becomes one record: the value is the row encoded with a value schema,
the key the row's natural key fields encoded with a key schema (a record; by
default the value schema's key fields, named ``<Name>Key``), both in the
project's single-object encoding with the writer schemas registered in the
schema topic (:mod:`schemas.serde`). Records are produced in the rows' order,
either as fast as the producer goes or at a fixed rate (events per second,
paced in small steps so a burst never runs ahead of the schedule by more than
about 10 ms). The Kafka record timestamp is the produce time, which is what
event -> sink latencies are measured from.

Delivery: ``acks=all`` with an idempotent producer (:func:`connectors.clients.kafka_producer`),
so a record acknowledged is in the log once; :meth:`Replayer.run` returns only after
every record was acknowledged or failed, and reports failures by count.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connectors import clients
from connectors.config.models import KafkaConfig, RdsConnection
from connectors.exceptions import ConfigError, RetriableError, SetupError

log = logging.getLogger(__name__)

Row = dict[str, Any]


# -- rows ------------------------------------------------------------------------------------------


def _python_column(col: Any) -> list[Any]:
    """An Arrow column as Python values, nulls as ``None``, timestamps as epoch integers.

    Arrow's ``to_pylist`` builds one Python object per value through Arrow
    scalars; going through NumPy is several times faster on 336,776 rows.
    Timestamps stay integers in the column's unit (what Avro's
    ``timestamp-micros`` holds), which fastavro writes as they are.
    """
    import pyarrow as pa

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.int64())
    if pa.types.is_date(col.type) or pa.types.is_binary(col.type):
        return col.to_pylist()
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col.to_numpy(zero_copy_only=False).tolist()
    if col.null_count:
        nulls = col.is_null().to_numpy(zero_copy_only=False).nonzero()[0].tolist()
        values = col.fill_null(0 if not pa.types.is_boolean(col.type) else False).to_numpy(
            zero_copy_only=False
        ).tolist()
        for i in nulls:
            values[i] = None
        return values
    return col.to_numpy(zero_copy_only=False).tolist()


def arrow_rows(table: Any, batch_rows: int = 20_000) -> Iterator[Row]:
    """Yield the rows of an Arrow table as dicts, one batch of columns converted at a time."""
    names = table.column_names
    for batch in table.to_batches(max_chunksize=batch_rows):
        columns = [_python_column(batch.column(i)) for i in range(batch.num_columns)]
        for values in zip(*columns, strict=True):
            yield dict(zip(names, values, strict=True))


def filter_table(table: Any, match: Mapping[str, Sequence[str]] | None = None, limit: int | None = None) -> Any:
    """Keep the rows whose columns hold one of the given values, then the first ``limit`` of them.

    Args:
        table: an Arrow table.
        match: column -> accepted values written as text (``{"month": ["1"], "day": ["1", "2"]}``);
            every column must match (AND), any listed value (OR).
        limit: at most this many rows.

    Raises:
        ConfigError: a column is not in the table, or a value does not parse as its type.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    for column, values in (match or {}).items():
        if column not in table.column_names:
            raise ConfigError(f"--match {column}=...: no column {column!r} (have: {', '.join(table.column_names)})")
        typ = table.schema.field(column).type
        try:
            wanted = pa.array(list(values), pa.string()).cast(typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ConfigError(f"--match {column}={','.join(values)}: not values of type {typ}: {exc}") from exc
        table = table.filter(pc.is_in(table.column(column), value_set=wanted))
    if limit is not None:
        table = table.slice(0, limit)
    return table


@dataclass
class RowSource:
    """Rows to replay and how many there are (for the progress bar).

    Attributes:
        rows: the rows, as dicts of the value schema's fields.
        total: how many rows ``rows`` yields, or ``None`` when unknown.
        description: what they are, for logs and the progress bar.
    """

    rows: Iterable[Row]
    total: int | None
    description: str


def csv_source(
    path: str | Path,
    value_schema: dict[str, Any],
    *,
    match: Mapping[str, Sequence[str]] | None = None,
    limit: int | None = None,
    null_values: Sequence[str] = ("NA",),
) -> RowSource:
    """The rows of a CSV file (or a ``.zip`` holding one), typed by the value schema.

    Raises:
        ConfigError: the file is missing or does not match the schema (see
            :func:`connectors.demo.data.read_csv`).
    """
    from connectors.demo.data import read_csv

    table = filter_table(read_csv(path, value_schema, null_values=null_values), match, limit)
    return RowSource(arrow_rows(table), table.num_rows, str(path))


def table_source(table: Any, description: str, *, match: Mapping[str, Sequence[str]] | None = None,
                 limit: int | None = None) -> RowSource:
    """The rows of an Arrow table already in memory (e.g. a dataset table read once)."""
    table = filter_table(table, match, limit)
    return RowSource(arrow_rows(table), table.num_rows, description)


def sql_source(
    conn: RdsConnection,
    table: str,
    value_schema: dict[str, Any],
    *,
    schema_name: str | None = None,
    match: Mapping[str, Sequence[str]] | None = None,
    limit: int | None = None,
    order_by: Sequence[str] | None = None,
) -> RowSource:
    """The rows of a SQL table, selected with SQLAlchemy Core (identifiers are quoted, never spliced).

    Rows are streamed from a server-side cursor, 5,000 at a time.

    Args:
        conn: the database.
        table: the table name.
        value_schema: the record schema; its fields must be columns of the table.
        schema_name: the database schema of the table.
        match: column -> accepted values (``IN``), as for CSV files.
        limit: at most this many rows.
        order_by: columns to order by (default: the table's primary key, else none).

    Raises:
        ConfigError: the table or a field's column does not exist.
        SetupError: the database cannot be reached.
    """
    from sqlalchemy import MetaData, Table, func, select
    from sqlalchemy.exc import NoSuchTableError, SQLAlchemyError

    engine = clients.sql_engine(conn)
    try:
        tbl = Table(table, MetaData(), schema=schema_name, autoload_with=engine)
    except NoSuchTableError as exc:
        engine.dispose()
        raise ConfigError(f"table {table!r} does not exist") from exc
    except SQLAlchemyError as exc:
        engine.dispose()
        raise SetupError(f"cannot read table {table!r}: {exc}") from exc
    names = [f["name"] for f in value_schema["fields"]]
    missing = [n for n in names if n not in tbl.c]
    if missing:
        engine.dispose()
        raise ConfigError(f"table {table!r} has no column(s) {missing} of schema {value_schema.get('name')}")
    stmt = select(*(tbl.c[n] for n in names))
    for column, values in (match or {}).items():
        if column not in tbl.c:
            engine.dispose()
            raise ConfigError(f"--match {column}=...: table {table!r} has no column {column!r}")
        stmt = stmt.where(tbl.c[column].in_([tbl.c[column].type.python_type(v) for v in values]))
    order = [tbl.c[c] for c in order_by] if order_by else list(tbl.primary_key.columns)
    if order:
        stmt = stmt.order_by(*order)
    if limit is not None:
        stmt = stmt.limit(limit)
    with engine.connect() as db:
        total = db.execute(select(func.count()).select_from(stmt.subquery())).scalar_one()

    def rows() -> Iterator[Row]:
        try:
            with engine.connect() as db:
                result = db.execution_options(stream_results=True, yield_per=5_000).execute(stmt)
                for row in result.mappings():
                    yield dict(row)
        finally:
            engine.dispose()

    return RowSource(rows(), total, f"table {table}")


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
    from confluent_kafka.admin import NewTopic

    admin = clients.kafka_admin(kafka)
    try:
        meta = admin.list_topics(timeout=kafka.request_timeout_s)
    except KafkaException as exc:
        raise SetupError(f"Kafka at {kafka.bootstrap_servers} did not answer: {exc}",
                         "start the local stack with `threes local up`") from exc
    if topic in meta.topics and meta.topics[topic].error is None:
        return False
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                            request_timeout=kafka.request_timeout_s)[topic].result(kafka.request_timeout_s)
    except KafkaException as exc:
        if exc.args and getattr(exc.args[0], "name", lambda: "")() == "TOPIC_ALREADY_EXISTS":
            return False
        raise SetupError(f"cannot create topic {topic!r}: {exc}") from exc
    log.info("created event topic=%s partitions=%d", topic, partitions)
    return True


# -- the replayer ------------------------------------------------------------------------------------


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
            :class:`~connectors.exceptions.ConfigError` naming the row.
        """
        from schemas.exceptions import SerdeError

        stats = stats or ReplayStats()
        stats.total = source.total
        ensure_event_topic(self.kafka, self.topic, self.partitions)
        producer = clients.kafka_producer(self.kafka, linger_ms=50, batch_num_messages=10_000,
                                          queue_buffering_max_messages=200_000)

        def delivered(err: Any, _msg: Any) -> None:
            with stats._lock:
                if err is None:
                    stats.acked += 1
                else:
                    stats.failed += 1
                    if stats.first_error is None:
                        stats.first_error = str(err)

        step = max(1, int(self.rate / 100)) if self.rate else 1_000
        began = time.monotonic()
        stats.started = time.time()
        index = -1
        for index, row in enumerate(source.rows):
            if stop is not None and stop.is_set():
                break
            try:
                key = self.key_serializer({k: row[k] for k in self.key})
                value = self.value_serializer(row)
            except (SerdeError, KeyError) as exc:
                raise ConfigError(f"{source.description}: row {index + 1} does not match the schema: {exc}") from exc
            while True:
                try:
                    producer.produce(self.topic, value=value, key=key, on_delivery=delivered)
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
        log.info("replay topic=%s source=%s produced=%d acked=%d failed=%d elapsed_s=%.1f rate=%.0f/s",
                 self.topic, source.description, stats.produced, stats.acked, stats.failed, stats.elapsed_s,
                 stats.rate)
        if remaining or stats.failed:
            raise RetriableError(
                f"replay into {self.topic!r}: {stats.failed + remaining} of {stats.produced} record(s) not "
                f"acknowledged (first error: {stats.first_error or 'flush timeout'})"
            )
        return stats
