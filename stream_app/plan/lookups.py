"""Lookups checked against their snapshots' schemas: the columns each adds, and ``as_of`` columns.

A lookup whose snapshot's schemas are unknown here (validate without a connection) adds the
columns its ``fields`` list names, of a type only the topics know: a chained ``on``, an update's
``where`` or ``group_by`` naming another column under its prefix can never exist and is reported.
Without ``fields``, or with problems, it leaves its prefix open: the later checks accept a field
under it unchecked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from stream_app.avro_schemas import JoinedFields, fields_of, nullable
from stream_app.config import StreamJobConfig
from stream_app.expressions import UNKNOWN_MARK
from stream_app.plan.avro_types import is_date, is_timestamp

UNKNOWN_TYPE: dict[str, Any] = {"type": "string", UNKNOWN_MARK: "unknown"}
"""A lookup column's type when only its snapshot's topics know it (``threes validate``)."""


def plan_lookups(
    config: StreamJobConfig,
    event: dict[str, Any] | None,
    snaps: dict[str, tuple[dict[str, Any], dict[str, Any]]],
    problem: Callable[[str, str], None],
) -> tuple[list[JoinedFields], dict[int, dict[str, Any] | None], list[str]]:
    """Check each lookup against its snapshot's key and value schemas.

    Returns:
        What each joinable lookup adds (for the enriched schema), the columns each lookup adds by index
        (``None`` when its snapshot's schemas are unknown here or it has problems), and the prefixes
        of those lookups, whose columns the later checks accept unchecked.
    """
    joins: list[JoinedFields] = []
    joined: dict[int, dict[str, Any] | None] = {}  # per lookup, the columns it adds (None: schemas unknown here)
    open_prefixes: list[str] = []  # lookups not joined (unknown snapshot or problems): their fields go unchecked
    for i, lookup in enumerate(config.lookups):
        if lookup.snapshot not in snaps and event is not None and lookup.fields:
            # its columns are known by name (fields), their types only by the topics (threes check)
            value = {"type": "record", "name": f"unknown_{lookup.snapshot}",
                     "fields": [{"name": name, "type": UNKNOWN_TYPE} for name in lookup.fields]}
            joins.append(JoinedFields(lookup.prefix, value, lookup.fields, lookup.how == "left"))
            joined[i] = {f"{lookup.prefix}{name}": UNKNOWN_TYPE for name in lookup.fields}
            continue
        if lookup.snapshot not in snaps or event is None:
            open_prefixes.append(lookup.prefix)
            joined[i] = None
            continue
        key, value = snaps[lookup.snapshot]
        value_fields = fields_of(value)
        found = _lookup_problems(i, lookup, key, value)
        for path, message in found:
            problem(path, message)
        if found:
            open_prefixes.append(lookup.prefix)
            joined[i] = None
        else:
            join = JoinedFields(lookup.prefix, value, lookup.fields, lookup.how == "left")
            joins.append(join)
            joined[i] = {
                f"{lookup.prefix}{name}": (nullable({"name": "_", "type": value_fields[name]["type"]})["type"]
                                           if join.optional else value_fields[name]["type"])
                for name in (lookup.fields or list(value_fields))
            }
    return joins, joined, open_prefixes


def _lookup_problems(i: int, lookup: Any, key: dict[str, Any], value: dict[str, Any]) -> list[tuple[str, str]]:
    """``(path, message)`` for each field of lookup ``i`` its snapshot's key or value schema lacks."""
    found: list[tuple[str, str]] = []
    key_fields, value_fields = fields_of(key), fields_of(value)
    for ev, kf in lookup.on.items():
        if kf not in key_fields:
            found.append((f"lookups[{i}].on.{ev}", f"no field {kf!r} in the key schema of snapshot {lookup.snapshot}"))
    missing = sorted(set(key_fields) - set(lookup.on.values()))
    if missing:
        found.append((f"lookups[{i}].on", f"map every key field of snapshot {lookup.snapshot}; missing {missing}"))
    for name in lookup.fields or []:
        if name not in value_fields:
            found.append((f"lookups[{i}].fields",
                          f"no field {name!r} in the value schema of snapshot {lookup.snapshot}"))
    return found


def check_as_of(
    config: StreamJobConfig,
    event_fields: dict[str, Any],
    derived: dict[str, Any],
    joined: dict[int, dict[str, Any] | None],
    problem: Callable[[str, str], None],
) -> None:
    """``as_of`` of a lookup names a timestamp or date column (event field, derive column or looked-up column).

    A column whose type is unknown here (a lookup whose snapshot schemas only the topics know) is
    not checked; a column that exists nowhere is reported by :func:`~stream_app.stages.order_steps`.
    """
    columns = {**event_fields, **derived}
    for cols in joined.values():
        columns.update(cols or {})
    for i, lookup in enumerate(config.lookups):
        if lookup.wait_for_reference is not None and lookup.as_of is not None and lookup.as_of not in event_fields:
            # the wait reads the newest event time of the decoded events, before derive and the lookups run
            problem(f"lookups[{i}].wait_for_reference", f"as_of {lookup.as_of!r} is not an event field: "
                                                       "wait_for_reference needs the event's own time")
        if lookup.as_of is None or lookup.as_of not in columns or columns[lookup.as_of] is None:
            continue
        kind = columns[lookup.as_of]
        if not (is_timestamp(kind) or is_date(kind)):
            problem(f"lookups[{i}].as_of", f"column {lookup.as_of!r} is not a timestamp or a date "
                                           f"(an Avro timestamp-millis/micros or date): it cannot say when an event "
                                           f"happened")
