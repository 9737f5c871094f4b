"""The enriched event's schema after ``stream.transform``, the user's function, run once on an empty DataFrame.

Its output is known only with Spark (at the job's start, in ``threes check``); a column the
updates read that the function dropped is reported at ``stream.transform``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from stream_app.aggregation_specs import parse_aggregation
from stream_app.avro_schemas import fields_of, nullable
from stream_app.config import StreamJobConfig, UpdateConfig
from stream_app.expressions import ExpressionError, parse
from stream_app.plan.model import schema_of
from stream_app.plan.spark_types import avro_of_spark, spark_type
from stream_app.transform import INTERNAL_PREFIX, Transform, internal_fields, output_type


def apply_transform(
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
    before = spark_type(spark, schema_of(enriched))
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
        except Exception as exc:  # Spark's SchemaConverters says which type it cannot write
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"column {col.name!r} of Spark type {col.dataType.simpleString()} cannot be written as "
                             f"Avro: {first}") from exc
        new = {"name": col.name, "type": avro}
        fields.append(nullable(new) if col.nullable else new)
    return {**enriched, "fields": fields}


_AVRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
