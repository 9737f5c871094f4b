"""The order in which a job runs its ``derive`` columns, lookups and ``where``: a DAG, resolved once.

Each ``derive`` column, lookup and the stream's ``where`` runs as soon as the columns it reads
exist: derive columns of the event's fields before any lookup, a lookup keyed on a derive column
after it, a lookup keyed on another lookup's prefixed column after that lookup (a chain), and
``where`` at the first point it can be evaluated, so events it drops are never looked up. Steps
that do not depend on each other share a step: independent derive columns are one projection,
independent lookups one round of joins.

:func:`order_steps` is pure (no Spark): ``threes validate`` runs it with sqlglot's types, the job
with Spark's (:func:`stream_app.plan.build_plan`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stream_app.config import StreamJobConfig
from stream_app.expressions import Expression, ExpressionError, check, parse, type_class

AvroType = Any
Problem = Callable[[str, str], None]
"""``(path under stream, message)``."""


@dataclass(frozen=True)
class DeriveStep:
    """Derive columns that read only columns existing before this step (one projection).

    Attributes:
        columns: ``(name, expression)`` in YAML order.
    """

    columns: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class LookupStep:
    """Lookups whose key columns exist before this step (one round of joins).

    Attributes:
        lookups: indexes into ``stream.lookups``.
    """

    lookups: tuple[int, ...]


@dataclass(frozen=True)
class WhereStep:
    """The stream's ``where``: events for which it is not true are dropped (and counted) here.

    Attributes:
        expression: the Spark SQL boolean expression.
    """

    expression: str


Step = DeriveStep | LookupStep | WhereStep
DeriveTyper = Callable[[dict[str, AvroType], str, Expression], AvroType]
"""``(columns available, name, expression) -> the derived column's Avro type``."""


def _validate_typer(columns: dict[str, AvroType], name: str, expression: Expression) -> AvroType:
    from stream_app.expressions import avro_type

    return avro_type(check(expression, columns))


