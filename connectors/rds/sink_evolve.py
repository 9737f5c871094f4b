"""``evolve_table``: the DDL the RDS sink runs when a writer schema needs more of its table.

New fields become nullable columns (``ADD COLUMN IF NOT EXISTS``), narrower ``numeric``
columns are widened; nothing else about a column changes (Kafka Connect JDBC's
``auto.evolve`` does the same). Which fields and columns is decided by
:func:`connectors.rds.sink_fit.plan_fit`; :class:`~connectors.rds.sink.RdsSink` calls
:class:`TableEvolution` once per writer schema version.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Column, Table, literal
from sqlalchemy.engine import Engine
from sqlalchemy.schema import CreateColumn

from connectors.rds.reading import MYSQL_DIALECTS
from connectors.rds.sink_fit import REQUIRED_COMMENT, NewField
from connectors.rds.sink_sql import pg_lock_timeout
from connectors.rds.sink_types import sql_type
from kernel.exceptions import BatchRefusedError, FatalError, SinkBlockedError

log = logging.getLogger(__name__)

_DEFAULTABLE = ("boolean", "int", "long", "float", "double", "string")


def schema_name(schema: Any) -> str:
    """``<full name>, fingerprint <hex>`` of a writer schema, to name it in errors and logs."""
    from schemas.serde import fingerprint

    name = schema.get("name", "?") if isinstance(schema, dict) else "?"
    try:
        return f"{name}, fingerprint {fingerprint(schema).hex()}"
    except Exception:  # a name is enough to find it
        return str(name)


def sql_literal(value: Any, dialect: Any, typ: Any = None) -> str:
    """``value`` as a SQL literal of ``dialect``."""
    return str(literal(value, typ).compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


def default_sql(f: NewField, typ: Any, dialect: Any) -> Any:
    """The ``DEFAULT`` of a new column: the field's Avro default when it is a scalar SQL can state.

    Returns:
        A ``text()`` for ``server_default``, or ``None``: no default (a null default, or one of a
        type whose Avro JSON encoding is not its SQL value: bytes, decimals, dates, records...).
    """
    from sqlalchemy import text

    if not f.has_default or f.default is None:
        return None
    avro = f.avro_type
    if isinstance(avro, list):  # the default is of the union's first branch (Avro 1.11 "Unions")
        avro = avro[0]
    if isinstance(avro, dict) and avro.get("logicalType") is None and avro.get("type") in (*_DEFAULTABLE, "enum"):
        avro = avro["type"]
    if avro not in (*_DEFAULTABLE, "enum") and not (isinstance(avro, dict) and avro.get("type") == "enum"):
        return None
    return text(sql_literal(f.default, dialect, typ))


def duplicate_column(exc: BaseException) -> bool:
    """Whether the database said the column exists already (PostgreSQL 42701, MySQL/MariaDB 1060)."""
    orig = getattr(exc, "orig", None) or exc
    state = getattr(orig, "sqlstate", None) or getattr(getattr(orig, "diag", None), "sqlstate", None)
    args = getattr(orig, "args", ())
    return state == "42701" or bool(args and args[0] == 1060)


@dataclass
class TableEvolution:
    """The DDL of ``evolve_table`` on one table, each statement group in its own transaction.

    Attributes:
        engine: the sink's engine.
        table: the reflected table.
        sink: the sink's name, for errors and logs.
        lock_timeout_s: how long a statement waits for the table's lock, seconds (then backpressure).
        classify: the sink's mapping of a database error to what the runtime does
            (:meth:`~connectors.rds.sink.RdsSink._classify`).
    """

    engine: Engine
    table: Table
    sink: str
    lock_timeout_s: float
    classify: Callable[[BaseException], BaseException]

    @property
    def _qualified(self) -> str:
        return f"{self.table.schema}.{self.table.name}" if self.table.schema else self.table.name

    def add_columns(self, fields: list[NewField], named: str) -> None:
        """Add a column for each new field of a writer schema (``ADD COLUMN IF NOT EXISTS``).

        The column's type is the one ``create_table`` gives the field (:func:`sql_type`); it is
        nullable, with :data:`REQUIRED_COMMENT` when the field is not, as ``create_table`` makes
        it. A field with a scalar default gets it as the column's ``DEFAULT``, so existing rows
        hold what Avro schema resolution gives a record written without the field; any other
        new field leaves existing rows NULL. Replicas racing on the same column are safe:
        PostgreSQL and MariaDB skip a column that exists (``IF NOT EXISTS``), and MySQL's
        duplicate-column error (1060) is taken as the other replica's success.

        Args:
            fields: the new fields (:attr:`FitPlan.add`).
            named: which writer schema, for logs and errors (``writer schema of <record> (<name>, fingerprint ..)``).

        Raises:
            SinkBlockedError: a new field is required and has no default (existing rows would have
                no value for it), or its Avro type has no column type; the sink waits for a person.
            SinkBackpressureError: a lock on the table outlasted ``lock_timeout_s`` (retried later).
            RetriableError: the connection was lost.
            FatalError: the database refused (no privilege to alter the table...).
        """
        refused = [f.name for f in fields if not f.nullable and not f.has_default]
        if refused:
            raise SinkBlockedError(
                f"sink {self.sink!r}: the {named} has new required field(s) {refused} without a default: "
                f"evolve_table cannot add column(s) to {self._qualified!r} for them (what would existing rows "
                "hold?); give the field(s) a default or a union with null, or add the column(s) by hand"
            )
        for f in fields:
            ddl, typ, default = self._add_column_ddl(f, named)
            try:
                # one transaction per column: MySQL commits each DDL anyway, and a replica's column is no loss
                self._run(ddl)
            except Exception as exc:  # classified: busy is backpressure, the rest stops the sink
                if duplicate_column(exc):
                    log.info("sink=%s table=%s column=%s was added by another replica", self.sink,
                             self._qualified, f.name)
                    continue
                raise self._error(exc, f"cannot add column {f.name!r} to {self._qualified!r} for the {named}") \
                    from exc
            log.warning(
                "sink=%s table=%s added column=%s %s%s for the %s (evolve_table; IF NOT EXISTS: a replica racing "
                "on it logs this too, one of them altered the table)",
                self.sink,
                self._qualified,
                f.name,
                typ.compile(dialect=self.engine.dialect),
                f" DEFAULT {default.text}" if default is not None else "",
                named,
            )

    def widen(self, widen: list[tuple[str, Any]], label: str) -> None:
        """Give narrower ``numeric`` columns the writer schema's precision and scale.

        On MySQL/MariaDB ``MODIFY COLUMN`` restates the whole column: nullability and
        comment are kept, a default is not.

        Args:
            widen: ``(column, its new SQLAlchemy type)`` (:attr:`FitPlan.widen`).
            label: which writer schema, for logs.

        Raises:
            SinkBackpressureError: a lock on the table outlasted ``lock_timeout_s`` (retried later).
            RetriableError: the connection was lost.
            FatalError: the database refused (no privilege to alter the table...).
        """
        dialect = self.engine.dialect
        ddl = [self._widen_ddl(name, typ) for name, typ in widen]
        try:
            self._run(ddl)
        except Exception as exc:  # classified: busy is backpressure, the rest stops the sink
            raise self._error(exc, f"cannot widen columns of {self._qualified!r}") from exc
        for name, typ in widen:
            log.warning("sink=%s table=%s widened column=%s from %s to %s for the %s (evolve_table)", self.sink,
                        self._qualified, name, self.table.c[name].type.compile(dialect=dialect),
                        typ.compile(dialect=dialect), label)

    def _add_column_ddl(self, f: NewField, named: str) -> tuple[list[str], Any, Any]:
        """``(statements, column type, DEFAULT or None)`` adding the column of one new field."""
        dialect = self.engine.dialect
        prep = dialect.identifier_preparer
        target = prep.format_table(self.table)
        mysql = dialect.name in MYSQL_DIALECTS
        # MySQL proper has no ADD COLUMN IF NOT EXISTS (MariaDB 10.0.2+ and PostgreSQL 9.6+ do)
        if_not_exists = "" if mysql and not getattr(dialect, "is_mariadb", False) else "IF NOT EXISTS "
        try:
            typ, nullable = sql_type(f.avro_type)
        except FatalError as exc:
            raise SinkBlockedError(f"sink {self.sink!r}: the {named}: field {f.name!r}: {exc}") from exc
        comment = None if nullable else REQUIRED_COMMENT
        default = default_sql(f, typ, dialect)
        column = Column(f.name, typ, nullable=True, server_default=default, comment=comment if mysql else None)
        ddl = [f"ALTER TABLE {target} ADD COLUMN {if_not_exists}{CreateColumn(column).compile(dialect=dialect)}"]
        if comment and dialect.name == "postgresql":  # PostgreSQL has no inline column comment
            ddl.append(f"COMMENT ON COLUMN {target}.{prep.quote(f.name)} IS {sql_literal(comment, dialect)}")
        return ddl, typ, default

    def _widen_ddl(self, name: str, typ: Any) -> str:
        dialect = self.engine.dialect
        prep = dialect.identifier_preparer
        target = prep.format_table(self.table)
        type_sql = typ.compile(dialect=dialect)
        if dialect.name == "postgresql":
            return f"ALTER TABLE {target} ALTER COLUMN {prep.quote(name)} TYPE {type_sql}"
        column = self.table.c[name]
        ddl = f"ALTER TABLE {target} MODIFY COLUMN {prep.quote(name)} {type_sql} " + (
            "NULL" if column.nullable else "NOT NULL")
        if column.comment:
            ddl += " COMMENT " + sql_literal(column.comment, dialect)
        return ddl

    def _run(self, ddl: list[str]) -> None:
        """Run the statements in one transaction, lock waits bounded by ``lock_timeout_s`` on PostgreSQL."""
        with self.engine.begin() as conn:
            if self.engine.dialect.name == "postgresql":
                pg_lock_timeout(conn, self.lock_timeout_s)
            for statement in ddl:
                # no parameters: the driver must not read a '%' of a default as a placeholder
                conn.execution_options(no_parameters=True).exec_driver_sql(statement)

    def _error(self, exc: BaseException, what: str) -> BaseException:
        """The sink's error for a failed DDL: a data-like refusal of DDL is no record's fault, it stops the sink."""
        error = self.classify(exc)
        if isinstance(error, BatchRefusedError):
            return FatalError(f"sink {self.sink!r}: {what}: {error}")
        return error
