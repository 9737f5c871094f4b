"""``RdsSink``: update topics into a table by conditional upsert (PostgreSQL, MySQL/MariaDB, SQLite)."""

from __future__ import annotations

import io
import logging
import operator
import threading
import time
import zlib
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    MetaData,
    Table,
    and_,
    bindparam,
    delete,
    func,
    inspect,
    literal,
    select,
    tuple_,
)
from sqlalchemy.exc import DBAPIError, NoSuchTableError, SQLAlchemyError
from sqlalchemy.schema import CreateColumn

from connectors.api.sink import RecordFailure, Sink, SinkBatch, SinkRecord, latest_per_key
from connectors.exceptions import (
    BatchRefusedError,
    FatalError,
    RetriableError,
    SetupError,
    SinkBackpressureError,
    SinkBlockedError,
    SkippableRecordError,
)
from connectors.rds.connection import sql_engine
from connectors.rds.errors import classify as classify_db_error
from connectors.rds.reading import MYSQL_DIALECTS, utc_sessions
from connectors.rds.sink_fit import (
    REQUIRED_COMMENT,
    FitPlan,
    NewField,
    arrow_type,
    misfits,
    plan_fit,
    required_fields_of,
)
from connectors.rds.sink_types import sql_type, table_from_avro
from connectors.redact import redact

log = logging.getLogger(__name__)


def _csv_safe(typ: Any) -> bool:
    """Whether pyarrow's CSV text of a column reads back equal in PostgreSQL (no binary, nothing nested)."""
    import pyarrow as pa

    return not (
        pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_fixed_size_binary(typ)
        or pa.types.is_nested(typ)
        or pa.types.is_dictionary(typ)
    )


def _utc_wall_time(table: Any) -> Any:
    """``table`` with every zoned timestamp column cast to a naive one of the same UTC instant.

    Args:
        table: a ``pyarrow.Table``.

    Returns:
        The table; a naive timestamp's text is the UTC wall time, which PostgreSQL
        reads back as the same instant in a session whose ``TimeZone`` is UTC.
    """
    import pyarrow as pa

    for i, f in enumerate(table.schema):
        if pa.types.is_timestamp(f.type) and f.type.tz is not None:
            table = table.set_column(i, f.name, table.column(i).cast(pa.timestamp(f.type.unit)))
    return table


class _RecordProblem(BatchRefusedError):
    """A statement failed because of the data it carried (the sink runtime bisects to find the record).

    ``error`` is the database's error, re-created from its first line only: the
    dead letter names the problem without SQLAlchemy's statement and parameters.
    """


class _NotColumns(ValueError):
    """An upsert's value has fields the table has no column for."""


def _schema_name(schema: Any) -> str:
    """``<full name>, fingerprint <hex>`` of a writer schema, to name it in errors and logs."""
    from schemas.serde import fingerprint

    name = schema.get("name", "?") if isinstance(schema, dict) else "?"
    try:
        return f"{name}, fingerprint {fingerprint(schema).hex()}"
    except Exception:  # noqa: BLE001 - a name is enough to find it
        return str(name)


def _sql_literal(value: Any, dialect: Any, typ: Any = None) -> str:
    """``value`` as a SQL literal of ``dialect``."""
    return str(literal(value, typ).compile(dialect=dialect, compile_kwargs={"literal_binds": True}))


_DEFAULTABLE = ("boolean", "int", "long", "float", "double", "string")


def _default_sql(f: NewField, typ: Any, dialect: Any) -> Any:
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
    return text(_sql_literal(f.default, dialect, typ))


def _duplicate_column(exc: BaseException) -> bool:
    """Whether the database said the column exists already (PostgreSQL 42701, MySQL/MariaDB 1060)."""
    orig = getattr(exc, "orig", None) or exc
    state = getattr(orig, "sqlstate", None) or getattr(getattr(orig, "diag", None), "sqlstate", None)
    args = getattr(orig, "args", ())
    return state == "42701" or bool(args and args[0] == 1060)


