"""Writer schemas matched to a reader schema: which writers Avro resolution maps to it, by name or alias.

The schema topic holds every producer's writer schemas; a reader decodes only the writers whose
record name (or one of its aliases) is its own (:func:`writers_for`). A snapshot read with the
writer schemas its topics carry gets the other writer names as aliases, when it can read them
(:func:`match_writers`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

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
