"""Debezium and Kafka Connect change topics read as snapshots (latest value per key).

A Debezium connector writes one *change event* per row change, its value an envelope
(Debezium documentation, "PostgreSQL connector", "Data change events")::

    {"before": {...} | null, "after": {...} | null, "source": {...}, "op": "c|u|d|r|t", "ts_ms": ...}

``c`` (create), ``u`` (update) and ``r`` (read, the initial snapshot) carry the row in ``after``;
``d`` (delete) has ``after: null`` and is followed by a Kafka tombstone (``tombstones.on.delete``),
so both mean *delete this key*. ``t`` (truncate) carries no key and is skipped. A snapshot built
with ``envelope: debezium`` reads ``after`` as the value.

**TOASTed columns.** PostgreSQL keeps large values out of line (TOAST). When an UPDATE leaves
such a column unchanged and the table's ``REPLICA IDENTITY`` is not ``FULL``, the logical
decoding message does not contain it, and Debezium writes the placeholder
``__debezium_unavailable_value`` (``unavailable.value.placeholder``) in its place: as text for
string columns, as those UTF-8 bytes for ``bytea``, as a one-element list of it for arrays.
:func:`merge_unavailable` keeps the key's *previous* value of such a column instead of the
placeholder; without a previous value (the key was not seen before) the column is null.

**Kafka Connect JSON.** With ``JsonConverter`` and ``schemas.enable=true`` every key and value
is ``{"schema": {...}, "payload": {...}}``; :func:`connect_json` returns the payload with
Connect's logical types (``Decimal``, ``Date``, ``Time``, ``Timestamp``) turned into Python
values. A struct key (Connect's key for a table's primary key) is a dict of its fields.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

UNAVAILABLE = "__debezium_unavailable_value"
"""Debezium's default ``unavailable.value.placeholder``."""

_UNAVAILABLE_BYTES = UNAVAILABLE.encode()
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)

DELETE = object()
"""What :func:`change_value` returns for a delete (``op: d``, or a tombstone)."""


def change_value(envelope: Mapping[str, Any] | None) -> Any:
    """The value a change event leaves for its key.

    Args:
        envelope: the decoded change event value (``before``/``after``/``op``), or
            ``None`` for a tombstone.

    Returns:
        The ``after`` row (a dict) for ``c``/``u``/``r``; :data:`DELETE` for ``d`` and
        tombstones; ``None`` for an event that changes no key (``t``, truncate).

    Raises:
        ValueError: the value is not a Debezium envelope (no ``op``), naming what it has.
    """
    if envelope is None:
        return DELETE
    op = envelope.get("op")
    if op in ("c", "u", "r"):
        return envelope["after"]
    if op == "d":
        return DELETE
    if op == "t" or op == "m":  # truncate, logical decoding message: no row of this key changed
        return None
    raise ValueError(f"not a Debezium change event (op={op!r}, fields {sorted(envelope)[:6]})")


def _unavailable(value: Any) -> bool:
    if isinstance(value, str):
        return value == UNAVAILABLE
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value) == _UNAVAILABLE_BYTES
    if isinstance(value, list):
        return len(value) == 1 and _unavailable(value[0])
    return False


