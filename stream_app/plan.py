"""The job's plan: the YAML config resolved against its Avro schemas, checked once at start-up.

Everything the config can only be checked against the schemas for (event and
key fields of lookups, update keys, aggregation fields) is checked here, and
every problem is reported at once as a :class:`~kernel.exceptions.ConfigError`
with its path in the file (``stream.lookups[1].on.dest``). The output schemas
(enriched events, update keys and values) are derived here too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from kernel.exceptions import ConfigError, ConfigProblem
from schemas import load_schema
from schemas.debezium import after_schema, envelope_reader
from schemas.exceptions import SchemaNotFoundError
from schemas.serde import fingerprint, schema_json
from stream_app.aggregation_specs import parse_aggregation
from stream_app.avro_schemas import (
    TIMESTAMP_MICROS,
    JoinedFields,
    enriched_schema,
    fields_of,
    nullable,
    record_name_for,
    string_key_schema,
    subset_schema,
    with_derived,
)
from stream_app.config import StreamJobConfig
from stream_app.expressions import Expression, ExpressionError, check, is_unknown, parse, type_class
from stream_app.snapshot_config import SnapshotConfig
from stream_app.stages import Step, order_steps
from stream_app.transform import INTERNAL_PREFIX, Transform, internal_fields, load_transform, output_type
from stream_app.update_config import UpdateConfig

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


def _schema(avro: dict[str, Any]) -> Schema:
    return Schema(avro, schema_json(avro), fingerprint(avro))


def _spark_typer(spark: Any) -> Any:
    """The Avro type of a derive column as Spark computes it (exact decimal precision), at the job's start."""

    def typer(columns: dict[str, Any], name: str, expression: Expression) -> Any:
        from pyspark.sql import functions as f

        record = {"type": "record", "name": "DeriveInput", "namespace": "threes.derive",
                  "fields": [{"name": n, "type": t} for n, t in columns.items() if t is not None]}
        frame = spark.createDataFrame([], spark_type(spark, _schema(record)))
        try:
            result = frame.select(f.expr(expression.text).alias(name)).schema[0].dataType
        except Exception as exc:  # noqa: BLE001 - Spark's analyzer says what is wrong, in its words
            raise ExpressionError(f"{expression.text!r}: {str(exc).splitlines()[0]}") from exc
        return ["null", avro_of_spark(spark, result, name)]

    return typer


def avro_of_spark(spark: Any, data_type: Any, name: str) -> Any:
    """The Avro type ``to_avro`` writes a Spark type as (decimals as ``bytes``, timestamps in microseconds).

    Args:
        spark: the SparkSession (complex types are converted by Spark's own ``SchemaConverters``).
        data_type: a ``pyspark.sql.types.DataType``.
        name: the column's name (names a record type).

    Returns:
        A non-null Avro type.
    """
    from pyspark.sql import types as T

    simple = {T.BooleanType: "boolean", T.ByteType: "int", T.ShortType: "int", T.IntegerType: "int",
              T.LongType: "long", T.FloatType: "float", T.DoubleType: "double", T.StringType: "string",
              T.BinaryType: "bytes"}
    for kind, avro in simple.items():
        if isinstance(data_type, kind):
            return avro
    if isinstance(data_type, T.DecimalType):
        return _decimal_type(data_type.precision, data_type.scale)
    if isinstance(data_type, T.DateType):
        return {"type": "int", "logicalType": "date"}
    if isinstance(data_type, T.TimestampNTZType):
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if isinstance(data_type, T.TimestampType):
        return TIMESTAMP_MICROS
    jvm = spark.sparkContext._jvm
    parsed = spark._jsparkSession.parseDataType(data_type.json())
    avro = json.loads(jvm.org.apache.spark.sql.avro.SchemaConverters.toAvroType(
        parsed, False, name, f"threes.derived.{name}").toString())
    return avro


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
    if isinstance(t, dict):
        return t.get("type") in _NUMERIC and "logicalType" not in t
    return isinstance(t, str) and t in _NUMERIC


