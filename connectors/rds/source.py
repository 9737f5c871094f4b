"""RdsSource: a table or query of a relational database into a compacted topic.

Reads through SQLAlchemy Core only: every identifier (schema, table, column)
comes from config or reflection and reaches SQL as a quoted SQLAlchemy
construct, never spliced into a string, so a table called ``x"; DROP TABLE y; --``
is just a strange name. Pages are keyset-paginated (``WHERE (order cols) > (last
values) ORDER BY ... LIMIT batch_records``) so a crash resumes within a table
scan, and each page is its own short transaction.

**Commit-safe watermark** (timestamp modes): rows are read only below
:func:`connectors.rds.reading.commit_safe_bound`, so a long transaction's rows
are not skipped (details there). Rows with equal timestamps are ordered by the
key (or ``incrementing_column``), so a page boundary inside a tie loses nothing.

**Column-wise pages** (PostgreSQL): a page is handed to the worker as one
Arrow table, encoded column-wise (:mod:`connectors.runtime.columnar`) instead of
one dict and one fastavro call per row. With ADBC's PostgreSQL driver installed
and no column needing a Python converter (``jsonb``, ``uuid``), pages are read
straight into Arrow (``COPY`` binary, the next page read in a background thread
while the worker produces this one); otherwise psycopg's rows are turned into
columns. Cursor values must then bind as plain parameters (integers, text,
dates, date-times). A page whose values do not fit the schema's Arrow types
goes record by record, so errors name the column as before.

``incrementing`` mode has no time to bound: an id taken by a transaction that
commits after a larger id was read is behind the cursor. Reconciliation (below)
re-emits such rows, so they arrive late (within ``reconcile_interval_s``) but
arrive; use a timestamp mode where that delay matters.

**Deletes** become tombstones without CDC privileges: :meth:`RdsSource.reconcile`
streams the table's keys, compares them (as encoded key bytes) with the live
keys of the state topic, yields tombstones for keys that vanished and re-emits
rows the topic lacks (an ``incrementing`` row committed late, a row with a
``NULL`` timestamp).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from sqlalchemy import Column, func, literal, select, text
from sqlalchemy.exc import DBAPIError, DisconnectionError, SQLAlchemyError

from connectors.api.source import SourceBatch, SourceSchemas
from connectors.rds.config import RdsSourceConfig
from connectors.rds.connection import RdsConnection, sql_engine
from connectors.rds.read_errors import db_reason, read_error
from connectors.rds.reading import (
    BATCHES_PER_QUERY,
    MYSQL_DIALECTS,
    commit_safe_bound,
    stream_rows,
    utc_sessions,
)
from connectors.rds.source_reconcile import KeyReconciliation
from connectors.rds.source_schema import TableSchemas
from connectors.rds.types import from_json_value, is_instant
from kernel.exceptions import ConfigError, RetriableError, SetupError

log = logging.getLogger(__name__)

_HELD_BACK_WARN_S = 60.0


class RdsSource(TableSchemas, KeyReconciliation):
    """A table (or a custom query) of PostgreSQL, MySQL/MariaDB or SQLite into a compacted topic.

    Delivery guarantee: at least once. A position (the last key / timestamp /
    incrementing value read) is stored only after the broker acknowledged every
    record before it; a crash replays from there.

    Idempotency key: the table's primary key (or ``key``), as an Avro record;
    replays write the same key and value again, which compaction collapses.

    Backpressure: the worker blocks the read loop while the producer's local
    queue is full (``BufferError`` waited out); the database is read one page
    (``batch_records`` rows) at a time, at most two pages ahead when reading
    through ADBC, so a slow broker slows the reads.

    ``NaN`` and ``±Infinity`` in a ``numeric`` column (PostgreSQL allows them; an
    Avro ``decimal`` cannot carry them): in a nullable column the record is sent
    with that field null and a WARNING names the table, the key and the column;
    in a ``NOT NULL`` column the row is left out of the topic (its key keeps
    its previous value there) and an ERROR names them, until the row holds a
    number again. Either way the position moves on: later rows and commits
    still arrive, and the task never stops (and restarts) on that row. Sources
    have no dead letter topic; cast the column in a ``mode: query`` SELECT
    (``NULLIF(amount, 'NaN')``) to choose otherwise.

    YAML: see :class:`~connectors.rds.config.RdsSourceConfig`
    (its example is rendered in docs/config-reference.md).
    """

    config: RdsSourceConfig
    connection: RdsConnection

    @classmethod
    def task_count_for(cls, config: RdsSourceConfig) -> int:  # type: ignore[override]
        """``tasks`` of the config: each reads the rows whose ``abs(key % tasks)`` is its index."""
        return config.tasks

    def __init__(self, config: RdsSourceConfig, connection: RdsConnection, **kwargs: Any):
        super().__init__(config, connection, **kwargs)
        self.engine = None
        self._adbc = None
        self._use_adbc = False
        self.cursor = None
        self.ts_col = None
        self.inc_col = None
        self.order_cols = []
        self.where = ""
        self._scan_finished = False
        self._last_held_warning = 0.0
        self._cdc = None

    # -- open -----------------------------------------------------------------------------------------

    def open(self, position: Mapping[str, Any] | None) -> SourceSchemas:
        """Reflect the table (or read the query's schema), derive Avro schemas, resume from ``position``.

        Raises:
            RetriableError: the database cannot be reached (the worker retries).
            ConfigError: the table, key or a configured column does not exist, or the table has no key.
            FatalError: a column type has no Avro mapping.
        """
        cfg = self.config
        self.engine = sql_engine(self.connection)
        utc_sessions(self.engine)
        try:
            with self.engine.connect() as conn:
                conn.execute(select(literal(1))).scalar_one()
        except DBAPIError as exc:
            raise RetriableError(f"source {cfg.name!r}: cannot connect to the database: {db_reason(exc)}") from exc
        self.dialect = self.engine.dialect.name
        if cfg.mode == "query":
            self._open_query()
        else:
            self._open_table()
        if cfg.mode == "cdc":
            self.cursor = None
            self._use_adbc = False
            self._cdc = self._change_stream()
            self._cdc.open(position)
        else:
            self._open_cursor(position)
            if self.ts_col is not None and cfg.mode != "incrementing":
                self._check_activity_visible()
        log.info(
            "source=%s %s mode=%s key=%s fields=%d",
            cfg.name,
            self.where,
            cfg.mode,
            self.key_columns,
            len(self.value_schema["fields"]),
        )
        return SourceSchemas(key=self.key_schema, value=self.value_schema)

    def _change_stream(self) -> Any:
        """The ``cdc`` reader of the dialect: PostgreSQL's logical replication, or MySQL/MariaDB's binlog.

        Raises:
            ConfigError: another database (SQLite has no change stream).
        """
        if self.dialect == "postgresql":
            from connectors.rds.cdc import PgChangeStream

            return PgChangeStream(self)
        if self.dialect in MYSQL_DIALECTS:
            from connectors.rds.binlog import MysqlChangeStream

            return MysqlChangeStream(self)
        raise ConfigError(
            f"source {self.config.name!r}: mode 'cdc' needs PostgreSQL or MySQL/MariaDB (the connection is "
            f"{self.dialect})"
        )

    def _check_activity_visible(self) -> None:
        """Refuse a watermark that would silently miss other roles' open transactions (PostgreSQL).

        ``pg_stat_activity`` shows another role's ``xact_start`` and
        ``backend_xid`` only to a superuser or a member of ``pg_read_all_stats``;
        for anyone else those rows read as idle, and the commit-safe bound of
        ``hold_for_transactions: writers``/``all`` quietly becomes the
        ``commit_delay_s`` bound alone (rows of a writer that stays open longer
        are then skipped for good). Refused rather than warned: the loss is
        silent and one ``GRANT`` fixes it; ``hold_for_transactions: none``
        states that the delay alone is acceptable.

        Raises:
            SetupError: the connector's role cannot see other roles' transactions.
            RetriableError: the database cannot be reached.
        """
        cfg = self.config
        if self.dialect != "postgresql" or cfg.hold_for_transactions == "none":
            return
        try:
            with self.engine.connect() as conn:
                role, sees_all = conn.execute(
                    text(
                        "SELECT current_user, rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'USAGE') "
                        "FROM pg_roles WHERE rolname = current_user"
                    )
                ).one()
        except DBAPIError as exc:
            raise RetriableError(f"source {cfg.name!r}: cannot read the role's privileges: {db_reason(exc)}") from exc
        if not sees_all:
            raise SetupError(
                f"source {cfg.name!r}: role {role!r} cannot see other roles' open transactions in pg_stat_activity, "
                f"so hold_for_transactions: {cfg.hold_for_transactions} would silently fall back to commit_delay_s "
                f"alone and skip rows of longer transactions",
                hint=f'GRANT pg_read_all_stats TO "{role}", or set hold_for_transactions: none to accept the '
                "delay-only bound",
            )

    def _open_cursor(self, position: Mapping[str, Any] | None) -> None:
        cfg = self.config
        self.cursor = None
        if not position:
            return
        if position.get("mode") != cfg.mode:
            raise ConfigError(
                f"source {cfg.name!r}: the stored position was written in mode {position.get('mode')!r}, "
                f"the config says {cfg.mode!r}; reset it with `threes offsets reset --connector {cfg.name}`"
            )
        after = position.get("after")
        self.cursor = [from_json_value(v) for v in after] if after is not None else None

    # -- poll -----------------------------------------------------------------------------------------

    def records_behind(self) -> int | None:
        """Rows after the cursor (``SELECT count(*)``); ``None`` in ``bulk``, ``query`` and ``cdc`` modes.

        Rows the commit delay still holds back count as behind. Raises nothing:
        a failed count (the database is down) is ``None``.
        """
        if self.engine is None or self._cdc is not None or self.config.mode not in (
            "incrementing", "timestamp", "timestamp+incrementing"
        ):
            return None
        stmt = self._page_statement(None, 1).limit(None).order_by(None)
        try:
            with self.engine.connect() as conn:
                return int(conn.execute(select(func.count()).select_from(stmt.subquery())).scalar_one())
        except Exception as exc:  # a status read never fails the task
            log.debug("source=%s records behind unknown: %s", self.config.name, exc)
            return None

    def poll(self) -> Iterator[SourceBatch]:
        """Read pages after the cursor until caught up (one full scan in ``bulk``/``query`` mode).

        Yields:
            One batch per page, its position the last row's ordering values.

        Raises:
            RetriableError: the connection failed (the worker retries from the in-memory cursor).
            FatalError: the database rejected the query.
        """
        cfg = self.config
        if self._cdc is not None:
            yield from self._cdc.poll()
            return
        per_query = cfg.batch_records * BATCHES_PER_QUERY
        scanning = cfg.mode in ("bulk", "query")
        try:
            with self.engine.connect() as conn:
                bound = (self._upper_bound(conn, self.ts_col) if self.ts_col is not None and cfg.mode != "incrementing"
                         else None)
                conn.rollback()
                while True:
                    got = 0
                    if self._use_adbc:
                        for batch in self._arrow_batches(self._page_statement(bound, per_query)):
                            got += batch.rows_read or 0
                            yield batch
                        if got < per_query:
                            break
                        continue
                    for rows in self._stream(conn, self._page_statement(bound, per_query)):
                        got += len(rows)
                        yield self._page_batch(rows)
                    if got < per_query:
                        break
        except DisconnectionError as exc:
            raise RetriableError(f"source {cfg.name!r}: reading {self.where} failed: {db_reason(exc)}") from exc
        except SQLAlchemyError as exc:
            message = f"source {cfg.name!r}: reading {self.where} failed: {db_reason(exc)}"
            raise read_error(exc, self.dialect, message) from exc
        if scanning:
            # the scan is complete: the next cycle starts a new one; deletes are settled by reconcile
            self.cursor = None
            self._scan_finished = True
            yield SourceBatch([], self._position())

    def _page_batch(self, rows: list[Any]) -> SourceBatch:
        """One page read through SQLAlchemy as a batch (column-wise when it converts); moves the cursor past it."""
        order_idx = self.order_idx
        table = self._columns(rows) if self._arrow_schema is not None else None
        if table is not None:
            last = rows[-1]
            self.cursor = [last[i] for i in order_idx]
            return SourceBatch([], self._position(), columns=table, source_ts_ms=self._cursor_ts_ms())
        to_value, key_fields = self.to_value, self.key_fields
        single_key = key_fields[0] if len(key_fields) == 1 else None
        records: list[Any] = []
        append = records.append
        if single_key is not None:
            for row in rows:
                v = to_value(row)
                if v is not None:  # None: a row left out (a NaN in a NOT NULL decimal)
                    append(({single_key: v[single_key]}, v))
        else:
            for row in rows:
                v = to_value(row)
                if v is not None:
                    append(({k: v[k] for k in key_fields}, v))
        last = rows[-1]
        self.cursor = [last[i] for i in order_idx]
        return SourceBatch(records, self._position(), source_ts_ms=self._cursor_ts_ms())

    def _stream(self, conn: Any, stmt: Any) -> Iterator[list[Any]]:
        return stream_rows(conn, stmt, self.engine.dialect, self.config.batch_records)

    def _upper_bound(self, conn: Any, ts_col: Column[Any]) -> Any:
        """The commit-safe upper bound of the timestamp column ``ts_col`` (exclusive), in the database's clock."""
        cfg = self.config
        bound, oldest, now = commit_safe_bound(
            conn,
            self.dialect,
            cfg.commit_delay_s,
            cfg.hold_for_transactions,
            server_zone=not is_instant(ts_col.type),
        )
        if oldest is not None and oldest <= bound:
            held = (now - oldest).total_seconds()
            if held > _HELD_BACK_WARN_S and time.monotonic() - self._last_held_warning > _HELD_BACK_WARN_S:
                self._last_held_warning = time.monotonic()
                log.warning(
                    "source=%s watermark held back %.0f s by a transaction open since %s "
                    "(it may still commit rows older than that)",
                    cfg.name,
                    held,
                    oldest,
                )
        log.debug("source=%s db_now=%s oldest_open_transaction=%s bound=%s", cfg.name, now, oldest, bound)
        return bound

    # -- reconcile ------------------------------------------------------------------------------------

    def reconciles(self) -> bool:
        """Task 0 reconciles the whole table for every task of the connector."""
        return self.task_id == 0

    def wants_reconcile(self) -> bool:
        """After every completed full scan (``bulk``/``query``) unless ``reconcile_interval_s`` is null.

        ``cdc``: after a ``TRUNCATE`` of the table, or a new snapshot that replaced lost changes.
        """
        if self._cdc is not None:
            wanted = self._cdc.truncated or (self._cdc.resnapshot and not self._cdc.snapshotting)
            if wanted:
                self._cdc.truncated = self._cdc.resnapshot = False
            return wanted
        return self._scan_finished and self.config.reconcile_interval_s is not None

    def commit(self, position: Mapping[str, Any]) -> None:
        """``cdc``: the slot's confirmed flush LSN moves to ``position`` (acknowledged by Kafka)."""
        if self._cdc is not None:
            self._cdc.commit(position)

    def close(self) -> None:
        """Dispose of the engine's pool and close the ADBC (and replication) connections."""
        self._close_adbc()
        if self._cdc is not None:
            self._cdc.close()
        if self.engine is not None:
            self.engine.dispose()

