"""The job's plan: the YAML config resolved against its Avro schemas, checked once at start-up.

Everything the config can only be checked against the schemas for (event and
key fields of lookups, update keys, aggregation fields) is checked here, and
every problem is reported at once as a :class:`~connectors.exceptions.ConfigError`
with its path in the file (``stream.lookups[1].on.dest``). The output schemas
(enriched events, update keys and values) are derived here too.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from connectors.config.stream import AGGREGATION, SnapshotConfig, StreamJobConfig, UpdateConfig
from connectors.exceptions import ConfigError, ConfigProblem
from schemas import load_schema
from schemas.exceptions import SchemaNotFoundError
from schemas.serde import fingerprint, schema_json
from stream_app.avro_schemas import (
    TIMESTAMP_MICROS,
    JoinedFields,
    enriched_schema,
    fields_of,
    nullable,
    record_name_for,
    string_key_schema,
    subset_schema,
)

_NUMERIC = {"int", "long", "float", "double"}
_TIMESTAMPS = {"timestamp-millis", "timestamp-micros"}


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


@dataclass
class UpdatePlan:
    """An update topic's key and value schemas."""

    config: UpdateConfig
    key: Schema
    value: Schema
    aggregations: list[tuple[str, str, str | None]] = field(default_factory=list)  # (output, fn, field)


@dataclass
class JobPlan:
    """The stream job's resolved config."""

    config: StreamJobConfig
    events: Schema
    snapshots: dict[str, SnapshotPlan]
    enriched: Schema
    updates: list[UpdatePlan]


def _schema(avro: dict[str, Any]) -> Schema:
    return Schema(avro, schema_json(avro), fingerprint(avro))


def spark_type(spark: Any, schema: Schema) -> Any:
    """The Spark type ``from_avro`` gives this schema (Spark's own SchemaConverters, in the JVM)."""
    from pyspark.sql.types import StructType

    jvm = spark.sparkContext._jvm
    parsed = jvm.org.apache.avro.Schema.Parser().parse(schema.json)
    sql_type = jvm.org.apache.spark.sql.avro.SchemaConverters.toSqlType(parsed)
    return StructType.fromJson(json.loads(sql_type.dataType().json()))


_NAMES: dict[bytes, str | None] = {}


def full_name(schema: Any) -> str | None:
    """The full name of a named Avro schema (``None`` for unnamed ones)."""
    if not isinstance(schema, dict) or "name" not in schema:
        return None
    name, namespace = schema["name"], schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def writers_for(writers: dict[bytes, str], reader: dict[str, Any]) -> dict[bytes, str]:
    """The writer schemas Avro resolution can map to ``reader``: same full name, or one of its aliases.

    The schema topic is shared by every producer of the cluster; decoding with
    one ``when`` branch per writer schema of *every* entity would make each
    plan grow with the cluster. Named-type resolution needs matching names
    anyway (Avro specification, "Schema Resolution").

    Args:
        writers: fingerprint -> writer schema JSON (all known).
        reader: the reader schema.

    Returns:
        The subset that can resolve to ``reader``.
    """
    wanted = {full_name(reader)}
    namespace = reader.get("namespace") or ""
    for alias in reader.get("aliases", []):
        wanted.add(alias if "." in alias or not namespace else f"{namespace}.{alias}")
    out = {}
    for fp, text in writers.items():
        if fp not in _NAMES:
            try:
                _NAMES[fp] = full_name(json.loads(text))
            except ValueError:
                _NAMES[fp] = None
        if _NAMES[fp] in wanted:
            out[fp] = text
    return out


def _base_type(avro_type: Any) -> Any:
    """The non-null branch of an optional type."""
    if isinstance(avro_type, list):
        rest = [b for b in avro_type if b != "null"]
        return rest[0] if len(rest) == 1 else avro_type
    return avro_type


def _is_numeric(avro_type: Any) -> bool:
    t = _base_type(avro_type)
    return (t in _NUMERIC) or (isinstance(t, dict) and t.get("type") in _NUMERIC and "logicalType" not in t)