def _is_timestamp(avro_type: Any) -> bool:
    t = _base_type(avro_type)
    return isinstance(t, dict) and t.get("logicalType") in _TIMESTAMPS


def is_date(avro_type: Any) -> bool:
    """Whether a field type is an Avro ``date`` (days since the epoch)."""
    t = _base_type(avro_type)
    return isinstance(t, dict) and t.get("logicalType") == "date"


def decimal_of(avro_type: Any) -> tuple[int, int] | None:
    """``(precision, scale)`` of an Avro ``decimal`` field type, else ``None``."""
    t = _base_type(avro_type)
    if isinstance(t, dict) and t.get("logicalType") == "decimal":
        return int(t["precision"]), int(t.get("scale", 0))
    return None


def _decimal_type(precision: int, scale: int) -> dict[str, Any]:
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}


_NUMERIC_ONLY = {"mean", "sum", "min", "max", "stddev", "percentile"}
"""Aggregate functions over numbers (int, long, float, double, decimal); the others take any scalar field."""


def _is_scalar(avro_type: Any) -> bool:
    """Whether a field type is a primitive or a logical type (optional or not): no named or container type."""
    t = _base_type(avro_type)
    if isinstance(t, dict):
        t = t.get("type")
    return isinstance(t, str) and t not in ("null", "record", "enum", "fixed", "array", "map")


def _aggregate_field(out: str, fn: str, source_type: Any) -> dict[str, Any]:
    """The Avro field of an aggregate ``fn`` (not ``count``) over a field of type ``source_type``.

    The types are Spark's result types, so records encode without a lossy cast:
    ``sum``/``mean`` of a ``decimal(p,s)`` are exact decimals (Spark's ``p+10, s`` and
    ``p+4, s+4``, at most 38 digits); ``sum`` of ``int``/``long`` is a ``long``, of
    ``float``/``double`` a ``double``; ``mean`` and ``stddev`` (sample) are ``double``;
    ``count_distinct`` and ``approx_count_distinct`` a ``long`` (0 when every value is
    null, never null); ``min``/``max``, ``first``/``last`` and ``percentile`` the field's
    own type (``percentile_approx`` returns one of the values it saw). All but the counts
    are nullable: ``null`` when every value of the window is (``first``/``last``: when the
    earliest/latest event's is), ``stddev`` of a single event too.
    """
    decimal = decimal_of(source_type)
    if fn in ("count_distinct", "approx_count_distinct"):
        return {"name": out, "type": "long"}
    if decimal is not None and fn in ("sum", "mean"):
        p, sc = decimal
        out_type = _decimal_type(min(38, p + 10), sc) if fn == "sum" else _decimal_type(min(38, p + 4), min(38, sc + 4))
        return nullable({"name": out, "type": out_type})
    if fn in ("mean", "stddev"):
        return nullable({"name": out, "type": "double"})
    if fn == "sum":
        base = _base_type(source_type)
        base = base.get("type") if isinstance(base, dict) else base
        return nullable({"name": out, "type": "long" if base in ("int", "long") else "double"})
    return nullable({"name": out, "type": source_type})


_PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}
"""Avro schema resolution: writer primitive -> reader primitives it resolves to (Avro specification)."""


def _resolves(writer: Any, reader: Any) -> bool:
    """Whether a writer field type can be read as the reader field type (a conservative check).

    Primitives follow Avro's promotions; unions resolve when every writer branch
    resolves to some reader branch; other types (records, logical types) must
    have the same encoding (names aside).
    """
    from stream_app.avro_schemas import _encoded_shape

    if isinstance(writer, list):
        return all(_resolves(w, reader) for w in writer)
    if isinstance(reader, list):
        return any(_resolves(writer, r) for r in reader)
    if isinstance(writer, str) and isinstance(reader, str):
        return reader in _PROMOTIONS.get(writer, {writer})
    return _encoded_shape(writer) == _encoded_shape(reader)