def merge_unavailable(row: Mapping[str, Any], previous: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """Replace Debezium's unavailable-value placeholders by the key's previous values.

    Args:
        row: the ``after`` row of an update.
        previous: the key's row before this event (``None``: not seen, or deleted).

    Returns:
        ``(row, columns)``: the row with every placeholder replaced (by the previous
        value, else ``None``), and the names of the columns that held one.
    """
    out = dict(row)
    kept = [name for name, value in row.items() if _unavailable(value)]
    for name in kept:
        out[name] = previous.get(name) if previous is not None else None
    return out, kept


def latest_values(
    changes: Iterable[tuple[Any, Mapping[str, Any] | None]], state: dict[Any, dict[str, Any]] | None = None
) -> dict[Any, dict[str, Any]]:
    """Apply change events in offset order to a snapshot: latest ``after`` per key, deletes removed.

    Args:
        changes: ``(key, envelope or None)`` in offset order; ``key`` hashable (a tuple of a
            struct key's fields, see :func:`key_of`).
        state: the snapshot to update in place (the previous values of TOASTed columns);
            a new one when ``None``.

    Returns:
        ``state``: key -> row.
    """
    state = {} if state is None else state
    for key, envelope in changes:
        value = change_value(envelope)
        if value is None:
            continue
        if value is DELETE:
            state.pop(key, None)
            continue
        state[key], _kept = merge_unavailable(value, state.get(key))
    return state


def key_of(key: Any) -> Any:
    """A hashable key from a decoded Kafka key: a struct key (dict) becomes the tuple of its values."""
    if isinstance(key, Mapping):
        return tuple(key_of(v) for v in key.values())
    if isinstance(key, list):
        return tuple(key_of(v) for v in key)
    return key


def _connect_value(schema: Mapping[str, Any] | None, value: Any) -> Any:
    if value is None or schema is None:
        return value
    name = schema.get("name")
    kind = schema.get("type")
    if name == "org.apache.kafka.connect.data.Decimal":
        scale = int(schema.get("parameters", {}).get("scale", 0))
        unscaled = int.from_bytes(base64.b64decode(value), "big", signed=True)
        return decimal.Decimal(unscaled).scaleb(-scale)
    if name == "org.apache.kafka.connect.data.Timestamp":
        return _EPOCH + dt.timedelta(milliseconds=int(value))
    if name == "org.apache.kafka.connect.data.Date":
        return dt.date(1970, 1, 1) + dt.timedelta(days=int(value))
    if name == "org.apache.kafka.connect.data.Time":
        return (dt.datetime.min + dt.timedelta(milliseconds=int(value))).time()
    if kind == "struct":
        fields = {f["field"]: f for f in schema.get("fields", [])}
        return {k: _connect_value(fields.get(k), v) for k, v in value.items()}
    if kind == "array":
        return [_connect_value(schema.get("items"), v) for v in value]
    if kind == "map":
        return {k: _connect_value(schema.get("values"), v) for k, v in value.items()}
    if kind == "bytes" and isinstance(value, str):
        return base64.b64decode(value)
    return value


def connect_json(data: bytes | str | None) -> Any:
    """Decode a Kafka Connect ``JsonConverter`` message (``schemas.enable=true``).

    Args:
        data: the key or value bytes; ``None`` (a tombstone) stays ``None``.

    Returns:
        The payload, Connect's logical types as Python values (``Decimal``, ``date``,
        ``time``, UTC ``datetime``), ``bytes`` fields decoded from base64. A message
        without the ``schema``/``payload`` wrapper (``schemas.enable=false``) is returned
        as parsed.

    Raises:
        ValueError: the bytes are not JSON.
    """
    if data is None:
        return None
    doc = json.loads(data)
    if isinstance(doc, dict) and set(doc) == {"schema", "payload"}:
        return _connect_value(doc["schema"], doc["payload"])
    return doc


def after_schema(envelope: Mapping[str, Any]) -> dict[str, Any]:
    """The row record of a Debezium envelope's Avro schema: the non-null branch of its ``after`` field.

    Args:
        envelope: the writer schema of a change event value (a record with ``after``).

    Returns:
        The row record schema, its namespace made explicit (it inherits the envelope's).

    Raises:
        ValueError: the schema is not a Debezium envelope (no ``after`` record field), naming its fields.
    """
    fields = {f["name"]: f for f in envelope.get("fields", [])} if isinstance(envelope, Mapping) else {}
    kind = fields.get("after", {}).get("type")
    branches = kind if isinstance(kind, list) else [kind]
    # Debezium defines the row record in ``before`` and names it in ``after``: resolve the reference
    named = _records(envelope, str(envelope.get("namespace", "")) if isinstance(envelope, Mapping) else "")
    namespace = envelope.get("namespace", "") if isinstance(envelope, Mapping) else ""
    branches = [named.get(b) or named.get(f"{namespace}.{b}") if isinstance(b, str) else b for b in branches]
    rows = [b for b in branches if isinstance(b, Mapping) and b.get("type") == "record"]
    if "op" not in fields or len(rows) != 1:
        raise ValueError(f"not a Debezium envelope schema (fields {sorted(fields)[:8]}): it needs op and a "
                         "nullable record after")
    row = dict(rows[0])
    if "namespace" not in row and "." not in row["name"] and envelope.get("namespace"):
        row["namespace"] = envelope["namespace"]
    return row


def _records(schema: Any, namespace: str) -> dict[str, Mapping[str, Any]]:
    """Every record defined in ``schema``, by full name (its namespace inherited as Avro does)."""
    found: dict[str, Mapping[str, Any]] = {}
    if isinstance(schema, list):
        for branch in schema:
            found.update(_records(branch, namespace))
    elif isinstance(schema, Mapping):
        kind = schema.get("type")
        if kind == "record":
            name = str(schema["name"])
            namespace = str(schema.get("namespace", namespace)) if "." not in name else name.rsplit(".", 1)[0]
            full = name if "." in name or not namespace else f"{namespace}.{name}"
            found[full] = {**schema, "namespace": namespace} if "." not in name and namespace else schema
            for fld in schema.get("fields", []):
                found.update(_records(fld.get("type"), namespace))
        elif kind in ("array", "map"):
            found.update(_records(schema.get("items", schema.get("values")), namespace))
        elif isinstance(kind, (list, Mapping)):
            found.update(_records(kind, namespace))
    return found


def _full_name(schema: Mapping[str, Any]) -> str:
    name = str(schema["name"])
    return name if "." in name or not schema.get("namespace") else f"{schema['namespace']}.{name}"


def envelope_reader(row: Mapping[str, Any], envelopes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The reader schema of Debezium change events whose ``after`` is read as ``row``.

    Only ``after`` and ``op`` are read (Avro schema resolution skips ``before``, ``source``,
    ``ts_ms``...). The reader takes the writers' envelope and row names (the row's as aliases),
    which Avro resolution matches by name.

    Args:
        row: the reader schema of the rows (a record).
        envelopes: the writer schemas of the change events (at least one).

    Returns:
        The envelope reader schema.
    """
    names = list(dict.fromkeys(_full_name(e) for e in envelopes))
    rows = {_full_name(after_schema(e)) for e in envelopes} - {_full_name(row)}
    reader_row = {**row, "aliases": sorted({*row.get("aliases", []), *rows})}
    return {
        "type": "record",
        "name": names[0],
        **({"aliases": names[1:]} if names[1:] else {}),
        "fields": [
            {"name": "after", "type": ["null", reader_row], "default": None},
            {"name": "op", "type": "string"},
        ],
    }
