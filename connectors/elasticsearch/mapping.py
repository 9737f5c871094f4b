"""Index mappings from Avro schemas, for the indices the Elasticsearch sink creates.

Dynamic mapping guesses from the first document: every JSON number with a
fraction becomes ``float`` (32 bits), so an Avro ``double`` loses precision in
range queries and aggregations. The sink maps the update topic's value schema
explicitly instead:

=============================================  =================================================
Avro                                           Elasticsearch
=============================================  =================================================
``boolean``                                    ``boolean``
``int`` / ``long``                             ``integer`` / ``long``
``float`` / ``double``                         ``float`` / ``double``
``decimal`` (bytes or fixed)                   ``scaled_float`` (``scaling_factor`` 10^scale),
                                               ``double`` or ``keyword`` (``decimal_mapping``)
``string``, ``enum``, ``uuid``                 ``keyword``, ``text``, or ``text`` with a
                                               ``keyword`` sub-field (``string_mapping``)
``timestamp-*`` / ``local-timestamp-*``        ``date`` (``strict_date_optional_time||epoch_millis``:
                                               the ISO-8601 text the sink writes; millisecond precision)
``date``                                       ``date`` (``strict_date||epoch_millis``)
``time-millis`` / ``time-micros``              ``keyword`` (Elasticsearch has no time of day type)
record                                         ``object`` with its fields' properties
array                                          its items' mapping (every field may hold an array)
map, bytes, fixed                              not mapped (dynamic mapping decides)
=============================================  =================================================

Optional fields (``["null", T]``) map as ``T``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kernel.exceptions import ConfigError, ConfigProblem
from schemas.serde import non_null_type

_PRIMITIVE = {"boolean": "boolean", "int": "integer", "long": "long", "float": "float", "double": "double"}
DATE_TIME_FORMAT = "strict_date_optional_time||epoch_millis"
DATE_FORMAT = "strict_date||epoch_millis"


def _string(string_mapping: str) -> dict[str, Any]:
    if string_mapping == "text":
        return {"type": "text"}
    if string_mapping == "text_and_keyword":
        return {"type": "text", "fields": {"keyword": {"type": "keyword", "ignore_above": 256}}}
    return {"type": "keyword"}


def field_mapping(
    avro_type: Any, names: dict[str, Any], *, string_mapping: str = "keyword", decimal_mapping: str = "scaled_float"
) -> dict[str, Any] | None:
    """The mapping of one Avro type; ``None`` when dynamic mapping should decide.

    Args:
        avro_type: the field's type (optional types allowed).
        names: named types seen so far (full name -> definition), extended here.
        string_mapping: ``keyword``, ``text`` or ``text_and_keyword``.
        decimal_mapping: ``scaled_float``, ``double`` or ``keyword``.
    """
    t, _nullable = non_null_type(avro_type)  # None for a real union: left to dynamic mapping
    if t is None:
        return None
    if isinstance(t, str):
        if t in _PRIMITIVE:
            return {"type": _PRIMITIVE[t]}
        if t == "string":
            return _string(string_mapping)
        if t in names:
            return field_mapping(names[t], names, string_mapping=string_mapping, decimal_mapping=decimal_mapping)
        return None
    kind, logical = t.get("type"), t.get("logicalType")
    if isinstance(kind, str) and kind in ("record", "enum", "fixed") and "name" in t:
        name = t["name"] if "." in t["name"] or not t.get("namespace") else f"{t['namespace']}.{t['name']}"
        names[name] = t
    if logical == "decimal":
        if decimal_mapping == "keyword":
            return {"type": "keyword"}
        if decimal_mapping == "double":
            return {"type": "double"}
        return {"type": "scaled_float", "scaling_factor": 10 ** int(t.get("scale", 0))}
    if logical in ("timestamp-millis", "timestamp-micros", "timestamp-nanos", "local-timestamp-millis",
                   "local-timestamp-micros", "local-timestamp-nanos"):
        return {"type": "date", "format": DATE_TIME_FORMAT}
    if logical == "date":
        return {"type": "date", "format": DATE_FORMAT}
    if logical in ("time-millis", "time-micros", "uuid"):
        return {"type": "keyword"}
    if kind == "record":
        return {"type": "object", "properties": properties(t, names, string_mapping, decimal_mapping)}
    if kind == "enum":
        return {"type": "keyword"}
    if kind == "array":
        return field_mapping(t["items"], names, string_mapping=string_mapping, decimal_mapping=decimal_mapping)
    if kind in ("map", "fixed", "bytes"):
        return None
    return field_mapping(kind, names, string_mapping=string_mapping, decimal_mapping=decimal_mapping)


def properties(
    record: dict[str, Any], names: dict[str, Any] | None = None, string_mapping: str = "keyword",
    decimal_mapping: str = "scaled_float",
) -> dict[str, Any]:
    """The ``properties`` of an Avro record's fields (fields without an explicit mapping left out)."""
    names = {} if names is None else names
    out = {}
    for f in record.get("fields", []):
        m = field_mapping(f["type"], names, string_mapping=string_mapping, decimal_mapping=decimal_mapping)
        if m is not None:
            out[f["name"]] = m
    return out


def index_mappings(value_schema: dict[str, Any], config: Any) -> dict[str, Any]:
    """The ``mappings`` of a new index: derived from ``value_schema``, the user's mapping file over them.

    Args:
        value_schema: the update topic's value schema (a record).
        config: the sink's config (``string_mapping``, ``decimal_mapping``, ``mapping_file``).

    Returns:
        The ``mappings`` body; the mapping file's ``properties`` replace the derived
        ones field by field, its other keys (``dynamic``, ``_source``...) are added.

    Raises:
        ConfigError: the mapping file cannot be read or is not a JSON object.
    """
    mappings: dict[str, Any] = {
        "properties": properties(value_schema, {}, config.string_mapping, config.decimal_mapping)
    }
    if config.mapping_file:
        user = load_mapping_file(config.mapping_file)
        user = user.get("mappings", user)
        mappings["properties"].update(user.get("properties", {}))
        mappings.update({k: v for k, v in user.items() if k != "properties"})
    return mappings


def load_mapping_file(path: str) -> dict[str, Any]:
    """Read a JSON mapping file.

    Raises:
        ConfigError: unreadable, not JSON, or not an object.
    """
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError([ConfigProblem("mapping_file", f"cannot read {path}: {exc}")]) from exc
    if not isinstance(data, dict):
        raise ConfigError([ConfigProblem("mapping_file", f"{path}: a JSON object (an index's mappings) is expected")])
    return data