def match_writers(reader: dict[str, Any], writers: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Match the writer schemas a snapshot's topics carry to its reader schema, by field names.

    A writer record with another name than the reader's becomes one of the
    reader's aliases when the reader can read it (Avro resolution needs a
    matching name or alias; the user no longer writes them). A writer it cannot
    read is a problem: the snapshot would send every record of it to the dead
    letter topic.

    Args:
        reader: the reader record schema; its ``aliases`` are extended in place.
        writers: ``(topic, writer schema)`` for every version of every topic's subject.

    Returns:
        One message per writer schema the reader cannot read (topic, writer
        record name, missing fields or alias); empty when all match.
    """
    problems: list[str] = []
    reader_name = full_name(reader)
    aliases = list(reader.get("aliases", []))
    namespace = reader.get("namespace") or ""
    known = {reader_name} | {a if "." in a or not namespace else f"{namespace}.{a}" for a in aliases}
    for topic, writer in writers:
        name = full_name(writer)
        if not isinstance(writer, dict) or writer.get("type") != "record":
            problems.append(f"topic {topic!r}: writer schema {name} is not a record")
            continue
        have = {f["name"]: f for f in writer["fields"]}
        for f in writer["fields"]:
            for alias in f.get("aliases", []):
                have.setdefault(alias, f)
        missing, wrong = [], []
        for f in reader["fields"]:
            match = next((have[n] for n in [f["name"], *f.get("aliases", [])] if n in have), None)
            if match is None:
                if "default" not in f:
                    missing.append(f["name"])
            elif not _resolves(match["type"], f["type"]):
                wrong.append(f["name"])
        if missing or wrong:
            detail = "; ".join(
                part
                for part in (
                    f"no field(s) {missing} (and the reader gives no default)" if missing else "",
                    f"field(s) {wrong} of another type" if wrong else "",
                )
                if part
            )
            problems.append(f"topic {topic!r}: writer record {name} does not resolve to reader {reader_name}: {detail}")
        elif name not in known:
            aliases.append(name)
            known.add(name)
    if aliases:
        reader["aliases"] = aliases
    return problems


WriterVersions = Callable[[str], list[str]]
"""subject (``<topic>-key`` / ``<topic>-value``) -> the JSON of its writer schema versions, oldest first."""


def build_plan(
    config: StreamJobConfig,
    spark: Any | None = None,
    base_dir: Path | None = None,
    writer_versions: WriterVersions | None = None,
) -> JobPlan | None:
    """Resolve the config against its schemas.

    Args:
        config: the ``stream:`` section.
        spark: a SparkSession to derive Spark types with; ``None`` skips them
            (``threes validate`` needs no JVM).
        base_dir: where relative schema paths start (the config file's folder;
            the config loader already made them absolute); the current directory
            when ``None``, the shipped schemas next.
        writer_versions: the schema store's subject versions
            (:meth:`schemas.store.SchemaStore.version_schemas`): snapshots without
            reader schemas read with the latest writer schema of their topics, and
            every writer schema is matched to the reader (:func:`match_writers`).
            ``None`` (``threes validate``, no connection): what needs the topics'
            schemas is not checked.

    A ``transform`` is imported here; with ``spark`` it runs once on an empty DataFrame
    and the enriched event is what it returns (:func:`stream_app.transform.output_type`),
    so the updates are checked against its output. Without ``spark`` its output is
    unknown: a field the updates read that is not in the enriched event is accepted.

    Returns:
        The plan; ``None`` when ``writer_versions`` is ``None`` and a snapshot has
        no reader schema, or when a ``transform`` is set and ``spark`` is ``None``
        (every check that could be made passed).

    Raises:
        ConfigError: every problem found, with its path under ``stream``.
    """
    problems: list[ConfigProblem] = []

    def problem(path: str, message: str) -> None:
        problems.append(ConfigProblem(f"stream.{path}", message))

    from stream_app.realtime import realtime_problems

    for path, message in realtime_problems(config):  # what Spark's real-time mode cannot run (mode: realtime)
        problem(path, message)

    def load(ref: str, path: str) -> dict[str, Any] | None:
        try:
            avro = load_schema(ref, base_dir or Path.cwd())
        except SchemaNotFoundError as exc:
            problem(path, str(exc))
            return None
        if not isinstance(avro, dict) or avro.get("type") != "record":
            problem(path, f"{ref}: the schema must be an Avro record")
            return None
        return avro

    def writers_of(snap: SnapshotConfig, kind: str) -> list[tuple[str, dict[str, Any]]]:
        assert writer_versions is not None
        return [(t, json.loads(text)) for t in snap.topics for text in writer_versions(f"{t}-{kind}")]

    envelopes: dict[str, dict[str, Any]] = {}  # snapshot -> Debezium envelope reader (Avro formats)

    def debezium_rows(i: int, snap: SnapshotConfig) -> list[tuple[str, dict[str, Any]]]:
        """The ``after`` records of a Debezium snapshot's writer envelopes."""
        rows = []
        for topic, envelope in writers_of(snap, "value"):
            try:
                rows.append((topic, after_schema(envelope)))
            except ValueError as exc:
                problem(f"snapshots[{i}].envelope", f"topic {topic!r}: {exc}")
        return rows

    def snapshot_schema(i: int, snap: SnapshotConfig, kind: str, ref: str | None) -> dict[str, Any] | None:
        path = f"snapshots[{i}].{kind}_schema"
        fmt = snap.key_format if kind == "key" else snap.value_format
        debezium = kind == "value" and snap.envelope == "debezium"
        if fmt == "connect_json":  # the records carry their schemas; no store keeps them (ref is required)
            return load(ref, path) if ref is not None else None
        if ref is not None:
            reader = load(ref, path)
        elif writer_versions is None:
            return None
        else:
            writers = debezium_rows(i, snap) if debezium else writers_of(snap, kind)
            if not writers:
                problem(path, f"no {kind} schema recorded for topic(s) {snap.topics} (subject <topic>-{kind} in the "
                              f"schema topic): start the source that writes them first, or set {kind}_schema")
                return None
            # the latest schema of the first topic (of any topic when it has none yet) reads them all
            first = [w for t, w in writers if t == snap.topics[0]] or [w for _, w in writers]
            reader = {k: v for k, v in first[-1].items() if k != "aliases"}
        if reader is None or writer_versions is None:
            return reader
        for message in match_writers(reader, debezium_rows(i, snap) if debezium else writers_of(snap, kind)):
            problem(path, message)
        if debezium:
            found = [envelope for _, envelope in writers_of(snap, "value")]
            if found:
                envelopes[snap.name] = envelope_reader(reader, found)
            else:
                problem(f"snapshots[{i}].envelope", f"no change event schema recorded for topic(s) {snap.topics} "
                        "(subject <topic>-value): start the connector that writes them first")
        return reader

    transform: Transform | None = None
    if config.transform is not None:
        try:
            transform = load_transform(config.transform, base_dir)
        except ValueError as exc:
            problem("transform", str(exc))
    event = load(config.events.value_schema, "events.value_schema")
    if event is not None:
        internal = [f["name"] for f in event["fields"] if f["name"].startswith("__")]
        if internal:
            problem("events.value_schema", f"field names starting with '__' are reserved: {internal}")
    snaps: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    unknown: set[str] = set()  # snapshots whose schemas only the topics know (validate without a connection)
    for i, snap in enumerate(config.snapshots):
        if snap.key_format == "string":  # plain UTF-8 keys: one string field, no schema to load
            key: dict[str, Any] | None = string_key_schema(snap.name, snap.key_field or "key")
        else:
            key = snapshot_schema(i, snap, "key", snap.key_schema)
        value = snapshot_schema(i, snap, "value", snap.value_schema)
        if key is not None and value is not None:
            snaps[snap.name] = (key, value)
        elif writer_versions is None and (snap.value_schema is None or snap.key_schema is None):
            unknown.add(snap.name)

    joins, joined, open_prefixes = _plan_lookups(config, event, snaps, problem)

    steps: list[Step] = []
    derived: dict[str, Any] = {}
    if event is not None:
        typer = _spark_typer(spark) if spark is not None and not open_prefixes else None
        steps, derived = order_steps(
            config, {n: f["type"] for n, f in fields_of(event).items()}, joined, problem, typer
        )

    if event is not None:
        _check_as_of(config, {n: f["type"] for n, f in fields_of(event).items()}, derived, joined, problem)

    enriched: dict[str, Any] | None = None
    if event is not None:
        try:
            enriched = with_derived(enriched_schema(event, joins), derived)
        except ValueError as exc:
            problem("lookups", str(exc))
    if enriched is not None and config.transform is not None:
        enriched = _apply_transform(config, spark, transform, enriched, open_prefixes, problem)
    if enriched is not None and open_prefixes:
        # every problem at once: the updates are checked against what is known, a field under the prefix
        # of a lookup that could not be joined is accepted (its schema is unknown here)
        for j, update in enumerate(config.updates):
            try:
                _update_plan(update, enriched, lambda path, msg, j=j: problem(f"updates[{j}].{path}", msg),
                             open_prefixes)
            except ValueError:
                pass  # a field of a lookup not joined: reported with the lookup, or derived at start-up
        enriched = None

    updates: list[UpdatePlan] = []
    if enriched is not None:
        for j, update in enumerate(config.updates):
            update_plan = _update_plan(update, enriched, lambda path, msg, j=j: problem(f"updates[{j}].{path}", msg))
            if update_plan is not None:
                updates.append(update_plan)
    if problems:
        raise ConfigError(problems)
    if unknown or enriched is None:
        return None  # only without writer versions: a snapshot's schemas are known at start-up
    assert event is not None and enriched is not None  # no problems: both were loaded

    snapshot_plans = {snap.name: _snapshot_plan(snap, *snaps[snap.name]) for snap in config.snapshots}
    for name, envelope in envelopes.items():
        snapshot_plans[name].envelope = _schema(envelope)
    job_plan = JobPlan(config, _schema(event), snapshot_plans, _schema(enriched), updates, steps, transform)
    if spark is not None:
        job_plan.events.spark_type = spark_type(spark, job_plan.events)
        job_plan.enriched.spark_type = spark_type(spark, job_plan.enriched)
        for snapshot in snapshot_plans.values():
            snapshot.key.spark_type = spark_type(spark, snapshot.key)
            snapshot.value.spark_type = spark_type(spark, snapshot.value)
            if snapshot.envelope is not None:
                snapshot.envelope.spark_type = spark_type(spark, snapshot.envelope)
    return job_plan


