"""Config of the stream job (``stream:`` in connector config YAML)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from connectors.config.models import Name, StrictModel, TopicName


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
