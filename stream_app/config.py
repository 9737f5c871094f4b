"""Config of the stream job (``stream:`` in connector config YAML).

The job reads one event topic, enriches every event with lookups into
GlobalKTable-like snapshots of compacted topics, and writes enriched events,
update records for the sync service and dead letters back to Kafka. The
models check what can be checked without the Avro schemas; field names are
checked against the schemas when the job starts (:mod:`stream_app.plan`).

Example::

    stream:
      events: {topic: flights, value_schema: schemas/flight.avsc, max_offsets_per_trigger: 50000}
      snapshots:
        - {name: airports, topics: [state.airports], key_schema: nycflights13/airport_key,
           value_schema: nycflights13/airport}
        # a topic keyed by plain UTF-8 strings (Kafka Streams' Serdes.String()):
        - {name: customers, topics: [customers], key_format: string, key_field: id, value_schema: bench/customer}
      lookups:
        - {snapshot: airports, on: {origin: faa}, prefix: origin_}
        - {snapshot: airports, on: {dest: faa}, prefix: dest_, how: inner, fields: [name, tz]}
      enriched_topic: flights.enriched
      updates:
        - {topic: updates.flights, kind: projection, key: [flight_id], version: offset}
        - {topic: updates.delays, kind: aggregation, group_by: [origin], event_time: time_hour,
           window: 1 day, aggregations: {flights: count, mean_dep_delay: mean(dep_delay)}}
        - {topic: updates.hourly, kind: aggregation, group_by: [origin], event_time: time_hour,
           window: 1 hour, slide: 10 minutes, aggregations: {flights: count, p95: percentile(dep_delay, 0.95)}}
        - {topic: updates.sessions, kind: aggregation, group_by: [tailnum], event_time: time_hour,
           window: session, gap: 30 minutes, aggregations: {legs: count, first_dest: first(dest)}}
      dead_letter_topic: flights.dlq
      checkpoint_location: .threes/checkpoints/flights
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AfterValidator, Field, SecretStr, ValidationInfo, field_validator, model_validator

from kernel.config.models import Name, SchemaRef, StrictModel, TopicName, metrics_endpoint_problem
from stream_app.spark_conf_safety import JIT_INLINE_FLAGS

AGGREGATION = re.compile(
    r"^(?P<fn>[a-z_]+)(?:\((?P<field>[A-Za-z_][A-Za-z0-9_]*)(?:,(?P<p>[^,()]*))?\))?$"
)
"""The shape of an aggregation spec (spaces removed): ``fn``, ``fn(field)`` or ``fn(field,p)``;
:func:`parse_aggregation` checks the function and its arguments."""

AGGREGATE_FUNCTIONS = {
    "count": "count",
    "mean": "mean(f)",
    "sum": "sum(f)",
    "min": "min(f)",
    "max": "max(f)",
    "count_distinct": "count_distinct(f)",
    "approx_count_distinct": "approx_count_distinct(f)",
    "first": "first(f)",
    "last": "last(f)",
    "stddev": "stddev(f)",
    "percentile": "percentile(f, p)",
}
"""Every aggregate function of ``aggregations``, by name, with its spec's form (``f`` a field, ``p`` in (0, 1))."""


class AggregationSpec(NamedTuple):
    """One parsed aggregation spec: ``fn`` over ``field`` (``None`` for ``count``), ``p`` for ``percentile``."""

    fn: str
    field: str | None
    p: float | None = None


def parse_aggregation(spec: str) -> AggregationSpec:
    """Parse an aggregation spec of ``aggregations`` (the one parser of them: config and plan use it).

    Args:
        spec: ``count``, ``sum(amount)``, ``percentile(amount, 0.95)``... (spaces anywhere).

    Returns:
        The function, its field and ``p`` (percentile only).

    Raises:
        ValueError: an unknown function, a missing or extra argument, or ``p`` outside (0, 1); the
            message names the spec and the accepted forms.
    """
    forms = ", ".join(AGGREGATE_FUNCTIONS.values())
    m = AGGREGATION.match(spec.replace(" ", ""))
    if m is None or m.group("fn") not in AGGREGATE_FUNCTIONS:
        raise ValueError(f"{spec!r} is not {forms}")
    fn, field, p = m.group("fn"), m.group("field"), m.group("p")
    if fn == "count":
        if field is not None:
            raise ValueError(f"{spec!r}: count takes no field (it counts events; count_distinct(f) counts values)")
        return AggregationSpec(fn, None)
    if field is None:
        raise ValueError(f"{spec!r}: {fn} needs a field: {AGGREGATE_FUNCTIONS[fn]}")
    if fn != "percentile":
        if p is not None:
            raise ValueError(f"{spec!r}: {fn} takes one field: {AGGREGATE_FUNCTIONS[fn]}")
        return AggregationSpec(fn, field)
    try:
        fraction = float(p) if p is not None else None
    except ValueError:
        fraction = None
    if fraction is None or not 0.0 < fraction < 1.0:
        raise ValueError(f"{spec!r}: percentile(f, p) needs p in (0, 1), e.g. percentile({field}, 0.95)")
    return AggregationSpec(fn, field, fraction)