def _snapshot_plan(config: SnapshotConfig, key: dict[str, Any], value: dict[str, Any]) -> SnapshotPlan:
    """A snapshot's schemas, and the id of the pair (an older checkpoint of other reader schemas is not used)."""
    schema_id = hashlib.sha256((schema_json(key) + schema_json(value)).encode()).hexdigest()[:16]
    return SnapshotPlan(config, _schema(key), _schema(value), schema_id)


def _plan_lookups(
    config: StreamJobConfig,
    event: dict[str, Any] | None,
    snaps: dict[str, tuple[dict[str, Any], dict[str, Any]]],
    problem: Callable[[str, str], None],
) -> tuple[list[JoinedFields], dict[int, dict[str, Any] | None], list[str]]:
    """Check each lookup against its snapshot's key and value schemas.

    Returns:
        What each joinable lookup adds (for the enriched schema), the columns each lookup adds by index
        (``None`` when its snapshot's schemas are unknown here or it has problems), and the prefixes
        of those lookups, whose columns the later checks accept unchecked.
    """
    joins: list[JoinedFields] = []
    joined: dict[int, dict[str, Any] | None] = {}  # per lookup, the columns it adds (None: schemas unknown here)
    open_prefixes: list[str] = []  # lookups not joined (unknown snapshot or problems): their fields go unchecked
    for i, lookup in enumerate(config.lookups):
        if lookup.snapshot not in snaps or event is None:
            open_prefixes.append(lookup.prefix)
            joined[i] = None
            continue
        key, value = snaps[lookup.snapshot]
        value_fields = fields_of(value)
        found = _lookup_problems(i, lookup, key, value)
        for path, message in found:
            problem(path, message)
        if found:
            open_prefixes.append(lookup.prefix)
            joined[i] = None
        else:
            join = JoinedFields(lookup.prefix, value, lookup.fields, lookup.how == "left")
            joins.append(join)
            joined[i] = {
                f"{lookup.prefix}{name}": (nullable({"name": "_", "type": value_fields[name]["type"]})["type"]
                                           if join.optional else value_fields[name]["type"])
                for name in (lookup.fields or list(value_fields))
            }
    return joins, joined, open_prefixes


