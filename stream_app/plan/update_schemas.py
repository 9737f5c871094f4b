"""An update topic's plan: its fields checked against the enriched event, its key and value schemas derived.

A projection's key, fields and version; an aggregation's ``group_by``, ``event_time`` and each
aggregate's field and output type; both kinds' ``where`` and ``delete_when`` (boolean expressions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stream_app.aggregation_specs import parse_aggregation
from stream_app.avro_schemas import TIMESTAMP_MICROS, fields_of, nullable, record_name_for, subset_schema
from stream_app.config import UpdateConfig
from stream_app.expressions import ExpressionError, check, is_unknown, parse, type_class
from stream_app.plan.avro_types import base_type, decimal_of, decimal_type, is_date, is_numeric, is_scalar, is_timestamp
from stream_app.plan.model import Aggregate, UpdatePlan, schema_of

_NUMERIC_ONLY = {"mean", "sum", "min", "max", "stddev", "percentile"}
"""Aggregate functions over numbers (int, long, float, double, decimal); the others take any scalar field."""


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
        out_type = decimal_type(min(38, p + 10), sc) if fn == "sum" else decimal_type(min(38, p + 4), min(38, sc + 4))
        return nullable({"name": out, "type": out_type})
    if fn in ("mean", "stddev"):
        return nullable({"name": out, "type": "double"})
    if fn == "sum":
        base = base_type(source_type)
        base = base.get("type") if isinstance(base, dict) else base
        return nullable({"name": out, "type": "long" if base in ("int", "long") else "double"})
    return nullable({"name": out, "type": source_type})


class _Fields:
    """The enriched event's fields, as one update names them; ``ok`` is false once a problem was reported."""

    def __init__(
        self, enriched: dict[str, Any], problem: Callable[[str, str], None], open_prefixes: list[str] | None
    ):
        self.available = fields_of(enriched)
        self.problem, self.open_prefixes = problem, open_prefixes
        self.ok = True

    def fail(self, path: str, message: str) -> None:
        """Report a problem of the update at ``path``."""
        self.problem(path, message)
        self.ok = False

    def need(self, path: str, names: list[str]) -> None:
        """Report each of ``names`` the enriched event lacks (a field under an open prefix is accepted)."""
        for name in names:
            if self.open_prefixes is not None and any(name.startswith(p) for p in self.open_prefixes):
                continue
            if name not in self.available:
                self.fail(path, f"no field {name!r} in the enriched event (have: {sorted(self.available)})")


def update_plan(
    update: UpdateConfig, enriched: dict[str, Any], problem: Any, open_prefixes: list[str] | None = None
) -> UpdatePlan | None:
    """Schemas of one update topic; ``None`` after reporting problems.

    ``open_prefixes``: prefixes of lookups whose snapshot schemas are unknown
    (validate without a connection): a field under one is accepted unchecked.
    """
    fields = _Fields(enriched, problem, open_prefixes)
    _check_filters(update, fields)
    if update.kind == "projection":
        return _projection_plan(update, enriched, fields)
    return _aggregation_plan(update, enriched, fields)


def _check_filters(update: UpdateConfig, fields: _Fields) -> None:
    """``where`` and ``delete_when`` parse, read known columns and are boolean."""
    for attr in ("where", "delete_when"):
        text = getattr(update, attr)
        if text is None:
            continue
        try:
            expression = parse(text)
            columns = {n: fld["type"] for n, fld in fields.available.items()}
            # a column of an unknown origin (a lookup not joined here, or the transform) is of an unknown type
            columns.update({c: None for c in expression.columns
                            if c not in columns and any(c.startswith(p) for p in fields.open_prefixes or [])})
            kind = type_class(check(expression, columns))
        except ExpressionError as exc:
            fields.fail(attr, str(exc))
            continue
        if kind not in ("boolean", "unknown"):
            fields.fail(attr, f"{text!r} is {kind}, not a boolean expression")


