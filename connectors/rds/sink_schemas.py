"""How the RDS sink meets each writer schema version of its topics: fit, evolve the table, refuse, check values.

No silent precision loss: each writer schema version of the update topic
is compared once with the table's columns (:mod:`connectors.rds.sink_fit`).
A value the column cannot hold exactly (a ``decimal(12,4)`` value with four
fractional digits in a ``numeric(12,2)`` column, an integer out of the
column's range, a string longer than a ``varchar(n)``) would be rounded or
truncated by the database: it goes to the dead letter topic instead, the
reason naming the field, the column's SQL type and the record's Avro type.
With ``evolve_table: true`` (PostgreSQL, MySQL/MariaDB) a ``numeric``
column narrower than the writer schema's decimal is widened first
(``ALTER TABLE ... ALTER COLUMN ... TYPE numeric(p,s)``; on MySQL/MariaDB
``MODIFY COLUMN``, which keeps nullability and comment but not a default).

Schema evolution (``evolve_table: true``, as Kafka Connect JDBC's
``auto.evolve``): a writer schema with a field the table has no column for
adds the column, once per writer schema version, before its records are
written (``ALTER TABLE ... ADD COLUMN IF NOT EXISTS``, typed as
``create_table`` would; a scalar Avro default becomes the column's
``DEFAULT``, so existing rows hold it). Replicas racing on it are safe (the
second ``ALTER`` is a no-op). A new field that is required without a default
blocks the sink with an error naming it: existing rows would have no value.
So does, with ``evolve_table``, a writer schema that changes a field's type
to one its column cannot take (a ``string`` into ``BIGINT``) or drops a
required field: the error names the columns, the writer schema and the one
that required the field; the table is migrated by a person.
Without ``evolve_table`` such a writer schema blocks the sink (a target
error): nothing is dead-lettered, the column may be added by hand.

A column the writer schema has no field for gets NULL on every upsert
(whole rows are written). When that column is required (``NOT NULL``, or
created from a non-null Avro field, or non-null in an earlier writer
schema) the sink logs a WARNING naming the table and the column at start-up
(for ``value_schema``) and on every new writer schema; a ``NOT NULL``
column then refuses each record, which goes to the dead letter topic.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import Table
from sqlalchemy.exc import SQLAlchemyError

from connectors.api.sink_records import RecordFailure, SinkBatch, SinkRecord
from connectors.rds.config import RdsSinkConfig
from connectors.rds.reading import MYSQL_DIALECTS
from connectors.rds.sink_evolve import TableEvolution, schema_name
from connectors.rds.sink_fit import REQUIRED_COMMENT, FitPlan, arrow_type, misfits, plan_fit, required_fields_of
from kernel.exceptions import SinkBlockedError, SkippableRecordError

log = logging.getLogger(__name__)


class WriterSchemas:
    """The writer-schema side of :class:`~connectors.rds.sink.RdsSink` (a mixin: it reads the sink's table).

    Attributes:
        _plans: writer schema fingerprint (or ``"value_schema"``) -> its plan, for the table ``_plans_of``.
        _required_seen: fields a writer schema of the topic declared non-null.
        _required_in: field -> the first writer schema that declared it non-null (named in errors).
    """

    # the sink's, set by RdsSink
    name: str
    config: RdsSinkConfig
    engine: Any
    table: Table | None
    _dialect: str
    _lock: threading.Lock
    _plans: dict[Any, FitPlan]
    _plans_of: Table | None
    _required_seen: set[str]
    _required_in: dict[str, str]

    def _qualified(self) -> str:
        raise NotImplementedError

    def _reflect(self) -> Table | None:
        raise NotImplementedError

    def _classify(self, exc: BaseException) -> BaseException:
        raise NotImplementedError

    def _fit(
        self, batch: SinkBatch, records: list[SinkRecord], *, reflected: bool = False
    ) -> tuple[list[SinkRecord], list[RecordFailure]]:
        """Drop the upserts with a value their column cannot hold exactly; they become record failures.

        The writer schema's plan says which fields to check (usually none); those are checked on
        the batch's Arrow columns, or on an array made of the records' values when the batch was
        decoded per record. Before refusing a record the table is reflected again (once per call):
        a column widened by hand since the plan was made then takes the value, and dead letters
        replayed after that fix (``threes dlq replay``) are written without restarting the sink.

        Returns:
            ``(records to write, failures)``.

        Raises:
            SinkBackpressureError, RetriableError, FatalError: widening a column (``evolve_table``) failed.
        """
        # the usual case costs one set of fingerprints: every writer schema already planned, nothing to check
        plans = self._plans if self._plans_of is self.table else {}
        fingerprints = {r.value_fingerprint for r in records}
        fingerprints.discard(None)  # tombstones; an upsert without one (not decoded by the service) is not checked
        if all(fp in plans and not plans[fp].checks for fp in fingerprints):
            return records, []
        groups: dict[Any, list[SinkRecord]] = {}
        for record in records:
            if record.value_fingerprint is not None and record.value_schema is not None and not record.is_delete:
                groups.setdefault(record.value_fingerprint, []).append(record)
        failures: list[RecordFailure] = []
        refused: set[int] = set()
        for key, group in groups.items():
            plan = self._plan(key, group[0].value_schema, f"writer schema of {group[0].where()}")
            if not plan.checks:
                continue
            table = batch.value_table(group)
            for check in plan.checks:
                for i in self._misfit_rows(table, group, check):
                    record = group[i]
                    if id(record) not in refused:
                        refused.add(id(record))
                        failures.append(RecordFailure(record, SkippableRecordError(
                            f"{record.where()}: table {self._qualified()!r}: {check.reason()}")))
        if not failures:
            return records, []
        if not reflected and self._table_changed():
            return self._fit(batch, records, reflected=True)
        return [r for r in records if id(r) not in refused], failures

    def _table_changed(self) -> bool:
        """Reflect the table again; when its columns changed, use it (and plan every writer schema anew).

        Returns:
            Whether the columns (names, types, nullability) differ from the table in use.
        """
        def signature(t: Table | None) -> list[tuple[str, str, bool]]:
            return [(c.name, repr(c.type), bool(c.nullable)) for c in t.c] if t is not None else []

        with self._lock:
            try:
                fresh = self._reflect()
            except SQLAlchemyError as exc:
                raise self._classify(exc) from exc
            if fresh is None or signature(fresh) == signature(self.table):
                return False
            log.info("sink=%s table=%s columns changed since they were read: planning writer schemas again",
                     self.name, self._qualified())
            self.table = fresh
            self._plans, self._plans_of = {}, fresh
            return True

    def _misfit_rows(self, table: Any, group: list[SinkRecord], check: Any) -> list[int]:
        """Positions in ``group`` of the values of ``check.field`` that do not fit (see :func:`misfits`)."""
        import numpy as np
        import pyarrow as pa

        if table is not None and check.field in table.column_names:
            values = table.column(check.field)
        else:
            typ = arrow_type(group[0].value_schema, check.field)
            try:
                values = pa.array([(r.value or {}).get(check.field) for r in group], type=typ)
            except (pa.ArrowException, TypeError, ValueError):
                if len(group) == 1:
                    return [0]  # a value that does not even convert to its Avro type's Arrow type
                return [i for i, r in enumerate(group) if self._misfit_rows(None, [r], check)]
        mask = misfits(values, check)
        return np.flatnonzero(mask.to_numpy(zero_copy_only=False)).tolist()

    def _plan(self, key: Any, schema: Any, label: str) -> FitPlan:
        """The fit of one writer schema version with the table, computed once (widening the table if allowed)."""
        plan = self._plans.get(key) if self._plans_of is self.table else None
        if plan is not None:
            return plan
        with self._lock:
            if self._plans_of is not self.table:
                self._plans, self._plans_of = {}, self.table
            plan = self._plans.get(key)
            if plan is None:
                plan = self._new_plan(schema, label, key)
                self._plans[key] = plan
        return plan

    def _refuse_change(self, plan: FitPlan, schema: Any, label: str) -> None:
        """``evolve_table``: a type change or a dropped required field is an error naming the columns and schemas.

        Raises:
            SinkBlockedError: always (the partitions pause; a person migrates the column or the producer).
        """
        named = f"{label} ({schema_name(schema)})"
        problems = [f"column {r.field!r} is {r.sql_type} but the field's Avro type is now {r.avro_type}"
                    for r in plan.retyped]
        for column in plan.absent_required:
            why = self._required_in.get(column) or (
                "the schema the table was created from" if self.table is not None
                and self.table.c[column].comment == REQUIRED_COMMENT else "the column is NOT NULL")
            problems.append(f"required column {column!r} has no field in it (required by {why})")
        raise SinkBlockedError(
            f"sink {self.name!r}: table {self._qualified()!r} cannot take the {named}: " + "; ".join(problems)
            + ". evolve_table adds columns and widens numeric ones, it changes no column's type and drops no "
            "requirement: migrate the table (or fix the producer's schema), then the sink goes on"
        )

    def _new_plan(self, schema: Any, label: str, key: Any = None) -> FitPlan:
        """Compare a new writer schema with the table: evolve it (``evolve_table``), warn about required columns.

        Raises:
            SinkBlockedError: with ``evolve_table``, a writer schema that needs a column the table cannot get
                (a new required field without a default), changes a column's type or drops a required field.
        """
        assert self.table is not None
        skip = {*self.config.key, self.config.version_column}

        def fit() -> FitPlan:
            assert self.table is not None
            return plan_fit(schema, self.table, self.engine.dialect, skip=skip, required_fields=self._required_seen)

        plan = fit()
        evolvable = self.config.evolve_table and self._dialect in ("postgresql", *MYSQL_DIALECTS)
        if (plan.widen or plan.add) and evolvable:
            self.table = self._reflect()  # another replica may have evolved it already
            plan = fit()
            assert self.table is not None
            evolution = TableEvolution(self.engine, self.table, self.name, self.config.lock_timeout_s, self._classify)
            if plan.add:
                evolution.add_columns(plan.add, f"{label} ({schema_name(schema)})")
            if plan.widen:
                evolution.widen(plan.widen, label)
            if plan.add or plan.widen:
                self.table = self._reflect()
                plan = fit()
            self._plans, self._plans_of = {}, self.table
        if evolvable and (plan.retyped or plan.absent_required) and key != "value_schema":
            self._refuse_change(plan, schema, label)
        self._warn_misfits(plan, label)
        required = required_fields_of(schema)
        self._required_seen |= required
        for name in required:
            self._required_in.setdefault(name, f"{label} ({schema_name(schema)})")
        return plan

    def _warn_misfits(self, plan: FitPlan, label: str) -> None:
        """Log the columns a writer schema leaves NULL or cannot fill (WARNING when the database will refuse)."""
        table = self.table
        assert table is not None
        for r in plan.retyped:
            log.warning("sink=%s table=%s column=%s (%s) cannot take field %s (Avro %s) of the %s: the database "
                        "refuses (or converts) its values", self.name, self._qualified(), r.field, r.sql_type,
                        r.field, r.avro_type, label)
        for column in plan.absent_required:
            log.warning(
                "sink=%s table=%s column=%s is required (NOT NULL, or a non-null field when the table was created "
                "or in an earlier writer schema) but the %s has no field for it: every upsert writes NULL there%s",
                self.name,
                self._qualified(),
                column,
                label,
                " (the column is NOT NULL: the database refuses those records, they go to the dead letter topic)"
                if not table.c[column].nullable
                else "",
            )
        others = [c for c in plan.absent if c not in plan.absent_required]
        if others:
            log.info("sink=%s table=%s columns=%s are not in the %s: upserts write NULL there",
                     self.name, self._qualified(), others, label)