def _lookup_problems(i: int, lookup: Any, key: dict[str, Any], value: dict[str, Any]) -> list[tuple[str, str]]:
    """``(path, message)`` for each field of lookup ``i`` its snapshot's key or value schema lacks."""
    found: list[tuple[str, str]] = []
    key_fields, value_fields = fields_of(key), fields_of(value)
    for ev, kf in lookup.on.items():
        if kf not in key_fields:
            found.append((f"lookups[{i}].on.{ev}", f"no field {kf!r} in the key schema of snapshot {lookup.snapshot}"))
    missing = sorted(set(key_fields) - set(lookup.on.values()))
    if missing:
        found.append((f"lookups[{i}].on", f"map every key field of snapshot {lookup.snapshot}; missing {missing}"))
    for name in lookup.fields or []:
        if name not in value_fields:
            found.append((f"lookups[{i}].fields",
                          f"no field {name!r} in the value schema of snapshot {lookup.snapshot}"))
    return found


def _apply_transform(
    config: StreamJobConfig,
    spark: Any,
    transform: Transform | None,
    enriched: dict[str, Any],
    open_prefixes: list[str],
    problem: Callable[[str, str], None],
) -> dict[str, Any] | None:
    """The enriched schema after ``stream.transform`` (its output, known only with Spark).

    Without Spark (``validate``), or when lookups could not be planned, the output is unknown:
    ``""`` joins ``open_prefixes`` (any field an update names may be one the function adds) and
    ``enriched`` is returned as it is. ``None`` after a problem (reported at ``stream.transform``).
    """
    if spark is None or transform is None or open_prefixes:
        open_prefixes.append("")  # its output is unknown here: any field the updates name may be one it adds
        return enriched
    try:
        transformed: dict[str, Any] | None = _transformed(spark, enriched, transform, _kafka_timestamp(config))
    except ValueError as exc:
        problem("transform", str(exc))
        transformed = None
    if transformed is not None:
        # a column the updates read that the function dropped: its fault, said at its key
        dropped = set(fields_of(enriched)) - set(fields_of(transformed))
        for j, update in enumerate(config.updates):
            for attr, names in _update_reads(update).items():
                gone = [n for n in names if n in dropped]
                if gone:
                    problem("transform", f"the function drops {gone}, which stream.updates[{j}].{attr} "
                                         f"reads: keep them (a transform adds columns and filters rows)")
                    transformed = None
    return transformed


