"""Avro helpers for sources whose rows are loosely typed (CSV, JSON Lines, Elasticsearch documents).

* :func:`avro_name` - any column/field name as a valid Avro name.
* :func:`infer_record_schema` - an all-nullable record schema from sample values (what a
  source uses when the config gives no ``value_schema``; it logs the result).
* :func:`record_coercer` - turns a raw row (strings from CSV, JSON values) into the
  dict the schema takes: ``"42"`` to ``42`` for a ``long`` field, ISO text to
  ``datetime`` for ``timestamp-micros``, dicts/lists to JSON text for ``string``.

Field names are kept in the schema with the original column name in the
``"source.field"`` property when they had to be changed.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_AVRO_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Coercer = Callable[[Any], Any]


class CoercionError(ValueError):
    """A raw value does not fit its field's Avro type; ``field`` names the field."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"field {field!r}: {message}")


def avro_name(name: str) -> str:
    """Turn any identifier into a valid Avro name (Avro specification, "Names").

    Returns:
        ``name`` when valid; else invalid characters replaced by ``_`` and a
        leading ``_`` when it starts with a digit.
    """
    if _AVRO_NAME.match(name):
        return name
    out = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return out if out and not out[0].isdigit() else f"_{out}"


def _type_of_value(value: Any) -> Any:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, decimal.Decimal):
        return "string"
    if isinstance(value, dt.datetime):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if isinstance(value, dt.date):
        return {"type": "int", "logicalType": "date"}
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    return "string"  # str, and dicts/lists as JSON text


def infer_record_schema(
    name: str, samples: Sequence[Mapping[str, Any]], *, namespace: str, doc: str | None = None
) -> dict[str, Any]:
    """An Avro record schema from sample rows: every field nullable, the first non-null value decides its type.

    Args:
        name: the record name (made valid).
        samples: rows (field -> value), in order; fields appear in first-seen order.
        namespace: the record's namespace.
        doc: the record's ``doc``.

    Returns:
        The schema; a field only ever null in the samples is a nullable ``string``.
    """
    order: list[str] = []
    types: dict[str, Any] = {}
    for row in samples:
        for field, value in row.items():
            if field not in types:
                order.append(field)
                types[field] = None
            if types[field] is None and value is not None:
                types[field] = _type_of_value(value)
    fields = []
    used: set[str] = set()
    for field in order:
        fname = avro_name(field)
        while fname in used:
            fname += "_"
        used.add(fname)
        f: dict[str, Any] = {"name": fname, "type": ["null", types[field] or "string"], "default": None}
        if fname != field:
            f["source.field"] = field
        fields.append(f)
    schema: dict[str, Any] = {"type": "record", "name": avro_name(name), "namespace": namespace, "fields": fields}
    if doc:
        schema["doc"] = doc
    return schema


def source_field(field: Mapping[str, Any]) -> str:
    """The raw row's name of a schema field (``source.field``, else the field name)."""
    return str(field.get("source.field", field["name"]))


def _parse_datetime(v: str) -> dt.datetime:
    out = dt.datetime.fromisoformat(v.replace("Z", "+00:00") if v.endswith("Z") else v)
    return out if out.tzinfo is not None else out.replace(tzinfo=dt.UTC)


def _coercer_for(avro_type: Any) -> Coercer | None:
    """A function fixing one raw value for a (non-null) Avro type, or ``None`` to pass it as is."""
    logical = avro_type.get("logicalType") if isinstance(avro_type, dict) else None
    prim = avro_type.get("type") if isinstance(avro_type, dict) else avro_type
    if logical == "decimal":
        return lambda v: v if isinstance(v, decimal.Decimal) else decimal.Decimal(str(v))
    if logical in ("timestamp-micros", "timestamp-millis"):
        return lambda v: v if isinstance(v, dt.datetime) else (
            _parse_datetime(v) if isinstance(v, str) else dt.datetime.fromtimestamp(v / 1000, dt.UTC))
    if logical in ("local-timestamp-micros", "local-timestamp-millis"):
        return lambda v: v if isinstance(v, dt.datetime) else dt.datetime.fromisoformat(v)
    if logical == "date":
        return lambda v: v if isinstance(v, dt.date) else dt.date.fromisoformat(v[:10])
    if prim in ("int", "long"):
        return lambda v: v if isinstance(v, int) and not isinstance(v, bool) else int(v)
    if prim in ("float", "double"):
        return lambda v: v if isinstance(v, float) else float(v)
    if prim == "boolean":
        return lambda v: v if isinstance(v, bool) else str(v).strip().lower() in ("true", "t", "1", "yes", "y")
    if prim == "string":
        return lambda v: v if isinstance(v, str) else (
            json.dumps(v, separators=(",", ":"), ensure_ascii=False, default=str)
            if isinstance(v, (dict, list)) else str(v))
    if prim == "bytes":
        return lambda v: v if isinstance(v, bytes) else (bytes(v) if isinstance(v, bytearray) else str(v).encode())
    return None


def record_coercer(
    schema: Mapping[str, Any], *, empty_is_null: bool = False
) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """A function from a raw row to the Avro record dict of ``schema``.

    Args:
        schema: an Avro record schema (fields may carry ``source.field``).
        empty_is_null: treat ``""`` as null for nullable non-string fields (CSV has no null).

    Returns:
        ``row -> dict``; it raises :class:`CoercionError` naming the field when a value
        does not convert, or when a non-nullable field is missing.
    """
    plan: list[tuple[str, str, bool, bool, Coercer | None]] = []
    for f in schema.get("fields", []):
        types = f["type"] if isinstance(f["type"], list) else [f["type"]]
        nullable = "null" in types
        non_null = [t for t in types if t != "null"]
        target = non_null[0] if len(non_null) == 1 else None
        is_string = target == "string"
        plan.append((f["name"], source_field(f), nullable, is_string, _coercer_for(target) if target else None))

    def coerce(row: Mapping[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, src, nullable, is_string, fn in plan:
            v = row.get(src)
            if v is None or (empty_is_null and v == "" and nullable and not is_string):
                if not nullable:
                    raise CoercionError(name, "missing, and the field is not nullable")
                out[name] = None
                continue
            if fn is not None:
                try:
                    v = fn(v)
                except (ValueError, TypeError, ArithmeticError) as exc:
                    raise CoercionError(name, f"{type(v).__name__} value does not convert: {exc}") from exc
            out[name] = v
        return out

    return coerce


def key_schema_from(value_schema: Mapping[str, Any], key_fields: Sequence[str], name: str) -> dict[str, Any]:
    """The key record schema: the named fields of the value schema, not nullable.

    Raises:
        KeyError: a key field is not a field of the value schema (by name or ``source.field``).
    """
    by_name = {f["name"]: f for f in value_schema.get("fields", [])}
    by_source = {source_field(f): f for f in value_schema.get("fields", [])}
    fields = []
    for k in key_fields:
        f = by_name.get(k) or by_source.get(k)
        if f is None:
            raise KeyError(k)
        types = f["type"] if isinstance(f["type"], list) else [f["type"]]
        non_null = [t for t in types if t != "null"]
        fields.append({"name": f["name"], "type": non_null[0] if len(non_null) == 1 else non_null})
    return {"type": "record", "name": f"{avro_name(name)}_key", "namespace": value_schema.get("namespace", "threes"),
            "fields": fields}