def _checked_aggregation(spec: str) -> str:
    parse_aggregation(spec)
    return spec


AggregationText = Annotated[str, AfterValidator(_checked_aggregation)]

TRANSFORM_REFERENCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
"""``stream.transform``: ``package.module:function`` (the entry-point notation of Python packaging)."""
_DURATION = re.compile(r"^(\d+)\s+(second|minute|hour|day|week)s?$")
_SECONDS = {"second": 1, "minute": 60, "hour": 3600, "day": 86400, "week": 7 * 86400}
SESSION = "session"


REALTIME_MIN_CHECKPOINT_S = 5
"""The shortest interval of Spark's ``trigger(realTime=...)`` (its batch duration), seconds."""


def duration_s(text: str) -> int:
    """Seconds of a duration of the config (``'1 day'``, ``'15 minutes'``).

    Raises:
        ValueError: not ``<n> second(s)|minute(s)|hour(s)|day(s)|week(s)``.
    """
    m = _DURATION.match(text.strip())
    if m is None:
        raise ValueError("expected '<n> second(s)|minute(s)|hour(s)|day(s)|week(s)', e.g. '1 day'")
    return int(m.group(1)) * _SECONDS[m.group(2)]


class EventsTopicSpec(StrictModel):
    """How ``threes run`` creates the events topic when it is missing (``cleanup.policy=delete``)."""

    partitions: int = Field(4, ge=1, description="partitions (4, as `threes replay` creates a topic)")
    replication_factor: int | None = Field(
        None, ge=1, description="replicas; default kafka.internal_replication_factor, else min(3, number of brokers)"
    )
    configs: dict[str, str] = Field(default_factory=dict, description="topic configs, e.g. retention.ms")


class EventsConfig(StrictModel):
    """The event stream the job reads (Spark's Kafka source options)."""

    topic: TopicName
    value_schema: SchemaRef = Field(
        description="Avro reader schema of the events (.avsc path relative to the config file's folder, or name in "
        "schemas/)"
    )
    starting_offsets: Literal["earliest", "latest"] = Field(
        "latest", description="where a job without a checkpoint starts; a checkpoint always wins"
    )
    value_format: Literal["avro", "confluent_avro"] = Field(
        "avro",
        description="how event values are encoded: 'avro' (single-object Avro, writer schemas in the schema topic) "
        "or 'confluent_avro' (Confluent's wire format: magic byte 0, 4-byte schema id; writer schemas are the "
        "versions of the subject <topic>-value in kafka.schema_registry, resolved against value_schema). The events' "
        "keys are never decoded: they pass to the enriched events as they are",
    )
    max_offsets_per_trigger: int | None = Field(None, ge=1, description="records per micro-batch, at most")
    fail_on_data_loss: bool = Field(
        True, description="fail when event offsets were deleted before being read (Spark's failOnDataLoss)"
    )
    topic_spec: EventsTopicSpec = Field(
        default_factory=lambda: EventsTopicSpec(),
        description="how `threes run` creates the events topic when it is missing; an existing topic is used as "
        "it is. `threes stream run` never creates it",
    )