def _kafka_timestamp(config: StreamJobConfig) -> bool:
    """Whether the decoded events carry ``__timestamp`` (a projection's version is the Kafka timestamp)."""
    return any(u.kind == "projection" and u.version == "timestamp" for u in config.updates)


def _update_reads(update: UpdateConfig) -> dict[str, list[str]]:
    """The enriched event's columns an update reads, by its key (``key``, ``fields``, ``where``...)."""
    reads: dict[str, list[str]] = {
        "key": list(update.key or []),
        "fields": list(update.fields or []),
        "group_by": list(update.group_by or []),
        "event_time": [update.event_time] if update.event_time else [],
    }
    if update.kind == "projection" and update.version not in ("offset", "timestamp"):
        reads["version"] = [update.version]
    for out, spec in (update.aggregations or {}).items():
        source = parse_aggregation(spec).field
        reads[f"aggregations.{out}"] = [source] if source else []
    for attr in ("where", "delete_when"):
        text = getattr(update, attr)
        try:
            reads[attr] = sorted(parse(text).columns) if text else []
        except ExpressionError:
            reads[attr] = []  # reported where the update is planned
    return {attr: names for attr, names in reads.items() if names}


def _transformed(spark: Any, enriched: dict[str, Any], fn: Transform, timestamp: bool) -> dict[str, Any]:
    """The enriched event's schema after ``stream.transform``: its output columns but the internal ones.

    A column the transform kept with its Spark type keeps its Avro field (a
    ``timestamp-millis`` stays one; made optional if the transform made it nullable);
    a new or retyped column gets the Avro type ``to_avro`` writes its Spark type as
    (:func:`avro_of_spark`), optional when Spark says it is nullable.

    Raises:
        ValueError: the transform failed or dropped internal columns (:func:`~stream_app.transform.output_type`),
            or a column's name is not an Avro name, repeats another's, or its type has no Avro encoding.
    """
    before = spark_type(spark, _schema(enriched))
    out = output_type(spark, before, fn, internal_fields(timestamp))
    avro_fields = {f["name"]: f for f in enriched["fields"]}
    spark_fields = {f.name: f for f in before.fields}
    fields: list[dict[str, Any]] = []
    seen: set[str] = set()
    for col in out.fields:
        if col.name.startswith(INTERNAL_PREFIX):
            continue
        if not _AVRO_NAME.match(col.name):
            raise ValueError(f"column {col.name!r} is not an Avro name ([A-Za-z_][A-Za-z0-9_]*): rename it")
        if col.name.lower() in seen:
            raise ValueError(f"column {col.name!r} appears twice in the function's output")
        seen.add(col.name.lower())
        old = spark_fields.get(col.name)
        if old is not None and old.dataType == col.dataType:
            kept = avro_fields[col.name]
            fields.append(nullable(kept) if col.nullable and not old.nullable else kept)
            continue
        try:
            avro = avro_of_spark(spark, col.dataType, col.name)
        except Exception as exc:  # noqa: BLE001 - Spark's SchemaConverters says which type it cannot write
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"column {col.name!r} of Spark type {col.dataType.simpleString()} cannot be written as "
                             f"Avro: {first}") from exc
        new = {"name": col.name, "type": avro}
        fields.append(nullable(new) if col.nullable else new)
    return {**enriched, "fields": fields}


_AVRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _check_as_of(
    config: StreamJobConfig,
    event_fields: dict[str, Any],
    derived: dict[str, Any],
    joined: dict[int, dict[str, Any] | None],
    problem: Callable[[str, str], None],
) -> None:
    """``as_of`` of a lookup names a timestamp or date column (event field, derive column or looked-up column).

    A column whose type is unknown here (a lookup whose snapshot schemas only the topics know) is
    not checked; a column that exists nowhere is reported by :func:`~stream_app.stages.order_steps`.
    """
    columns = {**event_fields, **derived}
    for cols in joined.values():
        columns.update(cols or {})
    for i, lookup in enumerate(config.lookups):
        if lookup.wait_for_reference is not None and lookup.as_of is not None and lookup.as_of not in event_fields:
            # the wait reads the newest event time of the decoded events, before derive and the lookups run
            problem(f"lookups[{i}].wait_for_reference", f"as_of {lookup.as_of!r} is not an event field: "
                                                       "wait_for_reference needs the event's own time")
        if lookup.as_of is None or lookup.as_of not in columns or columns[lookup.as_of] is None:
            continue
        kind = columns[lookup.as_of]
        if not (_is_timestamp(kind) or is_date(kind)):
            problem(f"lookups[{i}].as_of", f"column {lookup.as_of!r} is not a timestamp or a date "
                                           f"(an Avro timestamp-millis/micros or date): it cannot say when an event "
                                           f"happened")


