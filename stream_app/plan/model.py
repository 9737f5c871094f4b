"""The job's plan as data: schemas with their JSON, fingerprint and Spark type, per snapshot, update and job.

:func:`stream_app.plan.build_plan` makes them; the micro-batch plan (:mod:`stream_app.batch`), the
update records (:mod:`stream_app.updates`) and the snapshots (:mod:`stream_app.snapshot`) read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from schemas.serde import fingerprint, schema_json
from stream_app.config import SnapshotConfig, StreamJobConfig, UpdateConfig
from stream_app.stages import Step
from stream_app.transform import Transform


@dataclass
class Schema:
    """An Avro schema with its JSON, fingerprint and Spark type."""

    avro: dict[str, Any]
    json: str
    fingerprint: bytes
    spark_type: Any = None


@dataclass
class SnapshotPlan:
    """A snapshot's schemas and types."""

    config: SnapshotConfig
    key: Schema
    value: Schema
    schema_id: str  # changes when a reader schema changes: an older checkpoint is then not used
    envelope: Schema | None = None  # envelope debezium in Avro: the change events' reader (after, op)


class Aggregate(NamedTuple):
    """One output of an aggregation: ``output`` = ``fn(field)`` (``field`` ``None`` for ``count``, ``p`` percentile)."""

    output: str
    fn: str
    field: str | None
    p: float | None = None


@dataclass
class UpdatePlan:
    """An update topic's key and value schemas."""

    config: UpdateConfig
    key: Schema
    value: Schema
    aggregations: list[Aggregate] = field(default_factory=list)
    event_time_is_date: bool = False  # an Avro date: windows start at its midnight UTC


@dataclass
class JobPlan:
    """The stream job's resolved config."""

    config: StreamJobConfig
    events: Schema
    snapshots: dict[str, SnapshotPlan]
    enriched: Schema
    updates: list[UpdatePlan]
    steps: list[Step] = field(default_factory=list)  # derive columns, lookups and where, in order (stages.py)
    transform: Transform | None = None  # stream.transform, run after the steps (stream_app/transform.py)


def schema_of(avro: dict[str, Any]) -> Schema:
    """``avro`` with its canonical JSON and fingerprint (no Spark type yet)."""
    return Schema(avro, schema_json(avro), fingerprint(avro))
