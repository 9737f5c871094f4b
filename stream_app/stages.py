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
) -> tuple[list[Step], dict[str, AvroType], list[str]]:
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
        The steps in order, the derive columns' Avro types (name -> type, YAML order), and the
        (lowered) columns of the steps that failed: their problems are reported once, at the root,
        and what reads them later is not checked again.
    """
    resolver = _Resolver(config, event_fields, joined, problem, typer or _validate_typer)
    resolver.run()
    resolver.report_unplaced()
    return resolver.steps, resolver.derived, sorted(resolver.failed)


class _Resolver:
    """The state of :func:`order_steps`: what exists so far, what waits, the steps placed."""

    def __init__(self, config: StreamJobConfig, event_fields: dict[str, AvroType],
                 joined: dict[int, dict[str, AvroType] | None], problem: Problem, typer: DeriveTyper):
        self.config, self.joined, self.problem, self.typer = config, joined, problem, typer
        self.available: dict[str, AvroType] = dict(event_fields)
        self.lowered = {n.lower(): n for n in self.available}
        self.open_prefixes: list[str] = []  # lookups whose schemas are unknown: any column under them is accepted
        self.steps: list[Step] = []
        self.derived: dict[str, AvroType] = {}
        self.derives = self._parse_derives()
        self.where = self._parse_where()
        self.produced = self._producers(event_fields)
        self.pending_derive = [n for n in config.derive if n in self.derives]
        self.pending_lookup = list(range(len(config.lookups)))
        self.where_done = self.where is None
        self.failed: set[str] = set()  # lowered columns of steps that failed (report_unplaced)

    def _parse_derives(self) -> dict[str, Expression]:
        derives: dict[str, Expression] = {}
        for name, text in self.config.derive.items():
            try:
                derives[name] = parse(text)
            except ExpressionError as exc:
                self.problem(f"derive.{name}", str(exc))
        return derives

    def _parse_where(self) -> Expression | None:
        if self.config.where is None:
            return None
        try:
            return parse(self.config.where)
        except ExpressionError as exc:
            self.problem("where", str(exc))
            return None

    def _producers(self, event_fields: dict[str, AvroType]) -> dict[str, str]:
        """Lowered column name -> the step making it (``derive.<name>``, ``lookups[i]``); clashes are problems."""
        produced = {n.lower(): f"derive.{n}" for n in self.config.derive}
        for i, cols in self.joined.items():
            for col in cols or {}:
                if col.lower() in produced and produced[col.lower()].startswith("derive."):
                    self.problem(produced[col.lower()], f"column {col!r} is also a column of lookups[{i}]: rename one")
                produced[col.lower()] = f"lookups[{i}]"
        event = {f.lower() for f in event_fields}
        for name in self.config.derive:
            if name.lower() in event:
                self.problem(f"derive.{name}",
                             f"the event already has a field {name!r}: name the derived column otherwise")
        return produced

    def known(self, column: str) -> bool:
        return column.lower() in self.lowered or any(column.startswith(p) for p in self.open_prefixes)

    def columns_for(self, expression: Expression) -> dict[str, AvroType]:
        cols = dict(self.available)
        for c in expression.columns:  # a column of a lookup whose schema is unknown here: unchecked
            if c.lower() not in self.lowered and any(c.startswith(p) for p in self.open_prefixes):
                cols[c] = None
        return cols

    def run(self) -> None:
        """Place steps until nothing more can run: ``where`` first when it can, then derive columns, then lookups."""
        while True:
            self._place_where()
            if self._place_derives() or self._place_lookups():
                continue
            return

    def _place_where(self) -> None:
        where = self.where
        if self.where_done or where is None or not all(self.known(c) for c in where.columns):
            return
        self.where_done = True
        try:
            kind = type_class(check(where, self.columns_for(where)))
        except ExpressionError as exc:
            self.problem("where", str(exc))
            return
        if kind not in ("boolean", "unknown"):
            self.problem("where", f"{where.text!r} is {kind}, not a boolean expression")
        else:
            self.steps.append(WhereStep(where.text))

    def _place_derives(self) -> bool:
        """One projection of the derive columns whose inputs exist; whether any was ready."""
        order = list(self.config.derive)
        layer = [n for n in self.pending_derive if all(self.known(c) for c in self.derives[n].columns)]
        # a derive reads only derives written before it ("later entries may use earlier ones")
        layer = [n for n in layer if not _reads_later(n, self.derives, order)]
        if not layer:
            return False
        placed = []
        for name in layer:
            self.pending_derive.remove(name)
            try:
                self.derived[name] = self.typer(self.columns_for(self.derives[name]), name, self.derives[name])
            except ExpressionError as exc:
                self.problem(f"derive.{name}", str(exc))
                continue
            placed.append((name, self.config.derive[name]))
        for name, _text in placed:
            self.available[name] = self.derived[name]
        self.lowered = {n.lower(): n for n in self.available}
        if placed:
            self.steps.append(DeriveStep(tuple(placed)))
        return True

    def _place_lookups(self) -> bool:
        """One round of the lookups whose key columns exist; whether any was ready."""
        lookups = self.config.lookups
        ready = [i for i in self.pending_lookup if all(self.known(c) for c in lookups[i].columns())]
        if not ready:
            return False
        for i in ready:
            self.pending_lookup.remove(i)
            if self.joined.get(i) is None:
                self.open_prefixes.append(lookups[i].prefix)
            else:
                self.available.update(self.joined[i] or {})
        self.lowered = {n.lower(): n for n in self.available}
        self.steps.append(LookupStep(tuple(ready)))
        return True

    def report_unplaced(self) -> None:
        """A problem for every derive column, lookup and ``where`` that never became ready, saying why.

        A step that waits only on columns of steps that failed themselves (a derive column reading a
        mistyped one, an update reading either) is not reported: its root cause is, once. The columns
        of failed steps are kept in ``failed`` for the later checks to skip.
        """
        order = list(self.config.derive)
        waits = self._waits()
        roots = {path for path, (missing, _made) in waits.items()
                 if any(c.lower() not in self.produced for c in missing)
                 or (path.startswith("derive.") and _reads_later(path[7:], self.derives, order))}
        self.failed = {n.lower() for n in self.config.derive if n not in self.derives}  # did not parse
        for path in roots:
            self.failed |= waits[path][1]
        downstream: set[str] = set()
        grew = True
        while grew:
            grew = False
            for path, (missing, made) in waits.items():
                if path not in roots and path not in downstream and all(c.lower() in self.failed for c in missing):
                    downstream.add(path)
                    self.failed |= made
                    grew = True
        for name in self.pending_derive:
            if f"derive.{name}" in downstream:
                continue
            later = [c for c in self.derives[name].columns if _is_later(name, c, order)]
            if later:
                self.problem(f"derive.{name}",
                             f"reads {later} written after it: derive entries may read earlier ones only")
                continue
            missing = sorted(c for c in self.derives[name].columns if not self.known(c))
            self.problem(f"derive.{name}", _missing(missing, self.produced, self.available))
        for i in self.pending_lookup:
            if f"lookups[{i}]" in downstream:
                continue
            lookup = self.config.lookups[i]
            for column in lookup.columns():
                if not self.known(column):
                    path = f"lookups[{i}].on.{column}" if column in lookup.on else f"lookups[{i}].as_of"
                    self.problem(path, _missing([column], self.produced, self.available))
        if not self.where_done and self.where is not None:
            missing = sorted(c for c in self.where.columns if not self.known(c))
            if not all(c.lower() in self.failed for c in missing):
                self.problem("where", _missing(missing, self.produced, self.available))

    def _waits(self) -> dict[str, tuple[list[str], set[str]]]:
        """Each pending step (``derive.<name>``, ``lookups[i]``): the columns it waits on, the ones it makes."""
        waits: dict[str, tuple[list[str], set[str]]] = {}
        for name in self.pending_derive:
            waits[f"derive.{name}"] = ([c for c in self.derives[name].columns if not self.known(c)], {name.lower()})
        for i in self.pending_lookup:
            made = {c.lower() for c in self.joined.get(i) or {}}
            waits[f"lookups[{i}]"] = ([c for c in self.config.lookups[i].columns() if not self.known(c)], made)
        return waits


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
