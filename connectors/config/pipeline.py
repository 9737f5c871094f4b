"""The pipeline document: Kafka, connections, sources, the stream job, sync services.

The source and sink entries are discriminated unions over the connector config
models found in the registry (:mod:`connectors.registry`), so a third-party
connector gets the same validation, errors and JSON Schema as a built-in one.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, Union

from pydantic import Field, create_model, model_validator

from connectors import registry
from connectors.config.models import (
    BatchPolicy,
    Connection,
    ConnectorConfig,
    KafkaConfig,
    Name,
    RetryPolicy,
    StrictModel,
    TopicName,
)


class EventsConfig(StrictModel):
    """The event stream the job reads."""

    topic: TopicName
    value_schema: str = Field(description="Avro schema of the events (.avsc path or name in schemas/)")
    starting_offsets: Literal["earliest", "latest"] = "latest"
    max_offsets_per_trigger: int | None = Field(None, ge=1, description="records per micro-batch, at most")


class SnapshotConfig(StrictModel):
    """A GlobalKTable-like snapshot: the latest value per key of compacted topics."""

    name: Name
    topics: list[TopicName] = Field(min_length=1)
    key_schema: str = Field(description="Avro schema of the record keys")
    value_schema: str = Field(description="Avro schema of the record values")
    broadcast_max_rows: int = Field(
        2_000_000, ge=0, description="above this many keys the job joins partitioned, not broadcast"
    )


class LookupConfig(StrictModel):
    """One enrichment: join events to a snapshot on event field(s) = snapshot key field(s)."""

    snapshot: Name
    on: dict[str, str] = Field(min_length=1, description="event field -> snapshot key field")
    how: Literal["left", "inner"] = "left"
    prefix: str = Field(description="prefix of the joined columns, e.g. origin_")


class UpdateConfig(StrictModel):
    """An update topic the job writes for the sync service (upserts with a version header)."""

    topic: TopicName
    kind: Literal["projection", "aggregation"] = "projection"
    key: list[str] = Field(min_length=1, description="key field(s) of the update records")
    fields: list[str] | None = Field(None, description="projection: fields to keep (default all)")
    group_by: list[str] | None = Field(None, description="aggregation: grouping fields")
    aggregations: dict[str, str] | None = Field(
        None, description="aggregation: output field -> 'count' | 'mean(field)' | 'sum(field)'"
    )
    event_time: str | None = Field(None, description="aggregation: event-time field for windows/watermarks")
    watermark: str = "1 hour"


class SparkSettings(StrictModel):
    """Where and how Spark runs."""

    master: str = "local[*]"
    app_name: str = "threes-stream"
    driver_memory: str = "1g"
    conf: dict[str, str] = Field(default_factory=dict, description="any spark.* setting")


class StreamJobConfig(StrictModel):
    """The PySpark Structured Streaming job."""

    name: Name = "stream"
    events: EventsConfig
    snapshots: list[SnapshotConfig] = Field(default_factory=list)
    lookups: list[LookupConfig] = Field(default_factory=list)
    enriched_topic: TopicName
    updates: list[UpdateConfig] = Field(default_factory=list)
    dead_letter_topic: TopicName
    trigger_interval_s: float = Field(1.0, gt=0)
    checkpoint_location: str
    spark: SparkSettings = Field(default_factory=SparkSettings)

    @model_validator(mode="after")
    def _lookups_name_snapshots(self) -> StreamJobConfig:
        names = {s.name for s in self.snapshots}
        for i, lookup in enumerate(self.lookups):
            if lookup.snapshot not in names:
                raise ValueError(
                    f"lookups[{i}].snapshot: no snapshot named {lookup.snapshot!r} (have: {sorted(names)})"
                )
        return self


def _union(models: list[type[ConnectorConfig]]) -> Any:
    if not models:
        return Annotated[dict[str, Any], Field(max_length=0)]  # nothing registered: accept none
    if len(models) == 1:
        return models[0]
    return Annotated[Union[tuple(models)], Field(discriminator="type")]  # noqa: UP007


class SyncServiceBase(StrictModel):
    """A sync service: one consumer group writing update topics to targets."""

    name: Name
    group_id: str | None = Field(None, description="consumer group; default threes-sync-<name>")
    batch: BatchPolicy = Field(default_factory=BatchPolicy)
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    buffer_max_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, description="bound of buffered + in-flight record bytes"
    )
    dead_letter_topic: TopicName
    stop_on_error: bool = Field(False, description="stop instead of sending a bad record to the DLQ")
    static_membership: bool = False
    metrics_port: int | None = Field(None, ge=1, le=65535)


class PipelineBase(StrictModel):
    """A whole pipeline; the concrete model adds the registered source/sink unions."""

    version: Literal[1] = 1
    kafka: KafkaConfig
    connections: dict[Name, Connection] = Field(default_factory=dict)
    stream: StreamJobConfig | None = None

    def reference_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Check the references between entries (run by the loader after field validation).

        Returns:
            ``(key path, message)`` for every connector naming a missing connection
            or one of the wrong type, and every duplicated name.
        """
        problems: list[tuple[tuple[str | int, ...], str]] = []
        connectors: list[tuple[tuple[str | int, ...], ConnectorConfig]] = [
            (("sources", i), s) for i, s in enumerate(getattr(self, "sources", []))
        ]
        for i, svc in enumerate(getattr(self, "sync", [])):
            connectors += [(("sync", i, "sinks", j), s) for j, s in enumerate(svc.sinks)]
        seen: dict[str, tuple[str | int, ...]] = {}
        for where, c in connectors:
            conn = self.connections.get(c.connection)
            if conn is None:
                problems.append(
                    ((*where, "connection"), f"no connection named {c.connection!r} (have: {sorted(self.connections)})")
                )
            elif conn.type != c.connection_type:
                problems.append(
                    (
                        (*where, "connection"),
                        f"{c.type} needs a connection of type {c.connection_type!r}, "
                        f"{c.connection!r} is {conn.type!r}",
                    )
                )
            if c.name in seen:
                problems.append(((*where, "name"), f"{c.name!r} is already the name of another connector"))
            seen[c.name] = where
        names: set[str] = set()
        for i, svc in enumerate(getattr(self, "sync", [])):
            if svc.name in names:
                problems.append((("sync", i, "name"), f"sync service {svc.name!r} is declared twice"))
            names.add(svc.name)
        return problems

    def connection(self, name: str) -> Any:
        """Return the connection called ``name`` (a validated reference)."""
        return self.connections[name]


@functools.cache
def pipeline_model() -> type[PipelineBase]:
    """Build the pipeline model from the connectors in the registry.

    Returns:
        A pydantic model class with ``sources`` and ``sync[].sinks`` typed as
        discriminated unions (on ``type``) of the registered config models.
    """
    source = _union(registry.models_for("source"))
    sink = _union(registry.models_for("sink"))
    sync_model = create_model(
        "SyncServiceConfig",
        __base__=SyncServiceBase,
        sinks=(list[sink], Field(min_length=1)),
    )
    return create_model(
        "Pipeline",
        __base__=PipelineBase,
        sources=(list[source], Field(default_factory=list)),
        sync=(list[sync_model], Field(default_factory=list)),
    )