def _is_timestamp(avro_type: Any) -> bool:
    t = _base_type(avro_type)
    return isinstance(t, dict) and t.get("logicalType") in _TIMESTAMPS


def build_plan(config: StreamJobConfig, spark: Any | None = None, base_dir: Path | None = None) -> JobPlan:
    """Resolve the config against its schemas.

    Args:
        config: the ``stream:`` section.
        spark: a SparkSession to derive Spark types with; ``None`` skips them
            (``threes validate`` needs no JVM).
        base_dir: where relative schema paths start (the config file's
            folder); the current directory and the shipped schemas are tried next.

    Returns:
        The plan.

    Raises:
        ConfigError: every problem found, with its path under ``stream``.
    """
    problems: list[ConfigProblem] = []

    def problem(path: str, message: str) -> None:
        problems.append(ConfigProblem(f"stream.{path}", message))

    def load(ref: str, path: str) -> dict[str, Any] | None:
        for folder in (base_dir, Path.cwd()) if base_dir is not None else (Path.cwd(),):
            try:
                avro = load_schema(ref, folder)
            except SchemaNotFoundError as exc:
                last = exc
                continue
            if not isinstance(avro, dict) or avro.get("type") != "record":
                problem(path, f"{ref}: the schema must be an Avro record")
                return None
            return avro
        problem(path, str(last))
        return None

    event = load(config.events.value_schema, "events.value_schema")
    if event is not None:
        internal = [f["name"] for f in event["fields"] if f["name"].startswith("__")]
        if internal:
            problem("events.value_schema", f"field names starting with '__' are reserved: {internal}")
    snaps: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for i, snap in enumerate(config.snapshots):
        if snap.key_format == "string":  # plain UTF-8 keys: one string field, no schema to load
            key: dict[str, Any] | None = string_key_schema(snap.name, snap.key_field or "key")
        else:
            key = load(snap.key_schema or "", f"snapshots[{i}].key_schema")
        value = load(snap.value_schema, f"snapshots[{i}].value_schema")
        if key is not None and value is not None:
            snaps[snap.name] = (key, value)

    joins: list[JoinedFields] = []
    for i, lookup in enumerate(config.lookups):
        if lookup.snapshot not in snaps or event is None:
            continue
        key, value = snaps[lookup.snapshot]
        event_fields, key_fields, value_fields = fields_of(event), fields_of(key), fields_of(value)
        for ev, kf in lookup.on.items():
            if ev not in event_fields:
                problem(f"lookups[{i}].on.{ev}", f"no field {ev!r} in the event schema {full_name(event)}")
            if kf not in key_fields:
                problem(f"lookups[{i}].on.{ev}", f"no field {kf!r} in the key schema of snapshot {lookup.snapshot}")
        missing = sorted(set(key_fields) - set(lookup.on.values()))
        if missing:
            problem(f"lookups[{i}].on", f"map every key field of snapshot {lookup.snapshot}; missing {missing}")
        for name in lookup.fields or []:
            if name not in value_fields:
                problem(f"lookups[{i}].fields", f"no field {name!r} in the value schema of snapshot {lookup.snapshot}")
        joins.append(JoinedFields(lookup.prefix, value, lookup.fields, lookup.how == "left"))

    enriched: dict[str, Any] | None = None
    if event is not None and len(joins) == len(config.lookups) and not problems:
        try:
            enriched = enriched_schema(event, joins)
        except ValueError as exc:
            problem("lookups", str(exc))

    updates: list[UpdatePlan] = []
    if enriched is not None:
        for j, update in enumerate(config.updates):
            plan = _update_plan(update, enriched, lambda path, msg, j=j: problem(f"updates[{j}].{path}", msg))
            if plan is not None:
                updates.append(plan)
    if problems:
        raise ConfigError(problems)
    assert event is not None and enriched is not None  # no problems: both were loaded

    snapshot_plans = {
        snap.name: SnapshotPlan(
            snap,
            _schema(snaps[snap.name][0]),
            _schema(snaps[snap.name][1]),
            hashlib.sha256((schema_json(snaps[snap.name][0]) + schema_json(snaps[snap.name][1])).encode()).hexdigest()[
                :16
            ],
        )
        for snap in config.snapshots
    }
    plan = JobPlan(config, _schema(event), snapshot_plans, _schema(enriched), updates)
    if spark is not None:
        plan.events.spark_type = spark_type(spark, plan.events)
        plan.enriched.spark_type = spark_type(spark, plan.enriched)
        for snap in snapshot_plans.values():
            snap.key.spark_type = spark_type(spark, snap.key)
            snap.value.spark_type = spark_type(spark, snap.value)
    return plan