class SnapshotConfig(StrictModel):
    """A GlobalKTable-like snapshot: the latest value per key of compacted topics.

    A key is expected in one partition of one topic (Kafka's key partitioning);
    when several topics hold the same key, the record read last wins (topics
    in list order, then partition, then offset).
    """

    name: Name
    topics: list[TopicName] = Field(min_length=1)
    key_format: Literal["avro", "string", "confluent_avro", "connect_json"] = Field(
        "avro",
        description="how record keys are encoded: 'avro' (single-object Avro, read with key_schema), 'string' "
        "(plain UTF-8, as Kafka Streams' Serdes.String() writes them; the key is one string field named key_field), "
        "'confluent_avro' (Confluent's wire format, writer schemas from kafka.schema_registry, subject <topic>-key) "
        "or 'connect_json' (Kafka Connect's JsonConverter with schemas.enable=true: a struct key is read with "
        "key_schema, which is then required)",
    )
    value_format: Literal["avro", "confluent_avro", "connect_json"] = Field(
        "avro",
        description="how record values are encoded: 'avro' (single-object Avro), 'confluent_avro' (Confluent's "
        "wire format, writer schemas from kafka.schema_registry, subject <topic>-value) or 'connect_json' (Kafka "
        "Connect's JsonConverter with schemas.enable=true, read with value_schema, which is then required)",
    )
    envelope: Literal["none", "debezium"] = Field(
        "none",
        description="'debezium': each value is a Debezium change event (before/after/source/op/ts_ms); the "
        "snapshot keeps `after` (value_schema is the row record, default: the `after` type of the latest writer "
        "schema), `op: d` and tombstones delete the key, `op: t` is skipped, and a column holding "
        "__debezium_unavailable_value (a TOASTed column an UPDATE left out) keeps the key's previous value",
    )
    key_schema: SchemaRef | None = Field(
        None,
        description="Avro reader schema of the record keys (a record); default: the latest key schema the topics "
        "carry (schema store subject <topic>-key)",
    )
    key_field: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="key_format string: the name lookups join on (`on: {event_field: <key_field>}`), default 'key'",
    )
    value_schema: SchemaRef | None = Field(
        None,
        description="Avro reader schema of the record values (a record), for projection or evolution; default: the "
        "latest value schema the topics carry (schema store subject <topic>-value), writer schemas matched by field "
        "names",
    )
    index_min_rows: int | None = Field(
        None,
        ge=0,
        description="opt-in: from this many keys (up to broadcast_max_rows) keep the snapshot as a hash index in "
        "the executors' Python workers (a copy per worker, outside the JVM's memory accounting) instead of "
        "broadcasting it; off by default: above broadcast_max_rows the snapshot is partitioned on the executors",
    )
    broadcast_max_rows: int = Field(
        100_000,
        ge=0,
        description="above this many keys the snapshot is partitioned by key on the executors (never collected to "
        "the driver, versioned as bucketed Parquet in the checkpoint location) and joined by a shuffle of the events",
    )
    overlay_max_rows: int = Field(
        50_000,
        ge=1,
        description="changes kept beside the broadcast base before they are merged into a new base (records); "
        "topics holding at most this many records are also bootstrapped that way, read and decoded on the driver",
    )
    checkpoint_interval_s: float = Field(
        300.0, gt=0, description="the snapshot (data + offsets) is checkpointed at most this often, seconds"
    )
    partitioned_join: Literal["lookup", "sort_merge"] = Field(
        "lookup",
        description="how micro-batches join a partitioned snapshot: lookup (each version also written as Arrow files "
        "sorted by key hash, memory-mapped by the Python workers and searched per event: the cost follows the "
        "events, not the snapshot; needs a checkpoint location on a file system the executors read locally, "
        "file:, else sort_merge is used) or sort_merge (Spark's join of the events, shuffled, with the whole base)",
    )
    partitions: int | None = Field(
        None,
        ge=1,
        description="partitions (and Parquet buckets) of a partitioned snapshot (default spark.sql.shuffle.partitions; "
        "keep it at least that, or Spark reshuffles the snapshot instead of the events)",
    )

    retention: str | None = Field(
        None,
        description="keep the snapshot's versions per key whose validity reaches back this long (e.g. '7 days'), "
        "counted back from the newest source timestamp the snapshot has seen: lookups with `as_of` then get the "
        "version valid at the event's time (a versioned state store, like Kafka Streams' KIP-889 stores)",
    )

    @field_validator("retention")
    @classmethod
    def _retention(cls, value: str | None) -> str | None:
        if value is not None and duration_s(value) == 0:
            raise ValueError("a retention lasts more than 0 seconds")
        return None if value is None else value.strip()

    @property
    def retention_ms(self) -> int | None:
        """``retention`` in milliseconds (``None``: not versioned)."""
        return None if self.retention is None else duration_s(self.retention) * 1000

    max_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1,
        description="mode realtime: the heap the snapshot's entries may take in each executor JVM, bytes (key and "
        "value bodies plus 112 bytes per key); a snapshot that needs more stops the job at start, naming both numbers",
    )

    @model_validator(mode="after")
    def _key_format(self) -> SnapshotConfig:
        if self.key_format != "string":
            if self.key_field is not None:
                raise ValueError("key_field applies to key_format string only (an Avro key names its own fields)")
        elif self.key_schema is not None:
            raise ValueError("key_schema does not apply to key_format string (the key is one string: key_field)")
        # Connect's JSON carries its own schema in each record but no schema topic or registry keeps it:
        # the reader schema is given
        if self.key_format == "connect_json" and self.key_schema is None:
            raise ValueError("key_format connect_json needs key_schema (the key's fields, as an Avro record)")
        if self.value_format == "connect_json" and self.value_schema is None:
            raise ValueError("value_format connect_json needs value_schema (the row's fields, as an Avro record)")
        if self.envelope == "debezium" and self.retention is not None:
            raise ValueError("envelope debezium keeps the latest value per key only: retention (versions) is not "
                             "supported with it")
        return self

    @property
    def registry_formats(self) -> list[str]:
        """The fields of this snapshot that read the Confluent wire format (``key_format``/``value_format``)."""
        return [n for n in ("key_format", "value_format") if getattr(self, n) == "confluent_avro"]


