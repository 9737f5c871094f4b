"""The terms of an interactive query: its key and time given as text, its answer's values as JSON.

A key given per key field (a URL's path segment, query parameters, ``threes
query`` arguments) becomes the snapshot's lookup key (``__lk``) the way
:func:`~stream_app.snapshot.data.lookup_key` renders it; a time is epoch
milliseconds or ISO-8601; an Arrow row's values become JSON (decimals as
strings, timestamps ISO-8601 UTC, bytes base64). A query the client got wrong
raises :class:`QueryError`, an HTTP 4xx.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import re
from collections.abc import Mapping
from typing import Any


class QueryError(Exception):
    """A query the client got wrong (HTTP 4xx): an unknown snapshot, a malformed key or time.

    Attributes:
        status: the HTTP status (400 malformed, 404 unknown snapshot or absent key).
    """

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


_INTEGRAL = ("IntegerType", "LongType", "ShortType", "ByteType")


_KEY_FIELDS: dict[int, tuple[Any, list[tuple[str, str, Any]]]] = {}


def key_fields(key_type: Any) -> list[tuple[str, str, Any]]:
    """``(name, type class name, type)`` of each field of a key's ``StructType``, read once per type object."""
    held = _KEY_FIELDS.get(id(key_type))
    if held is None or held[0] is not key_type:
        held = (key_type, [(fld.name, type(fld.dataType).__name__, fld.dataType) for fld in key_type.fields])
        _KEY_FIELDS[id(key_type)] = held
    return held[1]


def key_of(key_type: Any, parts: Mapping[str, str]) -> str:
    """The lookup key (``__lk``) of a key given as text, per key field, as :func:`~stream_app.snapshot.data.lookup_key`.

    Args:
        key_type: the snapshot key's Spark ``StructType``.
        parts: key field -> its text (the URL's path segment for a one-field key, else query parameters).

    Raises:
        QueryError: a key field is missing, unknown, or not of its type; or a composite key has a field
            type this reader does not render (only string, integral and boolean fields).
    """
    fields = key_fields(key_type)
    names = [name for name, _kind, _type in fields]
    if len(fields) == 1 and fields[0][1] == "StringType" and names[0] in parts and len(parts) == 1:
        return parts[names[0]]  # the common case, without the checks below
    unknown = sorted(set(parts) - set(names))
    missing = [n for n in names if n not in parts]
    if unknown or missing:
        raise QueryError(400, f"the key has fields {names}; missing {missing}, unknown {unknown}")
    values: dict[str, Any] = {}
    for name, kind, data_type in fields:
        text = parts[name]
        if kind in _INTEGRAL:
            try:
                values[name] = int(text)
            except ValueError:
                raise QueryError(400, f"key field {name!r} is an integer, got {text!r}") from None
        elif kind == "StringType":
            values[name] = text
        elif kind == "BooleanType" and len(names) > 1 and text in ("true", "false"):
            values[name] = text == "true"
        else:
            raise QueryError(400, f"key field {name!r} of type {data_type.simpleString()} cannot be queried")
    if len(names) == 1:
        return str(values[names[0]])
    # Spark's to_json of the key struct: fields in key order, no spaces, non-ASCII unescaped
    return json.dumps(values, separators=(",", ":"), ensure_ascii=False)


def parse_time_ms(text: str) -> int:
    """A time given as epoch milliseconds or ISO-8601 (no zone: UTC), in epoch ms.

    Raises:
        QueryError: neither.
    """
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise QueryError(400, f"as_of {text!r} is neither epoch milliseconds nor ISO-8601") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def jsonable(value: Any) -> Any:
    """A value of an Arrow row as JSON: decimals as strings, timestamps ISO-8601 UTC, bytes base64."""
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        when = value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
        return when.isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if all(isinstance(p, tuple) and len(p) == 2 for p in value):  # an Arrow map: [(key, value)]
            return {str(k): jsonable(v) for k, v in value}
        return [jsonable(v) for v in value]
    return value