def _update_plan(
    update: UpdateConfig, enriched: dict[str, Any], problem: Any, open_prefixes: list[str] | None = None
) -> UpdatePlan | None:
    """Schemas of one update topic; ``None`` after reporting problems.

    ``open_prefixes``: prefixes of lookups whose snapshot schemas are unknown
    (validate without a connection): a field under one is accepted unchecked.
    """
    available = fields_of(enriched)
    ok = True
    for attr in ("where", "delete_when"):
        text = getattr(update, attr)
        if text is None:
            continue
        try:
            expression = parse(text)
            columns = {n: fld["type"] for n, fld in available.items()}
            # a column of an unknown origin (a lookup not joined here, or the transform) is of an unknown type
            columns.update({c: None for c in expression.columns
                            if c not in columns and any(c.startswith(p) for p in open_prefixes or [])})
            kind = type_class(check(expression, columns))
        except ExpressionError as exc:
            problem(attr, str(exc))
            ok = False
            continue
        if kind not in ("boolean", "unknown"):
            problem(attr, f"{text!r} is {kind}, not a boolean expression")
            ok = False

    def need(path: str, names: list[str]) -> None:
        nonlocal ok
        for name in names:
            if open_prefixes is not None and any(name.startswith(p) for p in open_prefixes):
                continue
            if name not in available:
                problem(path, f"no field {name!r} in the enriched event (have: {sorted(available)})")
                ok = False

    if update.kind == "projection":
        need("key", list(update.key or []))
        need("fields", list(update.fields or []))
        if update.version not in ("offset", "timestamp"):
            need("version", [update.version])
            version_type = available[update.version]["type"] if update.version in available else None
            if version_type is not None and not (_is_numeric(version_type) or is_unknown(version_type)):
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
    # a derive column sqlglot could not type (is_unknown) is checked by Spark when the job starts
    if update.event_time in available and not (
        _is_timestamp(available[update.event_time]["type"]) or is_date(available[update.event_time]["type"])
        or is_unknown(available[update.event_time]["type"])
    ):
        problem("event_time", f"field {update.event_time!r} is not an Avro timestamp-millis/micros or date")
        ok = False
    aggregations: list[Aggregate] = []
    extra: list[dict[str, Any]] = []
    for out, spec in (update.aggregations or {}).items():
        fn, source, p = parse_aggregation(spec)  # the config model accepted it: it parses
        if out in group_by or out in ("window_start", "window_end"):
            problem(f"aggregations.{out}", "an output field may not repeat a group_by field or window_start/_end")
            ok = False
        if source is not None:
            need(f"aggregations.{out}", [source])
        aggregations.append(Aggregate(out, fn, source, p))
        if fn == "count":
            extra.append({"name": out, "type": "long"})
            continue
        if source not in available:
            continue  # reported by need(), or a field of a lookup not joined (validate without a connection)
        source_type = available[source]["type"]
        if is_unknown(source_type):  # typed by Spark when the job starts; here the loosest output type
            extra.append(nullable({"name": out, "type": "long" if fn.endswith("count_distinct") else "string"}))
            continue
        if fn in _NUMERIC_ONLY and not (_is_numeric(source_type) or decimal_of(source_type)):
            problem(f"aggregations.{out}", f"field {source!r} is not numeric (int, long, float, double, decimal): "
                                           f"{fn} needs numbers")
            ok = False
            continue
        if fn not in _NUMERIC_ONLY and not _is_scalar(source_type):
            problem(f"aggregations.{out}", f"field {source!r} is a record, enum, fixed, array or map: {fn} takes a "
                                           f"field of a primitive or logical type")
            ok = False
            continue
        extra.append(_aggregate_field(out, fn, source_type))
    if not ok:
        return None
    window = [
        {"name": "window_start", "type": TIMESTAMP_MICROS},
        {"name": "window_end", "type": TIMESTAMP_MICROS},
    ]
    key = subset_schema(enriched, group_by, record_name_for(update.topic, "Key"), window[:1])
    value = subset_schema(enriched, group_by, record_name_for(update.topic, "Value"), window + extra)
    date = update.event_time in available and is_date(available[update.event_time or ""]["type"])
    return UpdatePlan(update, _schema(key), _schema(value), aggregations, date)