class LookupConfig(StrictModel):
    """One enrichment: join events to a snapshot on column(s) = snapshot key field(s).

    A column of ``on`` may be an event field, a ``derive`` column, or a column an earlier lookup
    added (its prefixed name): lookups chain (order line -> order -> customer -> nation). The job
    runs each lookup as soon as its columns exist; ``validate`` checks the chain is a DAG.
    """

    snapshot: Name
    on: dict[str, str] = Field(
        min_length=1,
        description="column -> snapshot key field; the column is an event field, a derive column or an earlier "
        "lookup's prefixed column (a chained lookup)",
    )
    how: Literal["left", "inner"] = "left"
    prefix: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="prefix of the joined columns, e.g. origin_")
    fields: list[str] | None = Field(None, min_length=1, description="snapshot value fields to join (default all)")
    as_of: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="an event-time column (timestamp or date: an event field, a derive column or an earlier "
        "lookup's column): join the snapshot's version valid at that time instead of its latest value (a temporal "
        "join, Flink SQL's FOR SYSTEM_TIME AS OF); the snapshot needs `retention`",
    )
    wait_for_reference: str | None = Field(
        None,
        description="with as_of on an event field: a micro-batch whose newest event time is later than the "
        "snapshot's stream time (its newest source timestamp) waits, catching the snapshot up, until the stream time "
        "reaches it or this long has passed (e.g. '30 seconds'), then joins; like Flink's event-time temporal join, "
        "which waits for the versioned table's watermark. Default off: events join what the snapshot has read",
    )

    @field_validator("wait_for_reference")
    @classmethod
    def _wait(cls, value: str | None) -> str | None:
        if value is not None and duration_s(value) == 0:
            raise ValueError("a wait lasts more than 0 seconds")
        return None if value is None else value.strip()

    @property
    def wait_for_reference_s(self) -> float | None:
        """``wait_for_reference`` in seconds (``None``: off)."""
        return None if self.wait_for_reference is None else float(duration_s(self.wait_for_reference))

    def columns(self) -> list[str]:
        """The columns this lookup reads from the event: ``on``'s, then ``as_of``."""
        return [*self.on, *([self.as_of] if self.as_of is not None else [])]


