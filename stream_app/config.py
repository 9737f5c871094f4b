"""Config of the stream job (``stream:`` in connector config YAML).

The job reads one event topic, enriches every event with lookups into
GlobalKTable-like snapshots of compacted topics, and writes enriched events,
update records for the sync service and dead letters back to Kafka. The
models check what can be checked without the Avro schemas; field names are
checked against the schemas when the job starts (:mod:`stream_app.plan`).
Sections have their own modules: :mod:`stream_app.snapshot_config` (``snapshots``),
:mod:`stream_app.update_config` (``updates``, their aggregation specs in
:mod:`stream_app.aggregation_specs`), :mod:`stream_app.spark_settings` (``spark``);
durations are read by :mod:`stream_app.durations`.

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
           window: 1 hour, slide: 10 minutes, aggregations: {flights: count, p95: "percentile(dep_delay, 0.95)"}}
        - {topic: updates.sessions, kind: aggregation, group_by: [tailnum], event_time: time_hour,
           window: session, gap: 30 minutes, aggregations: {legs: count, first_dest: first(dest)}}
      dead_letter_topic: flights.dlq
      checkpoint_location: .threes/checkpoints/flights
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from kernel.config.endpoints import metrics_endpoint_problem
from kernel.config.fields import Name, SchemaRef, StrictModel, TopicName
from stream_app.durations import duration_s
from stream_app.snapshot_config import SnapshotConfig
from stream_app.spark_settings import SparkSettings
from stream_app.update_config import UpdateConfig

TRANSFORM_REFERENCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$")
"""``stream.transform``: ``package.module:function`` (the entry-point notation of Python packaging)."""


REALTIME_MIN_CHECKPOINT_S = 5
"""The shortest interval of Spark's ``trigger(realTime=...)`` (its batch duration), seconds."""


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
                                            "(Authorization: Bearer ...), e.g. ${env:THREES_METRICS_TOKEN}")
    query_port: int | None = Field(
        None, ge=0, le=65535,
        description="mode realtime: serve interactive queries (GET /snapshots/{name}/{key}[?as_of=], range scans) "
        "from the JVM state stores on this port, bound to metrics_host with metrics_token (0: any free port; "
        "mode microbatch answers them on metrics_port)",
    )
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
