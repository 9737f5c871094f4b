"""``RdsSink``: update topics into a table by conditional upsert (PostgreSQL, MySQL/MariaDB, SQLite)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import BigInteger, Column, MetaData, Table, inspect, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError, NoSuchTableError, SQLAlchemyError

from connectors.api.sink import Sink
from connectors.api.sink_records import RecordFailure, SinkBatch, SinkRecord, latest_per_key
from connectors.rds.config import RdsSinkConfig
from connectors.rds.connection import RdsConnection, sql_engine
from connectors.rds.errors import classify as classify_db_error
from connectors.rds.reading import utc_sessions
from connectors.rds.sink_fit import FitPlan
from connectors.rds.sink_rows import NotColumns, Rows
from connectors.rds.sink_schemas import WriterSchemas
from connectors.rds.sink_sql import (
    delete_versioned,
    not_deleted,
    pg_copy_upsert,
    pg_lock_timeout,
    record_tombstones,
    upsert_statement,
)
from connectors.rds.sink_types import table_from_avro
from kernel.exceptions import (
    BatchRefusedError,
    FatalError,
    RetriableError,
    SetupError,
    SinkBackpressureError,
    SinkBlockedError,
)
from kernel.redact import redact

log = logging.getLogger(__name__)


class _RecordProblem(BatchRefusedError):
    """A statement failed because of the data it carried (the sink runtime bisects to find the record).

    ``error`` is the database's error, re-created from its first line only: the
    dead letter names the problem without SQLAlchemy's statement and parameters.
    """


class RdsSink(WriterSchemas, Sink):
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

    Writer schemas (:mod:`connectors.rds.sink_schemas`): each writer schema version of the
    update topic is compared once with the table's columns. A value its column cannot hold
    exactly (decimal places, an integer's range, a ``varchar(n)``) goes to the dead letter
    topic instead of being rounded or truncated by the database. With ``evolve_table: true``
    (PostgreSQL, MySQL/MariaDB; Kafka Connect JDBC's ``auto.evolve``) a new field adds its
    column and a narrower ``numeric`` column is widened, once per writer schema version,
    replicas racing on it safely (:mod:`connectors.rds.sink_evolve`); a new required field
    without a default, a changed type or a dropped required field blocks the sink with an
    error naming the columns and schemas. Without ``evolve_table`` a field that is not a
    column blocks the sink (nothing is dead-lettered; the column may be added by hand).
    A column the writer schema has no field for gets NULL on every upsert; when it is
    required the sink logs a WARNING naming the table and the column.

    YAML: see :class:`~connectors.rds.config.RdsSinkConfig`
    (its example is rendered in docs/config-reference.md).
    """

    # the base class holds any sink's config and connection; this sink's are these
    config: RdsSinkConfig
    connection: RdsConnection

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
        self._layout: Rows | None = None  # of ``table``, see _rows

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
        insp, name, schema = inspect(self.engine), self.config.table, self.config.schema_name
        unique_sets = [set(insp.get_pk_constraint(name, schema=schema).get("constrained_columns") or [])]
        unique_sets += [set(u["column_names"]) for u in insp.get_unique_constraints(name, schema=schema)]
        unique_sets += [set(i["column_names"]) for i in insp.get_indexes(name, schema=schema) if i.get("unique")]
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
        layout = self._rows()
        columns, records = layout.columnar(batch, records) if self._dialect == "postgresql" else ([], records)
        rows: list[tuple[SinkRecord, tuple[Any, ...] | None]] = []
        for record in records:
            try:
                rows.append((record, layout.values(record)))
            except NotColumns as exc:
                # every record of this writer schema would hit it: a migration is due (or under way)
                raise SinkBlockedError(str(exc)) from exc
            except ValueError as exc:
                failures.append(RecordFailure(record, exc, about_data=True))
        start = time.monotonic()
        if columns or rows:
            # one transaction; a refused value raises BatchRefusedError, and the sink runtime
            # writes halves of the batch until the record stands alone (sync_service/isolation.py)
            self._transaction(rows, columns)
        log.debug("sink=%s table=%s records=%d elapsed_s=%.3f", self.name, self._qualified(), len(rows),
                  time.monotonic() - start)
        return failures

    def _rows(self) -> Rows:
        """The layout of the table in use (read per record), built again when the table was reflected again."""
        table = self.table
        assert table is not None
        if self._layout is None or self._layout.table is not table:
            self._layout = Rows(table, self.config.key, self.config.version_column,
                                evolve_table=self.config.evolve_table)
        return self._layout

    def _transaction(
        self, rows: list[tuple[SinkRecord, tuple[Any, ...] | None]], columns: list[tuple[Any, Any]] | None = None
    ) -> None:
        """Apply upserts and deletes in one transaction (statements of :mod:`connectors.rds.sink_sql`).

        Args:
            rows: ``(record, values in column order)`` per record, values ``None`` for a delete.
            columns: ``(records, Arrow table in column order)`` of upserts decoded in columns (PostgreSQL).

        Raises:
            SinkBackpressureError, RetriableError, SinkBlockedError, BatchRefusedError, FatalError: what
                :meth:`_classify` makes of the failure; the transaction rolled back.
        """
        table, tombstones = self.table, self.tombstones
        assert table is not None and tombstones is not None
        layout = self._rows()
        key, version = self.config.key, self.config.version_column
        upserts = [(r, values) for r, values in rows if values is not None]
        deletes = [{**layout.key_values(r), "_v": r.version} for r, values in rows if values is None]
        try:
            with self.engine.begin() as conn:
                if self._dialect == "postgresql":
                    pg_lock_timeout(conn, self.config.lock_timeout_s)
                    if upserts or columns:
                        pg_copy_upsert(conn, table, tombstones, key, version, rows=[v for _r, v in upserts],
                                       tables=[t for _records, t in columns or ()], json_at=layout.json_at)
                elif upserts:
                    self._upsert(conn, layout, upserts)
                if deletes:
                    delete_versioned(conn, table, key, version, deletes)
                    record_tombstones(conn, tombstones, key, version, deletes, self._dialect)
        except Exception as exc:  # classified below; the transaction rolled back
            raise self._classify(exc) from exc

    def _upsert(self, conn: Connection, layout: Rows, upserts: list[tuple[SinkRecord, tuple[Any, ...]]]) -> None:
        """``executemany`` of the dialect's conditional upsert, without the upserts their key's tombstone outdates."""
        tombstones = self.tombstones
        assert tombstones is not None
        key, version = self.config.key, self.config.version_column
        keyed = [(tuple(layout.key_values(r).values()), r.version, values) for r, values in upserts]
        live, pruned = not_deleted(conn, tombstones, key, version, keyed)
        if live:
            conn.execute(upsert_statement(layout.table, key, version, self._dialect),
                         [dict(zip(layout.names, v, strict=True)) for v in live])
        if pruned:
            delete_versioned(conn, tombstones, key, version, pruned)

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
        if isinstance(exc, NotColumns):
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
            except Exception:  # an exception class with another signature
                error = None
            return _RecordProblem(prefix + text, error, about_data=meaning.meaning == "record")
        return FatalError(f"sink {self.name!r}: cannot write table {self._qualified()!r} ({code}): {text}")