class UpdateConfig(StrictModel):
    """An update topic the job writes for the sync service (``kernel.updates`` contract).

    ``projection``: one upsert per enriched event, keyed by ``key``; its
    ``version`` is the event's Kafka offset (monotonic per key when the event
    topic is keyed by the same entity), its Kafka timestamp in ms, or a numeric
    event field. ``aggregation``: per ``group_by`` and event-time ``window``
    (tumbling; hopping with ``slide``; ``session`` with ``gap``), the
    ``aggregations``, in Spark's state store (RocksDB); the key is ``group_by`` +
    ``window_start``, the version the group's event count, which grows with
    every change and is the same when a micro-batch is replayed. Tumbling and
    hopping windows are emitted as upserts whenever they change (Spark's
    ``update`` output mode); a session once, when the watermark passes its end
    (``append``: Spark refuses ``update`` for session windows, as a session's
    start, hence its key, may still move while it is open).
    """

    topic: TopicName
    kind: Literal["projection", "aggregation"] = "projection"
    key: list[str] | None = Field(None, min_length=1, description="projection: key field(s) of the update records")
    fields: list[str] | None = Field(None, min_length=1, description="projection: fields to keep (default all)")
    version: str = Field("offset", description="projection: 'offset' | 'timestamp' (Kafka, ms) | a numeric event field")
    group_by: list[str] | None = Field(None, min_length=1, description="aggregation: grouping fields")
    aggregations: dict[str, AggregationText] | None = Field(
        None,
        description="aggregation: output field -> 'count' | 'mean(f)' | 'sum(f)' | 'min(f)' | 'max(f)' | "
        "'count_distinct(f)' (exact: the state keeps every distinct value per window) | 'approx_count_distinct(f)' "
        "(HyperLogLog++, 5% relative standard deviation) | 'first(f)' | 'last(f)' (the value at the earliest / "
        "latest event time) | 'stddev(f)' (sample) | 'percentile(f, p)' (approximate, p in (0, 1))",
    )
    event_time: str | None = Field(None, description="aggregation: event-time field (an Avro timestamp)")
    where: str | None = Field(
        None,
        description="a Spark SQL boolean expression over the enriched event: only events for which it is true "
        "reach this update topic (null counts as false)",
    )
    delete_when: str | None = Field(
        None,
        description="projection: a Spark SQL boolean expression over the enriched event; when true the event "
        "emits a tombstone (a null value) for its key, with the event's version, and the sinks delete the row, "
        "document or archived key",
    )
    window: str = Field(
        "1 day",
        description="aggregation: window length, e.g. '1 day', '15 minutes' (tumbling, or hopping with slide), or "
        "'session' (with gap)",
    )
    slide: str | None = Field(
        None,
        description="aggregation: hopping windows: a window starts every slide (at most window; need not divide "
        "it); each event is in about window/slide windows. Not with window: session",
    )
    gap: str | None = Field(
        None,
        validate_default=True,
        description="aggregation, window: session (and only then): a group's session ends after this long without "
        "an event, e.g. '30 minutes'",
    )
    watermark: str = Field("1 hour", description="aggregation: how late an event may arrive, e.g. '1 hour'")

    @field_validator("watermark")
    @classmethod
    def _duration(cls, value: str) -> str:
        duration_s(value)
        return value.strip()

    @field_validator("window")
    @classmethod
    def _window(cls, value: str) -> str:
        if value.strip() == SESSION:
            return SESSION
        if duration_s(value) == 0:
            raise ValueError("a window lasts more than 0 seconds")
        return value.strip()

    @field_validator("slide")
    @classmethod
    def _slide(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        if duration_s(value) == 0:
            raise ValueError("a slide lasts more than 0 seconds")
        window = info.data.get("window")  # absent when the window itself is invalid (reported there)
        if window == SESSION:
            raise ValueError("slide does not apply to window: session (sessions do not hop; their `gap` ends them)")
        if window is not None and duration_s(value) > duration_s(window):
            # Spark's window(ts, window, slide) refuses a slide longer than its window (events would fall between
            # windows); a slide that does not divide the window is fine
            raise ValueError(f"slide {value.strip()!r} is longer than window {window!r}: it must be at most the window")
        return value.strip()

    @field_validator("gap")
    @classmethod
    def _gap(cls, value: str | None, info: ValidationInfo) -> str | None:
        window = info.data.get("window")
        if value is None:
            if window == SESSION:
                raise ValueError("window: session needs a gap, e.g. gap: 30 minutes")
            return None
        if window is not None and window != SESSION:
            raise ValueError("gap applies to window: session only (a tumbling or hopping window has a fixed length)")
        if duration_s(value) == 0:
            raise ValueError("a gap lasts more than 0 seconds")
        return value.strip()

    @model_validator(mode="after")
    def _kind_fields(self) -> UpdateConfig:
        if self.kind == "projection":
            if not self.key:
                raise ValueError("a projection needs `key` (the update records' key fields)")
            aggregation_only = ("group_by", "aggregations", "event_time", "slide", "gap")
            extra = [n for n in aggregation_only if getattr(self, n) is not None]
        else:
            missing = [n for n in ("group_by", "aggregations", "event_time") if not getattr(self, n)]
            if missing:
                raise ValueError(f"an aggregation needs {', '.join(missing)}")
            extra = [n for n in ("key", "fields", "delete_when") if getattr(self, n) is not None]
        if extra:
            raise ValueError(f"{', '.join(extra)} not allowed for kind {self.kind}")
        return self


EXECUTOR_GC_FLAGS: dict[str, str | None] = {
    "parallel": "-XX:+UseParallelGC",
    "serial": "-XX:+UseSerialGC",
    "g1": "-XX:+UseG1GC",
    "jvm": None,
}
"""JVM flag of each ``stream.spark.executor_gc`` (``jvm``: none, the JVM's ergonomics choose)."""
GC_FLAG = re.compile(r"-XX:\+Use\w+GC\b")
LEAN_INLINING = "-XX:MaxInlineLevel=6 -XX:InlineSmallCode=1000 -XX:MaxInlineSize=20 -XX:FreqInlineSize=200"
"""``stream.spark.jit_inlining: lean``: the C2 compiler inlines less deep and smaller methods than HotSpot 17's
defaults (``MaxInlineLevel`` 15, ``InlineSmallCode`` 2500, ``MaxInlineSize`` 35, ``FreqInlineSize`` 325), so it
spends less CPU compiling Spark's generated code: see docs/operations.md, "The JIT compilers' inlining"."""
INLINE_FLAG = re.compile(rf"-XX:({JIT_INLINE_FLAGS})=")
AUTO_PARALLEL_MAX_MIB = 8 * 1024
"""``executor_gc: auto`` picks the parallel collector for executors of at most this heap (MiB), else the JVM's."""
_SIZE = re.compile(r"^\s*(\d+)\s*(b|k|kb|m|mb|g|gb|t|tb|p|pb)?\s*$", re.IGNORECASE)
_MIB_PER_UNIT = {"b": 2.0**-20, "k": 2.0**-10, "m": 1.0, "g": 2.0**10, "t": 2.0**20, "p": 2.0**30}


def memory_mib(text: str) -> float | None:
    """A Spark memory size (``spark.executor.memory``: ``4g``, ``512m``, ``2048``) in MiB; ``None`` if unreadable.

    A number without a unit is MiB, as Spark reads ``spark.executor.memory``.
    """
    match = _SIZE.match(str(text))
    if match is None:
        return None
    unit = (match.group(2) or "m").lower()
    return int(match.group(1)) * _MIB_PER_UNIT[unit[0]]


class SparkSettings(StrictModel):
    """Where and how Spark runs.

    ``conf`` is an allow-list (:func:`stream_app.spark_conf_safety.spark_conf_problems`):
    tuning and deployment settings pass; settings that load code or files (``spark.jars``,
    ``spark.archives``, a class name, ``spark.pyspark.python``...) pass only when named in
    ``acknowledge_code_loading``; ``extraJavaOptions`` take GC/stack/time zone flags only;
    Spark's own security and redaction settings are refused. Secret values (``...secret.key``)
    are masked in ``repr``.
    """

    master: str = "local[*]"
    app_name: str = "threes-stream"
    driver_memory: str = "1g"
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="spark.* settings from an allow-list (tuning, spark.sql.*, S3A endpoint and keys); others need "
        "acknowledge_code_loading. With every executor on the driver's host (local[*], or a standalone master at "
        "127.0.0.1/localhost) spark.shuffle.compress and spark.shuffle.spill.compress default to false (shuffle "
        "files never cross a network there); set them here to override",
    )
    acknowledge_code_loading: list[str] = Field(
        default_factory=list,
        description="conf keys accepted although they load code or files or set the processes' environment "
        "(e.g. spark.archives, spark.pyspark.python, spark.kubernetes.container.image)",
    )
    executor_gc: Literal["auto", "parallel", "serial", "g1", "jvm"] = Field(
        "auto",
        description="the executors' garbage collector on a cluster (their JVMs' -XX:+Use...GC): parallel (a "
        "throughput collector; on 1 GB executors a 10M-key bootstrap took 2-21% less time and the job ran 3-24% "
        "more events/s than with the JVM's G1 in five alternating pairs), serial (one-core executors), g1 (large "
        "heaps with pause-time goals), jvm (the JVM's own choice) or auto: parallel for executors of "
        "spark.executor.memory up to 8g, else the JVM's; a collector named in spark.executor.extraJavaOptions wins",
    )
    jit_inlining: Literal["lean", "jvm"] = Field(
        "lean",
        description="how much the C2 JIT compiler of the driver's and the executors' JVMs inlines: lean "
        f"({LEAN_INLINING}: less CPU spent compiling Spark's generated code; on the local cluster a bootstrap took "
        "0.89x the time and the job ran more events/s than with the JVM's defaults) or jvm (HotSpot's defaults); "
        "an inlining flag in spark.driver.extraJavaOptions or spark.executor.extraJavaOptions wins for that JVM",
    )
    class_data_sharing: bool = Field(
        True,
        description="map Spark's classes into the driver's JVM from an archive of an earlier run (JDK class data "
        "sharing, kept under $THREES_CACHE_DIR or ~/.cache/threes): a session and its first query start sooner "
        "(driver_start in benchmarks/RESULTS.md); the first run of an installation writes the archive when it exits "
        "(once). "
        "Also the executors' JVMs on a standalone master at 127.0.0.1/localhost (workers on this host): the first "
        "application records their classes, and its exit dumps an archive in the background (once)",
    )

    @model_validator(mode="after")
    def _allow_listed_conf(self) -> SparkSettings:
        from stream_app.spark_conf_safety import spark_conf_problems

        problems = spark_conf_problems(self.conf, set(self.acknowledge_code_loading))
        if problems:
            raise ValueError("; ".join(f"conf '{key}' refused: {why}" for key, why in problems))
        named = GC_FLAG.findall(self.conf.get("spark.executor.extraJavaOptions", ""))
        if self.executor_gc not in ("auto", "jvm") and named:
            raise ValueError(
                f"executor_gc '{self.executor_gc}' and conf 'spark.executor.extraJavaOptions' ({' '.join(named)}) "
                "both choose the executors' garbage collector: keep one"
            )
        return self

    def executor_java_options(self) -> str:
        """``spark.executor.extraJavaOptions`` as the executors get them: ``conf``'s, led by ``executor_gc``'s flag.

        Returns:
            The flags, space-separated (``""`` for none): ``jit_inlining``'s flags and ``conf``'s own, after
            ``executor_gc``'s collector unless they name one, or ``executor_gc`` is ``jvm`` (or ``auto`` on
            executors of more than 8g).
        """
        own = self._with_jit(self.conf.get("spark.executor.extraJavaOptions", "").strip())
        choice = self.executor_gc
        if choice == "auto":
            heap = memory_mib(self.conf.get("spark.executor.memory", "1g"))
            choice = "parallel" if heap is not None and heap <= AUTO_PARALLEL_MAX_MIB else "jvm"
        flag = EXECUTOR_GC_FLAGS[choice]
        if flag is None or GC_FLAG.search(own):
            return own
        return f"{flag} {own}".strip()

    def driver_java_options(self) -> str:
        """``spark.driver.extraJavaOptions`` as the driver's JVM gets them (when this process starts it).

        Returns:
            ``conf``'s own, led by ``jit_inlining``'s flags unless they name an inlining flag.
        """
        return self._with_jit(self.conf.get("spark.driver.extraJavaOptions", "").strip())

    def _with_jit(self, own: str) -> str:
        if self.jit_inlining == "jvm" or INLINE_FLAG.search(own):
            return own
        return f"{LEAN_INLINING} {own}".strip()

    def __repr_args__(self) -> Any:
        from stream_app.spark_conf_safety import spark_conf_secret

        for name, value in super().__repr_args__():
            if name == "conf":
                value = {k: "**********" if spark_conf_secret(k) else v for k, v in value.items()}
            yield name, value