def _projection_plan(update: UpdateConfig, enriched: dict[str, Any], fields: _Fields) -> UpdatePlan | None:
    """A projection's key and value schemas: its key fields, its fields (all by default); a numeric version."""
    available = fields.available
    fields.need("key", list(update.key or []))
    fields.need("fields", list(update.fields or []))
    if update.version not in ("offset", "timestamp"):
        fields.need("version", [update.version])
        version_type = available[update.version]["type"] if update.version in available else None
        if version_type is not None and not (is_numeric(version_type) or is_unknown(version_type)):
            fields.fail("version", f"field {update.version!r} is not numeric (int, long, float, double)")
    if not fields.ok:
        return None
    key = subset_schema(enriched, list(update.key or []), record_name_for(update.topic, "Key"))
    value = subset_schema(enriched, list(update.fields or available), record_name_for(update.topic, "Value"))
    return UpdatePlan(update, schema_of(key), schema_of(value))


def _aggregation_plan(update: UpdateConfig, enriched: dict[str, Any], fields: _Fields) -> UpdatePlan | None:
    """An aggregation's key (``group_by`` + ``window_start``) and value (the window, each aggregate) schemas."""
    available = fields.available
    group_by = list(update.group_by or [])
    fields.need("group_by", group_by)
    fields.need("event_time", [update.event_time or ""])
    # a derive column sqlglot could not type (is_unknown) is checked by Spark when the job starts
    if update.event_time in available and not (
        is_timestamp(available[update.event_time]["type"]) or is_date(available[update.event_time]["type"])
        or is_unknown(available[update.event_time]["type"])
    ):
        fields.fail("event_time", f"field {update.event_time!r} is not an Avro timestamp-millis/micros or date")
    aggregations: list[Aggregate] = []
    extra: list[dict[str, Any]] = []
    for out, spec in (update.aggregations or {}).items():
        fn, source, p = parse_aggregation(spec)  # the config model accepted it: it parses
        if out in group_by or out in ("window_start", "window_end"):
            fields.fail(f"aggregations.{out}", "an output field may not repeat a group_by field or window_start/_end")
        if source is not None:
            fields.need(f"aggregations.{out}", [source])
        aggregations.append(Aggregate(out, fn, source, p))
        output = _aggregate_output(out, fn, source, fields)
        if output is not None:
            extra.append(output)
    if not fields.ok:
        return None
    window = [
        {"name": "window_start", "type": TIMESTAMP_MICROS},
        {"name": "window_end", "type": TIMESTAMP_MICROS},
    ]
    key = subset_schema(enriched, group_by, record_name_for(update.topic, "Key"), window[:1])
    value = subset_schema(enriched, group_by, record_name_for(update.topic, "Value"), window + extra)
    date = update.event_time in available and is_date(available[update.event_time or ""]["type"])
    return UpdatePlan(update, schema_of(key), schema_of(value), aggregations, date)


def _aggregate_output(out: str, fn: str, source: str | None, fields: _Fields) -> dict[str, Any] | None:
    """The value field of aggregate ``out`` = ``fn(source)``; ``None`` when its source has problems or is unknown."""
    if fn == "count":
        return {"name": out, "type": "long"}
    if source not in fields.available:
        return None  # reported by need(), or a field of a lookup not joined (validate without a connection)
    source_type = fields.available[source]["type"]
    if is_unknown(source_type):  # typed by Spark when the job starts; here the loosest output type
        return nullable({"name": out, "type": "long" if fn.endswith("count_distinct") else "string"})
    if fn in _NUMERIC_ONLY and not (is_numeric(source_type) or decimal_of(source_type)):
        fields.fail(f"aggregations.{out}", f"field {source!r} is not numeric (int, long, float, double, decimal): "
                                           f"{fn} needs numbers")
        return None
    if fn not in _NUMERIC_ONLY and not is_scalar(source_type):
        fields.fail(f"aggregations.{out}", f"field {source!r} is a record, enum, fixed, array or map: {fn} takes a "
                                           f"field of a primitive or logical type")
        return None
    return _aggregate_field(out, fn, source_type)