def _update_plan(update: UpdateConfig, enriched: dict[str, Any], problem: Any) -> UpdatePlan | None:
    """Schemas of one update topic; ``None`` after reporting problems."""
    available = fields_of(enriched)
    ok = True

    def need(path: str, names: list[str]) -> None:
        nonlocal ok
        for name in names:
            if name not in available:
                problem(path, f"no field {name!r} in the enriched event (have: {sorted(available)})")
                ok = False

    if update.kind == "projection":
        need("key", list(update.key or []))
        need("fields", list(update.fields or []))
        if update.version not in ("offset", "timestamp"):
            need("version", [update.version])
            if update.version in available and not _is_numeric(available[update.version]["type"]):
                problem("version", f"field {update.version!r} is not numeric (int, long, float, double)")
                ok = False
        if not ok:
            return None
        key = subset_schema(enriched, list(update.key or []), record_name_for(update.topic, "Key"))
        value = subset_schema(enriched, list(update.fields or available), record_name_for(update.topic, "Value"))
        return UpdatePlan(update, _schema(key), _schema(value))

    group_by = list(update.group_by or [])
    need("group_by", group_by)
    need("event_time", [update.event_time or ""])
    if update.event_time in available and not _is_timestamp(available[update.event_time]["type"]):
        problem("event_time", f"field {update.event_time!r} is not an Avro timestamp-millis/micros")
        ok = False
    aggregations: list[tuple[str, str, str | None]] = []
    extra: list[dict[str, Any]] = []
    for out, spec in (update.aggregations or {}).items():
        m = AGGREGATION.match(spec.replace(" ", ""))
        fn, source = (m.group("fn") or "count", m.group("field")) if m else ("count", None)
        if out in group_by or out in ("window_start", "window_end"):
            problem(f"aggregations.{out}", "an output field may not repeat a group_by field or window_start/_end")
            ok = False
        if source is not None:
            need(f"aggregations.{out}", [source])
            if source in available and not _is_numeric(available[source]["type"]):
                problem(f"aggregations.{out}", f"field {source!r} is not numeric (int, long, float, double)")
                ok = False
        aggregations.append((out, fn, source))
        if fn == "count":
            extra.append({"name": out, "type": "long"})
        elif fn == "mean":
            extra.append(nullable({"name": out, "type": "double"}))
        elif fn == "sum" and source in available:
            base = _base_type(available[source]["type"])
            base = base.get("type") if isinstance(base, dict) else base
            extra.append(nullable({"name": out, "type": "long" if base in ("int", "long") else "double"}))
        elif source in available:
            extra.append(nullable({"name": out, "type": available[source]["type"]}))
    if not ok:
        return None
    window = [
        {"name": "window_start", "type": TIMESTAMP_MICROS},
        {"name": "window_end", "type": TIMESTAMP_MICROS},
    ]
    key = subset_schema(enriched, group_by, record_name_for(update.topic, "Key"), window[:1])
    value = subset_schema(enriched, group_by, record_name_for(update.topic, "Value"), window + extra)
    return UpdatePlan(update, _schema(key), _schema(value), aggregations)
