"""What a field's Avro type is, as the plan's checks ask it: numeric, a timestamp, a date, a decimal, a scalar.

Each predicate takes a field type optional or not (``["null", t]``) and looks at its non-null branch.
"""

from __future__ import annotations

from typing import Any

_NUMERIC = {"int", "long", "float", "double"}


_TIMESTAMPS = {"timestamp-millis", "timestamp-micros"}


def base_type(avro_type: Any) -> Any:
    """The non-null branch of an optional type."""
    if isinstance(avro_type, list):
        rest = [b for b in avro_type if b != "null"]
        return rest[0] if len(rest) == 1 else avro_type
    return avro_type


def is_numeric(avro_type: Any) -> bool:
    """Whether a field type is ``int``, ``long``, ``float`` or ``double`` (no logical type)."""
    t = base_type(avro_type)
    if isinstance(t, dict):
        return t.get("type") in _NUMERIC and "logicalType" not in t
    return isinstance(t, str) and t in _NUMERIC


def is_timestamp(avro_type: Any) -> bool:
    """Whether a field type is an Avro ``timestamp-millis`` or ``timestamp-micros``."""
    t = base_type(avro_type)
    return isinstance(t, dict) and t.get("logicalType") in _TIMESTAMPS


def is_date(avro_type: Any) -> bool:
    """Whether a field type is an Avro ``date`` (days since the epoch)."""
    t = base_type(avro_type)
    return isinstance(t, dict) and t.get("logicalType") == "date"


def decimal_of(avro_type: Any) -> tuple[int, int] | None:
    """``(precision, scale)`` of an Avro ``decimal`` field type, else ``None``."""
    t = base_type(avro_type)
    if isinstance(t, dict) and t.get("logicalType") == "decimal":
        return int(t["precision"]), int(t.get("scale", 0))
    return None


def decimal_type(precision: int, scale: int) -> dict[str, Any]:
    """The Avro ``decimal(precision, scale)`` type, as ``bytes``."""
    return {"type": "bytes", "logicalType": "decimal", "precision": precision, "scale": scale}


def is_scalar(avro_type: Any) -> bool:
    """Whether a field type is a primitive or a logical type (optional or not): no named or container type."""
    t = base_type(avro_type)
    if isinstance(t, dict):
        t = t.get("type")
    return isinstance(t, str) and t not in ("null", "record", "enum", "fixed", "array", "map")
