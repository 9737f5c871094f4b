"""Avro schemas as Arrow types: the type mapping of Spark's ``spark-avro`` and Kafka Connect's Parquet format.

A writer schema (as parsed by :func:`fastavro.parse_schema`) maps to one Arrow
type, so every Parquet object written from records of that schema has the same
Parquet schema, whatever its values (type inference types a column that is all
null in one small object as ``null`` there and ``int64`` elsewhere).

=========================================  ===============================================
Avro                                       Arrow
=========================================  ===============================================
``null``                                   ``null``
``boolean`` / ``int`` / ``long``           ``bool`` / ``int32`` / ``int64``
``float`` / ``double``                     ``float32`` / ``float64``
``string`` / ``bytes``                     ``string`` / ``binary``
``fixed`` (size n)                         ``fixed_size_binary(n)``
``enum``                                   ``string`` (its symbol)
``record``                                 ``struct`` (fields in order; not null unless a union with ``null``)
``array`` / ``map``                        ``list`` / ``map<string, ...>``
``["null", T]`` (either order), ``[T]``    ``T``, nullable
``timestamp-millis`` / ``-micros``         ``timestamp(ms / us, tz="UTC")``
``local-timestamp-millis`` / ``-micros``   ``timestamp(ms / us)`` (no time zone)
``date``                                   ``date32``
``time-millis`` / ``time-micros``          ``time32(ms)`` / ``time64(us)``
``decimal(p, s)`` on bytes or fixed        ``decimal128(p, s)``; ``decimal256(p, s)`` when p > 38
``uuid`` on string                         ``string`` (values must be ``str``: :func:`has_uuid`)
=========================================  ===============================================

Logical types fastavro does not decode (``timestamp-nanos``, ``duration``...)
map to their underlying type, as the Avro specification says a reader does
with a logical type it does not know. A union of several non-null types and a
recursive record have no faithful Arrow type: :func:`arrow_type` raises
:class:`UnsupportedAvroType` and the caller falls back to inferring types from
the values.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

_PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


class UnsupportedAvroType(ValueError):
    """An Avro type without a faithful Arrow type (a union of several non-null types, a recursive record)."""


def arrow_type(schema: Any) -> Any:
    """The Arrow type of values of an Avro schema (see the module's table).

    Args:
        schema: a parsed fastavro schema (or a plain Avro schema as JSON-like Python objects).

    Returns:
        A ``pyarrow.DataType``; a nullable union ``["null", T]`` gives ``T``'s type (Arrow
        types carry no nullability: :func:`arrow_field` puts it on the field).

    Raises:
        UnsupportedAvroType: the schema has a type without a faithful mapping.
    """
    return _convert(schema, {}, set())[0]


def arrow_field(name: str, schema: Any) -> Any:
    """A ``pyarrow.Field`` named ``name`` of the Avro schema's type; nullable only for a union with ``null``.

    Raises:
        UnsupportedAvroType: as :func:`arrow_type`.
    """
    import pyarrow as pa

    typ, nullable = _convert(schema, {}, set())
    return pa.field(name, typ, nullable=nullable)


def has_uuid(schema: Any) -> bool:
    """Whether a schema has a ``uuid`` logical type anywhere: fastavro decodes those as ``uuid.UUID``."""
    if isinstance(schema, dict):
        return schema.get("logicalType") == "uuid" or any(has_uuid(v) for v in schema.values())
    if isinstance(schema, list):
        return any(has_uuid(v) for v in schema)
    return False


def _convert(schema: Any, named: dict[str, Any], defining: set[str]) -> tuple[Any, bool]:
    """``(arrow type, nullable)`` of ``schema``; ``named`` holds the named types defined so far."""
    import pyarrow as pa

    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise UnsupportedAvroType(f'union {schema!r}: only ["null", T] unions map to an Arrow type')
        typ, _ = _convert(branches[0], named, defining)
        return typ, len(branches) < len(schema)
    if isinstance(schema, str):
        if schema in _PRIMITIVES:
            return _primitive(schema), schema == "null"
        if schema in defining:
            raise UnsupportedAvroType(f"record {schema!r} is recursive")
        if schema not in named:
            raise UnsupportedAvroType(f"unknown named type {schema!r}")
        return named[schema], False
    if not isinstance(schema, dict):
        raise UnsupportedAvroType(f"not an Avro schema: {schema!r}")
    kind = schema["type"]
    logical = schema.get("logicalType")
    if logical is not None and (typ := _logical(kind, logical, schema)) is not None:
        if kind == "fixed":
            named[_full_name(schema)] = typ
        return typ, False
    if kind == "record" or kind == "error":
        name = _full_name(schema)
        defining.add(name)
        try:
            fields = []
            for f in schema["fields"]:
                ftype, nullable = _convert(f["type"], named, defining)
                fields.append(pa.field(f["name"], ftype, nullable=nullable))
        finally:
            defining.discard(name)
        named[name] = pa.struct(fields)
        return named[name], False
    if kind == "enum":
        named[_full_name(schema)] = pa.string()
        return pa.string(), False
    if kind == "fixed":
        named[_full_name(schema)] = pa.binary(int(schema["size"]))
        return named[_full_name(schema)], False
    if kind == "array":
        item, nullable = _convert(schema["items"], named, defining)
        return pa.list_(pa.field("element", item, nullable=nullable)), False
    if kind == "map":
        value, nullable = _convert(schema["values"], named, defining)
        return pa.map_(pa.string(), pa.field("value", value, nullable=nullable)), False
    return _convert(kind, named, defining)  # {"type": "long"}, {"type": ["null", ...]}, a named reference


def _primitive(name: str) -> Any:
    import pyarrow as pa

    return {
        "null": pa.null(),
        "boolean": pa.bool_(),
        "int": pa.int32(),
        "long": pa.int64(),
        "float": pa.float32(),
        "double": pa.float64(),
        "bytes": pa.binary(),
        "string": pa.string(),
    }[name]


def _logical(kind: str, logical: str, schema: dict[str, Any]) -> Any:
    """The Arrow type of a logical type fastavro decodes, or ``None`` to use the underlying type."""
    import pyarrow as pa

    if logical == "decimal" and kind in ("bytes", "fixed"):
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        return pa.decimal128(precision, scale) if precision <= 38 else pa.decimal256(precision, scale)
    return {
        ("long", "timestamp-millis"): pa.timestamp("ms", tz="UTC"),
        ("long", "timestamp-micros"): pa.timestamp("us", tz="UTC"),
        ("long", "local-timestamp-millis"): pa.timestamp("ms"),
        ("long", "local-timestamp-micros"): pa.timestamp("us"),
        ("int", "date"): pa.date32(),
        ("int", "time-millis"): pa.time32("ms"),
        ("long", "time-micros"): pa.time64("us"),
        ("string", "uuid"): pa.string(),
    }.get((kind, logical))


def _full_name(schema: dict[str, Any]) -> str:
    name = schema["name"]
    namespace = schema.get("namespace")
    return f"{namespace}.{name}" if namespace and "." not in name else name