class StreamJobConfig(StrictModel):
    """The PySpark Structured Streaming job."""

    name: Name = "stream"
    events: EventsConfig
    where: str | None = Field(
        None,
        description="a Spark SQL boolean expression: events for which it is not true (false or null) are dropped "
        "and counted (threes_stream_filtered_events_total); it runs as soon as the columns it reads exist, before "
        "the lookups when it reads only event and derive columns",
    )
    derive: dict[str, str] = Field(
        default_factory=dict,
        description="new column -> Spark SQL expression, in order (later entries may read earlier ones); each runs "
        "as soon as the columns it reads exist (before the lookups unless it reads a looked-up column); derived "
        "columns are part of the enriched event, after the looked-up ones, and may be lookup keys, update keys, "
        "versions, group_by keys or event time",
    )
    snapshots: list[SnapshotConfig] = Field(default_factory=list)
    lookups: list[LookupConfig] = Field(default_factory=list)
    transform: str | None = Field(
        None,
        description="package.module:function, a Python function DataFrame -> DataFrame applied to every micro-batch "
        "after the lookups, derive columns and where, before the update records are built: what the YAML cannot "
        "say. It may add columns (part of the enriched event from then on) and filter rows; it must keep the "
        "columns starting with '__' (Kafka metadata, dead-letter routing). Imported from the Python path or the "
        "config file's folder; its output is checked against the updates when the job starts",
    )
    enriched_topic: TopicName
    updates: list[UpdateConfig] = Field(default_factory=list)
    dead_letter_topic: TopicName
    trigger_interval_s: float = Field(1.0, gt=0)
    mode: Literal["microbatch", "realtime"] = Field(
        "microbatch",
        description="microbatch: a micro-batch every trigger_interval_s, snapshots joined as Spark DataFrames; "
        "realtime: Spark's real-time mode (one long-running query, each event enriched as it arrives, snapshot "
        "lookups in the JVM, eventually fresh like a GlobalKTable): no aggregation updates, no transform, no "
        "max_offsets_per_trigger (threes validate names what is used)",
    )
    checkpoint_interval: str = Field(
        "30 seconds",
        description="mode realtime: how often the query checkpoints its offsets (Spark's trigger(realTime=...)), "
        "at least 5 seconds; not a latency: events flow through continuously in between, and a restart replays "
        "at most this much",
    )
    checkpoint_location: str = Field(description="Spark checkpoint folder (any Hadoop file system URL)")
    metrics_port: int | None = Field(None, ge=1, le=65535, description="serve Prometheus metrics on this port")
    metrics_host: str = Field("127.0.0.1", description="address metrics_port binds; any other than loopback needs "
                              "metrics_token")
    metrics_token: SecretStr | None = Field(None, description="bearer token every request to metrics_port must carry "
                                            "(Authorization: Bearer ...), e.g. ${env:METRICS_TOKEN}")
    spark: SparkSettings = Field(default_factory=SparkSettings)

    @model_validator(mode="after")
    def _token_off_loopback(self) -> StreamJobConfig:
        problem = metrics_endpoint_problem(self.metrics_host, self.metrics_token)
        if problem:
            raise ValueError(problem)
        return self

    @field_validator("checkpoint_location")
    @classmethod
    def _local_uri_in_one_form(cls, location: str) -> str:
        """``file:/x`` (one slash, which Hadoop accepts) becomes ``file:///x``, ``file:x`` the relative path ``x``.

        Every part of the job (Spark, the snapshot checkpoints, the choice of the
        checkpoint manager) then reads the location as the same local folder, and a
        one-slash ``file:`` URI is never taken for a relative path named ``file:``.
        """
        if location.startswith("file:") and not location.startswith("file://"):
            rest = location.removeprefix("file:")
            return f"file://{rest}" if rest.startswith("/") else rest
        return location

    @field_validator("checkpoint_interval")
    @classmethod
    def _checkpoint_interval(cls, value: str) -> str:
        if duration_s(value) < REALTIME_MIN_CHECKPOINT_S:
            raise ValueError(
                f"{value!r}: real-time mode checkpoints at most every {REALTIME_MIN_CHECKPOINT_S} seconds (Spark's "
                "minimum); it is not a latency, events flow through in between"
            )
        return value

    @field_validator("transform")
    @classmethod
    def _transform_reference(cls, ref: str | None) -> str | None:
        if ref is not None and not TRANSFORM_REFERENCE.match(ref):
            raise ValueError(f"{ref!r} is not package.module:function, e.g. transforms.flights:classify")
        return ref

    @field_validator("derive")
    @classmethod
    def _derive_names(cls, derive: dict[str, str]) -> dict[str, str]:
        for name in derive:
            if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name) or name.startswith("__"):
                raise ValueError(f"{name!r}: a derived column needs an Avro name ([A-Za-z_][A-Za-z0-9_]*, not __...)")
        return derive

    @model_validator(mode="after")
    def _references(self) -> StreamJobConfig:
        names = [s.name for s in self.snapshots]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"snapshots: names must be unique, {dup} repeated")
        for i, lookup in enumerate(self.lookups):
            if lookup.snapshot not in names:
                raise ValueError(
                    f"lookups[{i}].snapshot: no snapshot named {lookup.snapshot!r} (have: {sorted(names)})"
                )
            snapshot = next(s for s in self.snapshots if s.name == lookup.snapshot)
            if lookup.wait_for_reference is not None and lookup.as_of is None:
                raise ValueError(f"lookups[{i}].wait_for_reference: applies to a lookup with as_of (it waits for "
                                 "versions)")
            if lookup.as_of is not None and snapshot.retention is None:
                raise ValueError(
                    f"lookups[{i}].as_of: snapshot {lookup.snapshot!r} keeps no versions: give it a `retention` "
                    "(e.g. retention: 7 days)"
                )
        prefixes = [lk.prefix for lk in self.lookups]
        if len(set(prefixes)) != len(prefixes):
            raise ValueError("lookups: every lookup needs its own prefix")
        topics = [u.topic for u in self.updates]
        if len(set(topics)) != len(topics):
            raise ValueError("updates: every update needs its own topic")
        own = {self.events.topic, self.enriched_topic, self.dead_letter_topic}
        if len(own) != 3:
            raise ValueError("events.topic, enriched_topic and dead_letter_topic must differ")
        if own & set(topics):
            raise ValueError("an update topic may not be the events, enriched or dead letter topic")
        return self