def order_steps(
    config: StreamJobConfig,
    event_fields: dict[str, AvroType],
    joined: dict[int, dict[str, AvroType] | None],
    problem: Problem,
    typer: DeriveTyper | None = None,
) -> tuple[list[Step], dict[str, AvroType]]:
    """Resolve the job's derive columns, lookups and ``where`` into ordered steps.

    Args:
        config: the ``stream:`` section.
        event_fields: the event's fields, name -> Avro type.
        joined: per lookup index, the columns it adds (prefixed name -> Avro type), or ``None`` when
            its snapshot's schemas are unknown here (``validate`` without the schema topic): any
            column under its prefix is then accepted, unchecked.
        problem: called with ``(path, message)`` for every problem (``derive.total``,
            ``lookups[1].on.order_customer_id``, ``where``).
        typer: the Avro type of a derive column (default: sqlglot's inference).

    Returns:
        The steps in order, and the derive columns' Avro types (name -> type, YAML order).
    """
    typer = typer or _validate_typer
    available: dict[str, AvroType] = dict(event_fields)
    open_prefixes: list[str] = []
    derives: dict[str, Expression] = {}
    for name, text in config.derive.items():
        try:
            derives[name] = parse(text)
        except ExpressionError as exc:
            problem(f"derive.{name}", str(exc))
    where: Expression | None = None
    if config.where is not None:
        try:
            where = parse(config.where)
        except ExpressionError as exc:
            problem("where", str(exc))
    produced = {n.lower(): f"derive.{n}" for n in config.derive}
    for i, cols in joined.items():
        for col in cols or {}:
            if col.lower() in produced and produced[col.lower()].startswith("derive."):
                problem(produced[col.lower()], f"column {col!r} is also a column of lookups[{i}]: rename one")
            produced[col.lower()] = f"lookups[{i}]"
    for name in config.derive:
        if name.lower() in {f.lower() for f in event_fields}:
            problem(f"derive.{name}", f"the event already has a field {name!r}: name the derived column otherwise")

    def known(column: str) -> bool:
        return column.lower() in lowered or any(column.startswith(p) for p in open_prefixes)

    def columns_for(expression: Expression) -> dict[str, AvroType]:
        cols = dict(available)
        for c in expression.columns:  # a column of a lookup whose schema is unknown here: unchecked
            if c.lower() not in lowered and any(c.startswith(p) for p in open_prefixes):
                cols[c] = None
        return cols

    steps: list[Step] = []
    derived: dict[str, AvroType] = {}
    pending_derive = [n for n in config.derive if n in derives]
    pending_lookup = list(range(len(config.lookups)))
    lowered = {n.lower(): n for n in available}
    where_done = where is None
    while True:
        if not where_done and where is not None and all(known(c) for c in where.columns):
            where_done = True
            try:
                kind = type_class(check(where, columns_for(where)))
            except ExpressionError as exc:
                problem("where", str(exc))
            else:
                if kind not in ("boolean", "unknown"):
                    problem("where", f"{where.text!r} is {kind}, not a boolean expression")
                else:
                    steps.append(WhereStep(where.text))
        layer = [n for n in pending_derive if all(known(c) for c in derives[n].columns)]
        # a derive reads only derives written before it ("later entries may use earlier ones")
        layer = [n for n in layer if not _reads_later(n, derives, list(config.derive))]
        if layer:
            placed = []
            for name in layer:
                pending_derive.remove(name)
                try:
                    derived[name] = typer(columns_for(derives[name]), name, derives[name])
                except ExpressionError as exc:
                    problem(f"derive.{name}", str(exc))
                    continue
                placed.append((name, config.derive[name]))
            for name, _text in placed:
                available[name] = derived[name]
            lowered = {n.lower(): n for n in available}
            if placed:
                steps.append(DeriveStep(tuple(placed)))
            continue
        ready = [i for i in pending_lookup if all(known(c) for c in config.lookups[i].columns())]
        if ready:
            for i in ready:
                pending_lookup.remove(i)
                if joined.get(i) is None:
                    open_prefixes.append(config.lookups[i].prefix)
                else:
                    available.update(joined[i] or {})
            lowered = {n.lower(): n for n in available}
            steps.append(LookupStep(tuple(ready)))
            continue
        break
    for name in pending_derive:
        later = [c for c in derives[name].columns if _is_later(name, c, list(config.derive))]
        if later:
            problem(f"derive.{name}", f"reads {later} written after it: derive entries may read earlier ones only")
            continue
        missing = sorted(c for c in derives[name].columns if not known(c))
        problem(f"derive.{name}", _missing(missing, produced, available))
    for i in pending_lookup:
        for column in config.lookups[i].columns():
            if not known(column):
                path = f"lookups[{i}].on.{column}" if column in config.lookups[i].on else f"lookups[{i}].as_of"
                problem(path, _missing([column], produced, available))
    if not where_done and where is not None:
        problem("where", _missing(sorted(c for c in where.columns if not known(c)), produced, available))
    return steps, derived


def _is_later(name: str, column: str, order: list[str]) -> bool:
    names = [n.lower() for n in order]
    return column.lower() in names and names.index(column.lower()) >= names.index(name.lower())


def _reads_later(name: str, derives: dict[str, Expression], order: list[str]) -> bool:
    return any(_is_later(name, c, order) for c in derives[name].columns)


def _missing(columns: list[str], produced: dict[str, str], available: dict[str, AvroType]) -> str:
    """Why columns are not there: made by a step that never ran (a cycle), or nowhere."""
    cyclic = [f"{c!r} (from {produced[c.lower()]})" for c in columns if c.lower() in produced]
    if cyclic:
        return (f"reads {', '.join(cyclic)}, which itself waits on this step: a cycle of lookups/derive columns, "
                "or a column of a lookup that could not be planned")
    return (f"no column {', '.join(map(repr, columns))} in the event, the derive columns or an earlier lookup "
            f"(have: {', '.join(sorted(available))})")