class RdsSink(Sink):
    """Apply update topics to a table: upsert by key if the version is newer, delete on tombstone.

    Delivery guarantee: at least once, effectively once in the table: an update
    is applied only when its ``version`` header is greater than the row's
    ``version_column`` (``INSERT ... ON CONFLICT (key) DO UPDATE ... WHERE
    row.version < excluded.version`` on PostgreSQL and SQLite, ``ON DUPLICATE
    KEY UPDATE col = IF(new version > version, new, old)`` on MySQL), and a
    tombstone deletes the row only when its version is greater. A replayed
    batch therefore changes nothing.

    Deletes keep their version: a tombstone also writes ``(key, version)`` into
    the tombstone table (``tombstone_table``, default ``<table>__deleted``,
    created next to the table), and an upsert whose version is not newer than
    its key's tombstone is dropped. So v1, delete v3, then v2 leaves the key
    deleted, as Elasticsearch's external versioning does. An upsert newer than
    the tombstone recreates the row and removes the tombstone; the table only
    ever holds live rows.

    Idempotency key: the primary key (``key``) plus ``version_column``. Within a
    batch only the newest update per key is applied.

    Speed: one transaction per batch. PostgreSQL gets the fastest safe path:
    ``COPY`` into a session temporary table, then one ``INSERT ... SELECT ... ON
    CONFLICT`` (the bulk-upsert recipe of the PostgreSQL docs' "Populating a
    Database"); other dialects use SQLAlchemy's batched ``executemany``.

    Backpressure: a lock held longer than ``lock_timeout_s``, a statement
    timeout, a deadlock, a serialization failure or too many connections raise
    :class:`SinkBackpressureError`; the runtime pauses the partitions feeding
    this sink and writes the batch again later. Lost connections are
    :class:`RetriableError`. An error any record would hit (no privilege, a
    missing table or column, a read-only database, a full disk; or a value field
    that is not a column of the table) is :class:`SinkBlockedError`: the
    partitions pause and the sink is opened again (the table reflected again)
    and the batch written again after a backoff, nothing is dead-lettered. A
    record the database refuses for its data (a value out of range, a NUL byte
    in text, a missing key field, SQLSTATE classes 22, 23, 54) makes the
    transaction raise :class:`BatchRefusedError`; the sink runtime bisects the
    batch to find it, and it goes to the dead letter topic; the rest is applied.

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

    YAML: see :class:`~connectors.rds.config.RdsSinkConfig`
    (its example is rendered in docs/config-reference.md).
    """

    default_max_record_bytes = 1024**3  # PostgreSQL's limit of one field value (1 GiB)

    def __init__(self, config: Any, connection: Any, **kwargs: Any):
        super().__init__(config, connection, **kwargs)
        self.engine: Any = None
        self.table: Table | None = None
        self.tombstones: Table | None = None
        self._lock = threading.Lock()
        self._dialect = ""
        self._plans: dict[Any, FitPlan] = {}  # per writer schema version, for ``_plans_of``
        self._plans_of: Table | None = None
        self._required_seen: set[str] = set()  # fields a writer schema of the topic declared non-null
        self._required_in: dict[str, str] = {}  # field -> the first writer schema that declared it non-null

    # -- setup ----------------------------------------------------------------------------------

    def open(self) -> None:
        """Create the engine and reflect (or create) the table.

        Raises:
            SetupError: the database cannot be reached.
            FatalError: the table is missing (and ``create_table`` is off), has no
                primary key or unique index on ``key``, or lacks ``version_column``.
        """
        pool = max(self.connection.pool_size, self.config.max_concurrency)
        options: dict[str, Any] = {}
        if self.connection.sqlalchemy_url().get_backend_name() != "sqlite":
            options["max_overflow"] = 2
            options["pool_size"] = pool
        self.engine = sql_engine(self.connection, **options)
        utc_sessions(self.engine, lock_wait_s=self.config.lock_timeout_s)  # MySQL: lock waits bounded per connection
        self._dialect = self.engine.dialect.name
        self.check()
        self.table = self._reflect()
        if self.table is None and self.config.create_table and self.config.value_schema:
            from schemas import load_schema

            self._create(load_schema(self.config.value_schema), None)
        if self.table is None and not self.config.create_table:
            raise FatalError(
                f"sink {self.name!r}: table {self._qualified()!r} does not exist; create it or set create_table: true"
            )
        if self.table is not None and self.tombstones is None:
            self._open_tombstones()
        if self.table is not None and self.config.value_schema:
            from schemas import load_schema

            # warns at start-up about required columns this schema does not carry
            ref = self.config.value_schema
            self._plan("value_schema", load_schema(ref), f"value_schema {ref}")

    def _open_tombstones(self) -> None:
        """Create (if missing) the tombstone table: the key columns, typed as the table's, and the version.

        Raises:
            FatalError: it cannot be created (the user may not create tables).
        """
        t = self.table
        assert t is not None
        name = self.config.tombstone_table or f"{self.config.table}__deleted"
        cols = [Column(k, t.c[k].type, primary_key=True, autoincrement=False) for k in self.config.key]
        cols.append(Column(self.config.version_column, BigInteger, nullable=False))
        tomb = Table(name, MetaData(), *cols, schema=self.config.schema_name)
        try:
            tomb.create(self.engine, checkfirst=True)
        except SQLAlchemyError as exc:
            if not inspect(self.engine).has_table(name, schema=self.config.schema_name):  # not a replica's race
                reason = classify_db_error(exc, self._dialect).text
                raise FatalError(f"sink {self.name!r}: cannot create the tombstone table {name!r}: {reason}") from exc
        self.tombstones = tomb

    def check(self) -> None:
        """``SELECT 1`` on the database.

        Raises:
            SetupError: it does not answer or refuses our credentials.
        """
        engine = self.engine or sql_engine(self.connection)
        try:
            with engine.connect() as conn:
                conn.execute(select(1))
        except SQLAlchemyError as exc:
            reason = classify_db_error(exc, engine.dialect.name).text
            raise SetupError(
                f"sink {self.name!r}: database {redact(self.connection.url)} did not answer: {redact(reason)}"
            ) from exc

    def _qualified(self) -> str:
        return f"{self.config.schema_name}.{self.config.table}" if self.config.schema_name else self.config.table

    def _reflect(self) -> Table | None:
        try:
            table = Table(self.config.table, MetaData(), schema=self.config.schema_name, autoload_with=self.engine)
        except NoSuchTableError:
            return None
        missing = [c for c in [*self.config.key, self.config.version_column] if c not in table.c]
        if missing:
            raise FatalError(
                f"sink {self.name!r}: table {self._qualified()!r} has no column(s) {missing} "
                f"(key {self.config.key} and version column {self.config.version_column!r} are needed)"
            )
        insp = inspect(self.engine)
        unique_sets = [
            set(
                insp.get_pk_constraint(self.config.table, schema=self.config.schema_name).get("constrained_columns")
                or []
            )
        ]
        unique_sets += [
            set(u["column_names"])
            for u in insp.get_unique_constraints(self.config.table, schema=self.config.schema_name)
        ]
        unique_sets += [
            set(i["column_names"])
            for i in insp.get_indexes(self.config.table, schema=self.config.schema_name)
            if i.get("unique")
        ]
        if set(self.config.key) not in unique_sets:
            raise FatalError(
                f"sink {self.name!r}: table {self._qualified()!r} has no primary key or unique index on "
                f"{self.config.key}: an upsert needs one"
            )
        return table

    def _create(self, schema: Any, sample: SinkRecord | None) -> None:
        key_sample = None
        if sample is not None:
            key_sample = sample.key if isinstance(sample.key, dict) else {self.config.key[0]: sample.key}
        table = table_from_avro(
            self.config.table,
            schema,
            self.config.key,
            self.config.version_column,
            schema_name=self.config.schema_name,
            key_sample=key_sample,
        )
        try:
            table.create(self.engine, checkfirst=True)
        except SQLAlchemyError as exc:
            raise FatalError(f"sink {self.name!r}: cannot create table {self._qualified()!r}: {exc}") from exc
        log.info("sink=%s created table=%s columns=%s", self.name, self._qualified(), [c.name for c in table.c])
        self.table = self._reflect()
        self._open_tombstones()

    def close(self) -> None:
        """Dispose of the connection pool."""
        if self.engine is not None:
            self.engine.dispose()

    # -- write ----------------------------------------------------------------------------------

    def write(self, batch: SinkBatch) -> list[RecordFailure]:
        """Upsert and delete the batch's newest update per key, in one transaction when all is well.

        Returns:
            The records refused before any statement (a key without the table's key fields), about their data.

        Raises:
            SinkBackpressureError: a lock, a timeout or too many connections.
            RetriableError: the connection was lost.
            SinkBlockedError: any record would fail (a privilege, a missing table or column, read-only,
                disk full), or a value has fields that are not columns of the table.
            BatchRefusedError: the transaction failed because of some record's data (bisected by the runtime).
        """
        records = latest_per_key(batch.records)
        if self.table is None:
            with self._lock:
                if self.table is None:
                    sample = next((r for r in records if r.value_schema is not None), None)
                    if sample is None:
                        return []  # only deletes, and no table yet: nothing to delete
                    self._create(sample.value_schema, sample)
        records, failures = self._fit(batch, records)
        columns, records = self._columnar(batch, records) if self._dialect == "postgresql" else ([], records)
        rows: list[tuple[SinkRecord, tuple[Any, ...] | None]] = []
        for record in records:
            try:
                rows.append((record, self._values(record)))
            except _NotColumns as exc:
                # every record of this writer schema would hit it: a migration is due (or under way)
                raise SinkBlockedError(str(exc)) from exc
            except ValueError as exc:
                failures.append(RecordFailure(record, exc, about_data=True))
        start = time.monotonic()
        if columns or rows:
            # one transaction; a refused value raises BatchRefusedError, and the sink runtime
            # writes halves of the batch until the record stands alone (sync_service/isolation.py)
            self._transaction(rows, columns)
        log.debug(
            "sink=%s table=%s records=%d elapsed_s=%.3f",
            self.name,
            self._qualified(),
            len(rows),
            time.monotonic() - start,
        )
        return failures

    # -- exact values (connectors.rds.sink_fit) -------------------------------------------------------

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
        named = f"{label} ({_schema_name(schema)})"
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
            if plan.add:
                self._add_columns(plan.add, schema, label)
            if plan.widen:
                self._widen(plan.widen, label)
            if plan.add or plan.widen:
                self.table = self._reflect()
                plan = fit()
            self._plans, self._plans_of = {}, self.table
        if evolvable and (plan.retyped or plan.absent_required) and key != "value_schema":
            self._refuse_change(plan, schema, label)
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
                if not self.table.c[column].nullable
                else "",
            )
        others = [c for c in plan.absent if c not in plan.absent_required]
        if others:
            log.info("sink=%s table=%s columns=%s are not in the %s: upserts write NULL there",
                     self.name, self._qualified(), others, label)
        required = required_fields_of(schema)
        self._required_seen |= required
        for name in required:
            self._required_in.setdefault(name, f"{label} ({_schema_name(schema)})")
        return plan

    def _add_columns(self, fields: list[NewField], schema: Any, label: str) -> None:
        """``evolve_table``: add a column for each new field of a writer schema (``ADD COLUMN IF NOT EXISTS``).

        The column's type is the one ``create_table`` gives the field (:func:`sql_type`); it is
        nullable, with :data:`REQUIRED_COMMENT` when the field is not, as ``create_table`` makes
        it. A field with a scalar default gets it as the column's ``DEFAULT``, so existing rows
        hold what Avro schema resolution gives a record written without the field; any other
        new field leaves existing rows NULL. Replicas racing on the same column are safe:
        PostgreSQL and MariaDB skip a column that exists (``IF NOT EXISTS``), and MySQL's
        duplicate-column error (1060) is taken as the other replica's success.

        Args:
            fields: the new fields (:attr:`FitPlan.add`).
            schema: the writer schema (named in errors).
            label: which writer schema, for logs and errors (``writer schema of <record>``).

        Raises:
            SinkBlockedError: a new field is required and has no default (existing rows would have
                no value for it), or its Avro type has no column type; the sink waits for a person.
            SinkBackpressureError: a lock on the table outlasted ``lock_timeout_s`` (retried later).
            RetriableError: the connection was lost.
            FatalError: the database refused (no privilege to alter the table...).
        """
        assert self.table is not None
        named = f"{label} ({_schema_name(schema)})"
        refused = [f.name for f in fields if not f.nullable and not f.has_default]
        if refused:
            raise SinkBlockedError(
                f"sink {self.name!r}: the {named} has new required field(s) {refused} without a default: "
                f"evolve_table cannot add column(s) to {self._qualified()!r} for them (what would existing rows "
                "hold?); give the field(s) a default or a union with null, or add the column(s) by hand"
            )
        dialect = self.engine.dialect
        prep = dialect.identifier_preparer
        target = prep.format_table(self.table)
        # MySQL proper has no ADD COLUMN IF NOT EXISTS (MariaDB 10.0.2+ and PostgreSQL 9.6+ do)
        if_not_exists = "" if self._dialect in MYSQL_DIALECTS and not getattr(dialect, "is_mariadb", False) else (
            "IF NOT EXISTS ")
        for f in fields:
            try:
                typ, nullable = sql_type(f.avro_type)
            except FatalError as exc:
                raise SinkBlockedError(f"sink {self.name!r}: the {named}: field {f.name!r}: {exc}") from exc
            comment = None if nullable else REQUIRED_COMMENT
            default = _default_sql(f, typ, dialect)
            column = Column(f.name, typ, nullable=True, server_default=default,
                            comment=comment if self._dialect in MYSQL_DIALECTS else None)
            ddl = [f"ALTER TABLE {target} ADD COLUMN {if_not_exists}{CreateColumn(column).compile(dialect=dialect)}"]
            if comment and self._dialect == "postgresql":  # PostgreSQL has no inline column comment
                ddl.append(f"COMMENT ON COLUMN {target}.{prep.quote(f.name)} IS {_sql_literal(comment, dialect)}")
            try:
                # one transaction per column: MySQL commits each DDL anyway, and a replica's column is no loss
                with self.engine.begin() as conn:
                    if self._dialect == "postgresql":
                        conn.execute(select(
                            func.set_config("lock_timeout", f"{int(self.config.lock_timeout_s * 1000)}ms", True)))
                    for statement in ddl:
                        # no parameters: the driver must not read a '%' of a default as a placeholder
                        conn.execution_options(no_parameters=True).exec_driver_sql(statement)
            except Exception as exc:  # noqa: BLE001 - classified: busy is backpressure, the rest stops the sink
                if _duplicate_column(exc):
                    log.info("sink=%s table=%s column=%s was added by another replica", self.name,
                             self._qualified(), f.name)
                    continue
                error = self._classify(exc)
                if isinstance(error, _RecordProblem):
                    error = FatalError(f"sink {self.name!r}: cannot add column {f.name!r} to {self._qualified()!r} "
                                       f"for the {named}: {error}")
                raise error from exc
            log.warning(
                "sink=%s table=%s added column=%s %s%s for the %s (evolve_table; IF NOT EXISTS: a replica racing "
                "on it logs this too, one of them altered the table)",
                self.name,
                self._qualified(),
                f.name,
                typ.compile(dialect=dialect),
                f" DEFAULT {default.text}" if default is not None else "",
                named,
            )

    def _widen(self, widen: list[tuple[str, Any]], label: str) -> None:
        """``evolve_table``: give narrower ``numeric`` columns the writer schema's precision and scale.

        Raises:
            SinkBackpressureError: a lock on the table outlasted ``lock_timeout_s`` (retried later).
            RetriableError: the connection was lost.
            FatalError: the database refused (no privilege to alter the table...).
        """
        assert self.table is not None
        dialect = self.engine.dialect
        prep = dialect.identifier_preparer
        target = prep.format_table(self.table)
        try:
            with self.engine.begin() as conn:
                if self._dialect == "postgresql":
                    conn.execute(
                        select(func.set_config("lock_timeout", f"{int(self.config.lock_timeout_s * 1000)}ms", True))
                    )
                for name, typ in widen:
                    column = self.table.c[name]
                    type_sql = typ.compile(dialect=dialect)
                    if self._dialect == "postgresql":
                        ddl = f"ALTER TABLE {target} ALTER COLUMN {prep.quote(name)} TYPE {type_sql}"
                    else:  # MODIFY restates the whole column: keep its nullability and comment
                        ddl = f"ALTER TABLE {target} MODIFY COLUMN {prep.quote(name)} {type_sql} " + (
                            "NULL" if column.nullable else "NOT NULL"
                        )
                        if column.comment:
                            ddl += " COMMENT " + str(
                                literal(column.comment).compile(dialect=dialect, compile_kwargs={"literal_binds": True})
                            )
                    conn.exec_driver_sql(ddl)
                    log.warning(
                        "sink=%s table=%s widened column=%s from %s to %s for the %s (evolve_table)",
                        self.name,
                        self._qualified(),
                        name,
                        column.type.compile(dialect=dialect),
                        type_sql,
                        label,
                    )
        except Exception as exc:  # noqa: BLE001 - classified: busy is backpressure, the rest stops the sink
            error = self._classify(exc)
            if isinstance(error, _RecordProblem):
                error = FatalError(f"sink {self.name!r}: cannot widen columns of {self._qualified()!r}: {error}")
            raise error from exc

    def _key_values(self, record: SinkRecord) -> dict[str, Any]:
        key = record.key
        if isinstance(key, dict):
            missing = [k for k in self.config.key if k not in key]
            if missing:
                raise ValueError(f"{record.where()}: key has no field(s) {missing} (table key {self.config.key})")
            return {k: key[k] for k in self.config.key}
        if len(self.config.key) != 1:
            raise ValueError(f"{record.where()}: scalar key {key!r} for the composite table key {self.config.key}")
        return {self.config.key[0]: key}

    def _layout(self) -> tuple[frozenset[str], dict[str, Any], Any, list[int], tuple[str, ...] | None]:
        """What the per-record code needs, cached per reflected table (it runs once per record).

        Returns:
            Column names, a row of NULLs, a getter of a row's values in column
            order, JSON column positions, and the value fields that map 1:1 onto
            the columns (``None`` when the version column is not last).
        """
        table = self.table
        assert table is not None
        if getattr(self, "_layout_of", None) is not table:
            names = [c.name for c in table.c]
            getter = operator.itemgetter(*names)
            self._layout_cache = (
                frozenset(names),
                dict.fromkeys(names),
                getter if len(names) > 1 else (lambda row: (getter(row),)),
                [i for i, c in enumerate(table.c) if isinstance(c.type, JSON)],
                tuple(names[:-1]) if names[-1] == self.config.version_column else None,
            )
            self._layout_of = table
        return self._layout_cache

    def _values(self, record: SinkRecord) -> tuple[Any, ...] | None:
        """The upsert's values in column order (``None`` for a delete).

        Fast path: a value whose fields are the table's columns in order, with
        the key equal to the record's key, is used as it is (no dict is built).
        """
        value = record.value
        if value is None:
            self._key_values(record)  # a delete still needs a valid key
            return None
        _names, _nulls, values_of, _json, direct = self._layout()
        key = record.key
        if (
            direct is not None
            and len(self.config.key) == 1
            and not isinstance(key, dict)
            and tuple(value) == direct
            and value[self.config.key[0]] == key
        ):
            return (*value.values(), record.version)
        row = self._row(record)
        assert row is not None
        return values_of(row)

    def _row(self, record: SinkRecord) -> dict[str, Any] | None:
        """The full row of an upsert, absent fields NULL (``None`` for a delete: key and version only)."""
        key = record.key
        if isinstance(key, dict) or len(self.config.key) != 1:
            keys = self._key_values(record)
        else:
            keys = {self.config.key[0]: key}
        if record.value is None:
            return None
        names, nulls, _get, _json, _direct = self._layout()
        if not names.issuperset(record.value):
            unknown = sorted(set(record.value) - names)
            raise _NotColumns(f"field(s) {unknown} of {record.where()} are not columns of table "
                              f"{self._qualified()!r}" + ("" if self.config.evolve_table else
                                                          " (evolve_table: true on the sink adds them)"))
        row = nulls.copy()
        row.update(record.value)
        row.update(keys)
        row[self.config.version_column] = record.version
        return row

    def _columnar(
        self, batch: SinkBatch, records: list[SinkRecord]
    ) -> tuple[list[tuple[list[SinkRecord], Any]], list[SinkRecord]]:
        """Split the upserts whose values were decoded in columns into COPY-ready Arrow tables.

        Returns:
            ``([(records, table in the target's column order)], the other records)``; a
            writer schema's upserts stay per record when a field is not a column of the
            target or a column's type has no CSV text PostgreSQL reads back as it was
            (binary, nested values).
        """
        import pyarrow as pa

        assert self.table is not None
        names = [c.name for c in self.table.c]
        key, version = self.config.key, self.config.version_column
        groups: dict[bytes, list[SinkRecord]] = {}
        rest: list[SinkRecord] = []
        for record in records:
            if record.row >= 0 and not record.is_delete:
                groups.setdefault(record.value_fingerprint, []).append(record)
            else:
                rest.append(record)
        out = []
        for group in groups.values():
            values = batch.value_table(group)
            if (
                values is None
                or not set(values.column_names) <= set(names)
                or not all(_csv_safe(f.type) for f in values.schema)
            ):
                rest += group
                continue
            try:
                keys = [self._key_values(r) for r in group]
            except ValueError:
                rest += group  # the per-record path names the record
                continue
            arrays = []
            for name in names:
                if name == version:
                    arrays.append(pa.array([r.version for r in group], pa.int64()))
                elif name in key:
                    arrays.append(pa.array([k[name] for k in keys]))  # the record's key wins, as in _row
                elif name in values.column_names:
                    arrays.append(values.column(name))
                else:
                    arrays.append(pa.nulls(len(group)))
            out.append((group, pa.Table.from_arrays(arrays, names=names)))
        rest.sort(key=lambda r: r.offset)
        return out, rest

    def _transaction(
        self, rows: list[tuple[SinkRecord, tuple[Any, ...] | None]], columns: list[tuple[Any, Any]] = ()
    ) -> None:
        assert self.table is not None
        upserts = [values for _r, values in rows if values is not None]
        deletes = [{**self._key_values(r), "_v": r.version} for r, row in rows if row is None]
        try:
            with self.engine.begin() as conn:
                if self._dialect == "postgresql":
                    conn.execute(
                        select(func.set_config("lock_timeout", f"{int(self.config.lock_timeout_s * 1000)}ms", True))
                    )
                    if upserts or columns:
                        self._pg_upsert(conn, upserts, [table for _records, table in columns])
                    upserts = []
                if upserts:
                    live, pruned = self._not_deleted(conn, [(r, v) for r, v in rows if v is not None])
                    names = [c.name for c in self.table.c]
                    if live:
                        conn.execute(self._upsert_statement(), [dict(zip(names, v, strict=True)) for v in live])
                    if pruned:
                        self._delete_versioned(conn, self.tombstones, pruned)
                if deletes:
                    self._delete_versioned(conn, self.table, deletes)
                    self._record_tombstones(conn, deletes)
        except Exception as exc:  # noqa: BLE001 - classified below; the transaction rolled back
            raise self._classify(exc) from exc

    def _delete_versioned(self, conn: Any, table: Table | None, keys: list[dict[str, Any]]) -> None:
        """``DELETE`` each key's row from ``table`` when its version is older than ``_v``."""
        assert table is not None
        cond = [table.c[k] == bindparam(f"k_{i}") for i, k in enumerate(self.config.key)]
        stmt = delete(table).where(and_(*cond, table.c[self.config.version_column] < bindparam("_v")))
        conn.execute(
            stmt, [{**{f"k_{i}": d[k] for i, k in enumerate(self.config.key)}, "_v": d["_v"]} for d in keys]
        )

    def _record_tombstones(self, conn: Any, deletes: list[dict[str, Any]]) -> None:
        """Keep each deleted key's version (the newest seen) in the tombstone table."""
        tomb = self.tombstones
        assert tomb is not None
        v = self.config.version_column
        params = [{**{k: d[k] for k in self.config.key}, v: d["_v"]} for d in deletes]
        if self._dialect in MYSQL_DIALECTS:
            from sqlalchemy.dialects.mysql import insert as mysql_insert

            stmt = mysql_insert(tomb)
            stmt = stmt.on_duplicate_key_update({v: func.greatest(tomb.c[v], stmt.inserted[v])})
        else:
            if self._dialect == "postgresql":
                from sqlalchemy.dialects.postgresql import insert as dialect_insert
            else:
                from sqlalchemy.dialects.sqlite import insert as dialect_insert
            stmt = dialect_insert(tomb)
            stmt = stmt.on_conflict_do_update(
                index_elements=self.config.key, set_={v: stmt.excluded[v]}, where=tomb.c[v] < stmt.excluded[v]
            )
        conn.execute(stmt, params)

    def _not_deleted(
        self, conn: Any, rows: list[tuple[SinkRecord, tuple[Any, ...]]]
    ) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
        """Drop the upserts whose key was deleted at the same or a newer version.

        Returns:
            The values of the upserts to apply, and ``{key columns..., "_v": version}``
            of the tombstones they supersede (to remove once they are applied).
        """
        tomb = self.tombstones
        assert tomb is not None
        key, v = self.config.key, self.config.version_column
        keyed = [(tuple(self._key_values(r).values()), r, values) for r, values in rows]
        deleted: dict[tuple[Any, ...], int] = {}
        key_cols = [tomb.c[k] for k in key]
        column = key_cols[0] if len(key) == 1 else tuple_(*key_cols)
        for start in range(0, len(keyed), 1_000):
            chunk = [k[0] if len(key) == 1 else k for k, _r, _v in keyed[start : start + 1_000]]
            for row in conn.execute(select(*key_cols, tomb.c[v]).where(column.in_(chunk))):
                deleted[tuple(row[: len(key)])] = row[-1]
        if not deleted:
            return [values for _k, _r, values in keyed], []
        live, pruned = [], []
        for k, record, values in keyed:
            at = deleted.get(k)
            if at is not None and record.version <= at:
                continue  # older than (or as old as) the delete: the key stays deleted
            live.append(values)
            if at is not None:
                pruned.append({**dict(zip(key, k, strict=True)), "_v": record.version})
        return live, pruned

    def _classify(self, exc: BaseException) -> BaseException:
        """Map a failed transaction to what the runtime does, by the server's code (:mod:`connectors.rds.errors`).

        Busy (lock, timeout, deadlock) is backpressure, transient (connection,
        shutdown, resources) is retried, an error of the target (privilege,
        missing table or column, read-only, disk full) blocks the sink, a
        refused value (SQLSTATE classes 22, 23, 54; MySQL's data errors) is
        bisected down to its record, which goes to the dead letter topic, and so
        is an internal error (class XX) whose record's neighbours are applied;
        anything else stops the sink.
        """
        if isinstance(exc, _RecordProblem):
            return exc
        if isinstance(exc, _NotColumns):
            return SinkBlockedError(str(exc))
        if not isinstance(exc, DBAPIError) and isinstance(exc, (ValueError, TypeError)):
            return _RecordProblem(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        meaning = classify_db_error(exc, self._dialect)
        code, text = meaning.code, meaning.text
        if meaning.meaning == "busy":
            return SinkBackpressureError(1.0, f"sink {self.name!r}: database busy ({code}): {text}")
        if meaning.meaning == "transient":
            return RetriableError(f"sink {self.name!r}: database unavailable ({code or 'no answer'}): {text}")
        if meaning.meaning == "target":
            # the database's words first: the status document shows "blocked: permission denied for table ..."
            return SinkBlockedError(f"{text} ({code or 'no code'}, sink {self.name!r}, table {self._qualified()!r})")
        if meaning.meaning in ("record", "suspect"):
            orig = exc.orig if isinstance(exc, DBAPIError) else exc
            prefix = f"{code}: " if code else ""
            try:
                error = type(orig)(prefix + text) if isinstance(orig, Exception) else None
            except Exception:  # noqa: BLE001 - an exception class with another signature
                error = None
            return _RecordProblem(prefix + text, error, about_data=meaning.meaning == "record")
        return FatalError(f"sink {self.name!r}: cannot write table {self._qualified()!r} ({code}): {text}")

    def _upsert_statement(self) -> Any:
        """The dialect's conditional upsert, for ``executemany``."""
        t = self.table
        assert t is not None
        v = self.config.version_column
        others = [c.name for c in t.c if c.name not in self.config.key and c.name != v]
        if self._dialect in MYSQL_DIALECTS:
            from sqlalchemy.dialects.mysql import insert as mysql_insert

            stmt = mysql_insert(t)
            newer = stmt.inserted[v] > t.c[v]
            # assignments run left to right: the version column must come last
            updates = [(c, func.if_(newer, stmt.inserted[c], t.c[c])) for c in others]
            updates.append((v, func.greatest(stmt.inserted[v], t.c[v])))
            return stmt.on_duplicate_key_update(updates)
        if self._dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert
        elif self._dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert as sqlite_insert  # same API
        else:
            raise FatalError(f"sink {self.name!r}: dialect {self._dialect!r} has no supported upsert")
        stmt = sqlite_insert(t)
        return stmt.on_conflict_do_update(
            index_elements=self.config.key,
            set_={c: stmt.excluded[c] for c in [*others, v]},
            where=t.c[v] < stmt.excluded[v],
        )

    def _pg_upsert(self, conn: Any, rows: list[tuple[Any, ...]], tables: list[Any] = ()) -> None:
        """COPY into a session temporary table, then one conditional ``INSERT ... SELECT``.

        ``rows`` go row by row (psycopg); ``tables`` (Arrow, the target's columns in
        order) go as CSV written by pyarrow in one call each. One key appears once
        in all of them together (the batch's newest update per key).
        """
        from psycopg import sql
        from psycopg.types.json import Jsonb
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        t = self.table
        assert t is not None
        v = self.config.version_column
        # the column types are part of the name: a session's stage made before evolve_table widened a
        # column would otherwise round the new values on COPY
        signature = self._qualified() + "|".join(f"{c.name}:{c.type!r}" for c in t.c)
        stage_name = f"_threes_stage_{zlib.crc32(signature.encode()):08x}"
        cols = [c.name for c in t.c]
        driver = conn.connection.driver_connection
        with driver.cursor() as cur:
            target = (
                sql.Identifier(self.config.schema_name, self.config.table)
                if self.config.schema_name
                else sql.Identifier(self.config.table)
            )
            cur.execute(
                sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS").format(
                    sql.Identifier(stage_name), target
                )
            )
            json_at = self._layout()[3]
            copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
                sql.Identifier(stage_name), sql.SQL(", ").join(map(sql.Identifier, cols))
            )
            if rows:
                with cur.copy(copy_sql) as copy:
                    for values in rows:
                        if json_at:
                            values = list(values)
                            for i in json_at:
                                if values[i] is not None:
                                    values[i] = Jsonb(values[i])
                        copy.write_row(values)
            if tables:
                import pyarrow.csv as pacsv

                # zoned timestamps go as UTC wall time: pyarrow formats a zoned timestamp ~25x slower
                # than a naive one; the rest of the transaction converts no text
                cur.execute("SELECT set_config('TimeZone', 'UTC', true)")
                csv_sql = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
                    sql.Identifier(stage_name), sql.SQL(", ").join(map(sql.Identifier, cols))
                )
                for table in tables:
                    out = io.BytesIO()
                    pacsv.write_csv(_utc_wall_time(table), out, pacsv.WriteOptions(include_header=False))
                    with cur.copy(csv_sql) as copy:
                        copy.write(out.getvalue())
        stage = Table(stage_name, MetaData(), *[Column(c.name, c.type) for c in t.c], prefixes=["TEMPORARY"])
        others = [c for c in cols if c not in self.config.key and c != v]
        tomb = self.tombstones
        assert tomb is not None
        same_key = [tomb.c[k] == stage.c[k] for k in self.config.key]
        # an upsert not newer than its key's tombstone is dropped: the key stays deleted
        deleted = select(literal(1)).where(*same_key, tomb.c[v] >= stage.c[v]).exists()
        stmt = pg_insert(t).from_select(cols, select(*[stage.c[c] for c in cols]).where(~deleted))
        stmt = stmt.on_conflict_do_update(
            index_elements=self.config.key,
            set_={c: stmt.excluded[c] for c in [*others, v]},
            where=t.c[v] < stmt.excluded[v],
        )
        conn.execute(stmt)
        # tombstones older than an applied upsert are no longer needed (DELETE ... USING the stage)
        conn.execute(delete(tomb).where(*same_key, tomb.c[v] < stage.c[v]))
