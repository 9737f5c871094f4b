"""Schema evolution rules: is a new version of a subject compatible with the previous ones?

A *subject* is what a schema registry calls the schemas of one topic's keys or
values (``<topic>-key``, ``<topic>-value``, Confluent's ``TopicNameStrategy``).
The levels are a schema registry's:

====================  ============================================================
``NONE``              no check
``BACKWARD``          the new schema reads data written with the latest version
``BACKWARD_TRANSITIVE`` ... with every earlier version
``FORWARD``           the latest version reads data written with the new schema
``FORWARD_TRANSITIVE`` every earlier version reads it
``FULL``              both ``BACKWARD`` and ``FORWARD``
``FULL_TRANSITIVE``   both, against every earlier version
====================  ============================================================

The reader/writer decision is the Apache Avro library's own
(``avro.compatibility.ReaderWriterCompatibilityChecker``, the port of Java's
``SchemaCompatibility``): field added without a default, type changes outside
the specification's promotions, enum symbols removed, union branches lost,
names changed.

That checker looks at physical types only, as Java's does; Avro's
specification however says two ``decimal`` schemas match only when their
precision and scale match ("Logical Types"), and a reader that applies its own
logical type to a writer's bytes (Spark's ``from_avro`` with a reader schema)
turns ``decimal(12,2)`` data into ``decimal(12,4)`` values a hundred times too
small, or millisecond timestamps into microsecond ones. So a field whose
logical type, precision or scale differs between the two schemas is refused
too (:func:`logical_type_conflicts`), and so is a ``decimal`` that becomes a
``string`` or back: Avro promotes ``bytes`` to ``string``, which would read a
decimal's two's-complement bytes as text. Those are the only rules added here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from enum import StrEnum
from typing import Any

from schemas.exceptions import IncompatibleSchemaError
from schemas.serde import Schema


class Compatibility(StrEnum):
    """A subject's compatibility level (a schema registry's names)."""

    NONE = "NONE"
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"


def _as_dict(schema: Schema) -> Any:
    if isinstance(schema, str) and schema.lstrip().startswith(("{", "[", '"')):
        return json.loads(schema)
    return schema


def _avro_parse(schema: Any) -> Any:
    import avro.schema  # the Apache Avro library; only schema evolution needs it

    return avro.schema.parse(json.dumps(schema))


def _non_null(schema: Any) -> list[Any]:
    branches = schema if isinstance(schema, list) else [schema]
    return [b for b in branches if b != "null"]


def _physical(schema: Any) -> str:
    if isinstance(schema, dict):
        kind = schema.get("type")
        return kind if isinstance(kind, str) else "?"
    return schema if isinstance(schema, str) else "union"


def _logical(schema: Any) -> tuple[Any, ...] | None:
    if not isinstance(schema, dict) or "logicalType" not in schema:
        return None
    if schema["logicalType"] == "decimal":
        return ("decimal", schema.get("precision"), schema.get("scale", 0))
    return (schema["logicalType"],)


def _describe_logical(sig: tuple[Any, ...] | None, physical: str) -> str:
    if sig is None:
        return f"{physical} (no logical type)"
    if sig[0] == "decimal":
        return f"decimal({sig[1]},{sig[2]})"
    return str(sig[0])


def _walk(reader: Any, writer: Any, path: str) -> Iterator[tuple[str, str]]:
    """Pairs of (field path, problem) where reader and writer give one physical type different logical types."""
    readers = {_physical(b): b for b in _non_null(reader)}
    writers = {_physical(b): b for b in _non_null(writer)}
    if len(readers) == 1 and len(writers) == 1 and not readers.keys() & writers.keys():
        ((r_phys, r_one),), ((w_phys, w_one),) = readers.items(), writers.items()
        kinds = {(_logical(r_one) or ("",))[0], (_logical(w_one) or ("",))[0]}
        if {r_phys, w_phys} == {"bytes", "string"} and "decimal" in kinds:
            # Avro promotes bytes <-> string: a decimal's two's complement bytes would be read as text
            yield path, (
                f"type changes from {_describe_logical(_logical(w_one), w_phys)} to "
                f"{_describe_logical(_logical(r_one), r_phys)}: Avro's bytes/string promotion would read "
                "a decimal's bytes as text (write to a new topic)"
            )
            return
    for physical, r in readers.items():
        w = writers.get(physical)
        if w is None:
            continue  # a different physical type: the Avro checker decides
        r_sig, w_sig = _logical(r), _logical(w)
        if r_sig != w_sig:
            yield path, (
                f"logical type changes from {_describe_logical(w_sig, physical)} "
                f"to {_describe_logical(r_sig, physical)}"
            )
            continue
        if physical == "record" and isinstance(r, dict) and isinstance(w, dict):
            wf = {f["name"]: f for f in w.get("fields", [])}
            for f in r.get("fields", []):
                if f["name"] in wf:
                    yield from _walk(f["type"], wf[f["name"]]["type"], f"{path}.{f['name']}" if path else f["name"])
        elif physical == "array" and isinstance(r, dict) and isinstance(w, dict):
            yield from _walk(r["items"], w["items"], f"{path}[]")
        elif physical == "map" and isinstance(r, dict) and isinstance(w, dict):
            yield from _walk(r["values"], w["values"], f"{path}{{}}")


def logical_type_conflicts(reader: Schema, writer: Schema) -> list[tuple[str, str]]:
    """Fields whose logical type (or decimal precision/scale) differs between two schemas.

    Args:
        reader: the schema reading.
        writer: the schema the data was written with.

    Returns:
        ``(field path, problem)`` pairs, e.g. ``("amount", "logical type changes
        from decimal(12,2) to decimal(12,4)")``; empty when none. Paths use
        ``.`` between nested record fields.
    """
    return list(_walk(_as_dict(reader), _as_dict(writer), ""))


def _field_path(schema: Any, location: str) -> str | None:
    """Turn a checker location (``/fields/3/type``) into a field path (``amount``), or ``None`` at the root."""
    names: list[str] = []
    node = schema
    parts = [p for p in location.split("/") if p]
    i = 0
    while i < len(parts):
        if parts[i] == "fields" and i + 1 < len(parts) and isinstance(node, dict):
            try:
                field = node["fields"][int(parts[i + 1])]
            except (KeyError, IndexError, ValueError):
                break
            names.append(field["name"])
            node = field["type"]
            branches = _non_null(node)
            if len(branches) == 1 and isinstance(branches[0], dict):
                node = branches[0]
            i += 2
        else:
            i += 1
    return ".".join(names) or None


def _type_name(schema: Any) -> str:
    """An Avro type as a user writes it: ``double``, ``decimal(10,2)``, ``["null", "long"]``."""
    if getattr(schema, "type", None) == "union":
        return "[" + ", ".join(_type_name(s) for s in schema.schemas) + "]"
    logical = getattr(schema, "logical_type", None) or (schema.get_prop("logicalType") if hasattr(schema, "get_prop")
                                                        else None)
    if logical == "decimal":
        return f"decimal({schema.get_prop('precision')},{schema.get_prop('scale') or 0})"
    if logical:
        return str(logical)
    return str(getattr(schema, "fullname", None) or getattr(schema, "type", schema))


def _field_problem(reader: Any, writer: Any, messages: Any) -> str:
    """Why a field's reader type cannot read its writer type, in the field's own terms."""
    r, w = _type_name(reader), _type_name(writer)
    if r != w and getattr(reader, "type", None) != "record" and getattr(writer, "type", None) != "record":
        # avro's "reader type: float not compatible with writer type: double" reads as if the field were float
        return f"values written as {w} cannot be read as {r} (a narrowing or incompatible type change)"
    return "; ".join(sorted(messages)) or "incompatible type"


def reader_writer_problems(reader: Schema, writer: Schema) -> list[tuple[str, str]]:
    """Why ``reader`` cannot read data written with ``writer``, field by field.

    Args:
        reader: the reading schema (dict or JSON text).
        writer: the writer schema.

    Returns:
        ``(field path, problem)`` pairs; empty when compatible. A problem of the
        whole schema (its name changed) has the path ``"<root>"``.
    """
    from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType

    r, w = _as_dict(reader), _as_dict(writer)
    r_avro, w_avro = _avro_parse(r), _avro_parse(w)
    result = ReaderWriterCompatibilityChecker().get_compatibility(r_avro, w_avro)
    problems: list[tuple[str, str]] = []
    if result.compatibility is SchemaCompatibilityType.incompatible:
        # name the fields: the checker's locations lose the path inside unions, so ask it field by field
        if isinstance(r, dict) and r.get("type") == "record" and isinstance(w, dict) and w.get("type") == "record":
            written = {f.name: f for f in w_avro.fields}
            for field in r_avro.fields:
                wf = written.get(field.name)
                if wf is None:
                    if not field.has_default:
                        problems.append((field.name, "added without a default (old records have no value for it)"))
                    continue
                sub = ReaderWriterCompatibilityChecker().get_compatibility(field.type, wf.type)
                if sub.compatibility is SchemaCompatibilityType.incompatible:
                    problems.append((field.name, _field_problem(field.type, wf.type, sub.messages)))
        if not problems:
            for location in sorted(result.locations):
                path = _field_path(r, location) or "<root>"
                problems.append((path, "; ".join(sorted(result.messages)) or "incompatible"))
    problems.extend(logical_type_conflicts(r, w))
    return problems


def check_compatibility(
    new: Schema,
    previous: Sequence[Schema],
    level: Compatibility | str,
    *,
    topic: str,
    subject: str,
) -> None:
    """Refuse ``new`` as the next version of ``subject`` when ``level`` forbids it.

    Args:
        new: the schema about to be registered.
        previous: the subject's versions, oldest first (may be empty: nothing to check).
        level: a :class:`Compatibility` level.
        topic: the topic, named in the error.
        subject: the subject (``<topic>-key`` / ``<topic>-value``), named in the error.

    Raises:
        IncompatibleSchemaError: naming the topic, subject, every field at fault
            and the version it conflicts with.
    """
    level = Compatibility(level)
    if level is Compatibility.NONE or not previous:
        return
    transitive = level.value.endswith("_TRANSITIVE")
    against = list(enumerate(previous, start=1))
    if not transitive:
        against = against[-1:]
    problems: list[tuple[str, str]] = []
    for version, old in reversed(against):
        if level.value.startswith(("BACKWARD", "FULL")):
            problems += [(f, f"{why} (new schema reading version {version})")
                         for f, why in reader_writer_problems(new, old)]
        if level.value.startswith(("FORWARD", "FULL")):
            problems += [(f, f"{why} (version {version} reading the new schema)")
                         for f, why in reader_writer_problems(old, new)]
    if problems:
        raise IncompatibleSchemaError(topic, subject, level.value, problems)
