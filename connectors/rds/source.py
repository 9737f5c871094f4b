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

import datetime as dt
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from sqlalchemy import (
    Column,
    MetaData,
    Table,
    column,
    func,
    literal,
    select,
    text,
    tuple_,
)
from sqlalchemy.exc import DBAPIError, DisconnectionError, NoSuchTableError, OperationalError, SQLAlchemyError

from connectors.api.source import SourceBatch, SourceSchemas, SourceTask, TopicState, tombstone_batches
from connectors.rds.config import RdsSourceConfig
from connectors.rds.connection import RdsConnection, sql_engine
from connectors.rds.reading import (
    BATCHES_PER_QUERY,
    adbc_connect,
    arrow_pages,
    commit_safe_bound,
    prefetched,
    stream_rows,
    utc_sessions,
)
from connectors.rds.types import (
    ARROW_NATIVE_CONVERTERS,
    avro_name,
    avro_record_schema,
    converters_for_schema,
    drop_needless_converters,
    from_json_value,
    is_instant,
    make_row_converter,
    to_json_value,
)
from connectors.runtime.columnar import ColumnarEncoder, ColumnarUnsupported
from kernel.exceptions import ConfigError, FatalError, RetriableError, SetupError

log = logging.getLogger(__name__)

_RECONCILE_CHUNK = 1_000
_HELD_BACK_WARN_S = 60.0


class RdsSource(SourceTask):
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
        self.engine: Any = None
        self._adbc: Any = None
        self._use_adbc = False
        self.cursor: list[Any] | None = None  # the order columns' values of the last row read
        self.ts_col: Column[Any] | None = None
        self.inc_col: Column[Any] | None = None
        self.order_cols: list[Column[Any]] = []
        self.where = ""
        self._scan_finished = False
        self._last_held_warning = 0.0
        self._cdc: Any = None

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
            raise RetriableError(f"source {cfg.name!r}: cannot connect to the database: {_reason(exc)}") from exc
        self.dialect = self.engine.dialect.name
        if cfg.mode == "query":
            self._open_query()
        else:
            self._open_table()
        if cfg.mode == "cdc":
            if self.dialect != "postgresql":
                raise ConfigError(
                    f"source {cfg.name!r}: mode 'cdc' needs PostgreSQL (the connection is {self.dialect})"
                )
            from connectors.rds.cdc import PgChangeStream

            self.cursor = None
            self._use_adbc = False
            self._cdc = PgChangeStream(self)
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

    def _open_table(self) -> None:
        cfg = self.config
        if cfg.table is None:  # the config model requires `table` in every mode but query
            raise ConfigError(f"source {cfg.name!r}: mode {cfg.mode!r} needs `table`")
        self.where = f'table "{cfg.schema_name + "." if cfg.schema_name else ""}{cfg.table}"'
        try:
            tbl = Table(cfg.table, MetaData(), schema=cfg.schema_name, autoload_with=self.engine)
        except NoSuchTableError as exc:
            raise ConfigError(
                f"source {cfg.name!r}: {self.where} does not exist (or is not visible to the user)"
            ) from exc
        except OperationalError as exc:
            raise RetriableError(f"source {cfg.name!r}: cannot reflect {self.where}: {_reason(exc)}") from exc
        columns: list[Column[Any]] = list(tbl.columns)
        self._require_columns([c.name for c in columns])
        key_names = list(cfg.key or [c.name for c in tbl.primary_key.columns])
        if not key_names:
            raise ConfigError(f"source {cfg.name!r}: {self.where} has no primary key; set `key:` to its key column(s)")
        self.key_columns = key_names
        self.value_schema, converters = avro_record_schema(
            cfg.table,
            [(c.name, c.type, bool(c.nullable) and c.name not in key_names) for c in columns],
            where=self.where,
            doc=f"rows of {self.where}, read by source {cfg.name}",
        )
        key_schema, _ = avro_record_schema(
            f"{cfg.table}_key", [(k, tbl.c[k].type, False) for k in key_names], where=self.where
        )
        self.key_schema = key_schema
        self._finish_open(columns, converters, {c.name: c for c in columns})

    def _open_query(self) -> None:
        from schemas import load_schema

        cfg = self.config
        self.where = f"query of source {cfg.name!r}"
        schema = load_schema(cfg.value_schema or "")
        fields = schema.get("fields", [])
        col_names = [f.get("sql.column", f["name"]) for f in fields]
        sub = text(cfg.query or "").columns(*[column(c) for c in col_names]).subquery("q")
        self._require_columns(col_names)
        missing = [k for k in cfg.key or [] if k not in col_names]
        if missing:
            raise ConfigError(f"source {cfg.name!r}: key column(s) {missing} are not fields of value_schema")
        self.key_columns = list(cfg.key or [])
        self.value_schema = schema
        key_fields = []
        for f in fields:
            if f.get("sql.column", f["name"]) in self.key_columns:
                types = f["type"] if isinstance(f["type"], list) else [f["type"]]
                non_null = [t for t in types if t != "null"]
                key_fields.append({"name": f["name"], "type": non_null[0] if len(non_null) == 1 else non_null})
        self.key_schema = {
            "type": "record",
            "name": f"{avro_name(cfg.name)}_key",
            "namespace": "threes.rds",
            "fields": key_fields,
        }
        columns = [sub.c[c] for c in col_names]
        self._finish_open(columns, converters_for_schema(schema), {c: sub.c[c] for c in col_names})

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
            raise RetriableError(f"source {cfg.name!r}: cannot read the role's privileges: {_reason(exc)}") from exc
        if not sees_all:
            raise SetupError(
                f"source {cfg.name!r}: role {role!r} cannot see other roles' open transactions in pg_stat_activity, "
                f"so hold_for_transactions: {cfg.hold_for_transactions} would silently fall back to commit_delay_s "
                f"alone and skip rows of longer transactions",
                hint=f'GRANT pg_read_all_stats TO "{role}", or set hold_for_transactions: none to accept the '
                "delay-only bound",
            )

    def _require_columns(self, names: list[str]) -> None:
        cfg = self.config
        for option in ("incrementing_column", "timestamp_column"):
            wanted = getattr(cfg, option)
            if wanted and wanted not in names:
                raise ConfigError(f"source {cfg.name!r}: {option} {wanted!r} is not a column of {self.where}")
        for k in cfg.key or []:
            if k not in names:
                raise ConfigError(f"source {cfg.name!r}: key column {k!r} is not a column of {self.where}")

    def _finish_open(self, columns: list[Any], converters: list[Any], by_name: Mapping[str, Any]) -> None:
        cfg = self.config
        self.columns = columns
        self.field_names = [f["name"] for f in self.value_schema["fields"]]
        self.field_to_column = {f["name"]: f.get("sql.column", f["name"]) for f in self.value_schema["fields"]}
        column_to_field = {v: k for k, v in self.field_to_column.items()}
        self.key_fields = [column_to_field[k] for k in self.key_columns]
        self.key_cols = [by_name[k] for k in self.key_columns]
        converters = drop_needless_converters(converters, self.dialect)
        self.to_value = self._finite_decimals(make_row_converter(self.field_names, converters))
        self._arrow_schema = self._columnar_schema()
        index = {name: i for i, name in enumerate(self.field_names)}
        self._column_converters = [(index[f], fn) for f, fn in converters]
        key_conv = [(f, fn) for f, fn in converters if f in self.key_fields]
        self.to_key = make_row_converter(self.key_fields, key_conv)
        # ordering of the cursor: (timestamp, tie-breaker) or the key / incrementing column
        self.ts_col = by_name[cfg.timestamp_column] if cfg.timestamp_column else None
        self.inc_col = by_name[cfg.incrementing_column] if cfg.incrementing_column else None
        if cfg.mode == "incrementing":
            order = [_needed(self.inc_col, "incrementing_column", cfg.mode)]
        elif cfg.mode == "timestamp":
            order = [_needed(self.ts_col, "timestamp_column", cfg.mode), *self.key_cols]
        elif cfg.mode == "timestamp+incrementing":
            order = [_needed(self.ts_col, "timestamp_column", cfg.mode),
                     _needed(self.inc_col, "incrementing_column", cfg.mode)]
        else:  # bulk, query: a full scan paged by key
            order = list(self.key_cols)
        self.order_cols = order
        self.split = None
        if self.task_count > 1:
            if len(self.key_cols) != 1 or not _is_integer(self.key_cols[0].type):
                raise ConfigError(
                    f"source {cfg.name!r}: `tasks: {self.task_count}` splits rows by an integer key; "
                    f"{self.where} has the key {self.key_columns}"
                )
            k = self.key_cols[0]
            self.split = func.abs(k % literal(self.task_count)) == literal(self.task_id)
        positions = {id(c): i for i, c in enumerate(columns)}
        self.order_idx = [positions[id(c)] for c in order]
        native = all(fn in ARROW_NATIVE_CONVERTERS for _, fn in self._column_converters)
        self._use_adbc = self._arrow_schema is not None and native and adbc_available()
        if self._use_adbc and not all(_adbc_bindable(c.type) for c in order):
            self._use_adbc = False
        self._adbc = None

    def _finite_decimals(self, convert: Any) -> Any:
        """``convert`` (row -> value dict), with ``NaN``/``±Infinity`` decimals made null or the row dropped.

        Returns:
            A converter returning the value dict, or ``None`` for a row to leave out (a
            non-finite value in a non-nullable field); ``convert`` itself when no field is
            a decimal. See the class docstring.
        """
        import decimal

        nullable_of: dict[str, bool] = {}
        for f in self.value_schema["fields"]:
            types = f["type"] if isinstance(f["type"], list) else [f["type"]]
            if any(isinstance(t, dict) and t.get("logicalType") == "decimal" for t in types):
                nullable_of[f["name"]] = "null" in types
        if not nullable_of:
            return convert
        fields = tuple(nullable_of.items())
        Decimal = decimal.Decimal

        def to_value(row: Any) -> dict[str, Any] | None:
            value = convert(row)
            for name, nullable in fields:
                v = value[name]
                if v.__class__ is Decimal and not v.is_finite():
                    if not self._non_finite(value, name, nullable):
                        return None
            return value

        return to_value

    def _non_finite(self, value: dict[str, Any], name: str, nullable: bool) -> bool:
        """Null the field (``True``), or say the row is left out (``False``), logging why."""
        key = {k: value[k] for k in self.key_fields}
        shown = value[name]
        if nullable:
            value[name] = None
            log.warning(
                "source=%s %s %s holds %s, which an Avro decimal cannot carry: the record is sent with it null",
                self.config.name, self.describe_key(key), self.describe_field(name), shown,
            )
            return True
        log.error(
            "source=%s %s %s holds %s, which an Avro decimal cannot carry, and is NOT NULL: the row is left out "
            "of the topic until it holds a number (cast it in a `mode: query` SELECT to send something else)",
            self.config.name, self.describe_key(key), self.describe_field(name), shown,
        )
        return False

    def _columnar_schema(self) -> Any:
        """The Arrow schema of column-wise batches, or ``None`` to yield one dict per row.

        Column-wise on PostgreSQL (ADBC's Arrow types, or psycopg's exact Python
        types, see :func:`~connectors.rds.reading.stream_rows`) when the columnar
        encoder writes every field; other dialects and other types keep the
        per-record path.
        """
        if self.dialect != "postgresql":
            return None
        try:
            encoder = ColumnarEncoder(self.value_schema, bytes(10), self.key_schema, bytes(10))
        except ColumnarUnsupported as exc:
            log.info("source=%s encodes record by record: %s", self.config.name, exc)
            return None
        return encoder.arrow_schema

    def _columns(self, rows: list[Any]) -> Any:
        """One page as an Arrow table (``None`` when a value does not convert: the page goes record by record)."""
        import pyarrow as pa

        columns: list[Any] = list(zip(*rows, strict=True))
        for i, fn in self._column_converters:
            columns[i] = [None if v is None else fn(v) for v in columns[i]]
        try:
            arrays = [pa.array(col, type=f.type) for col, f in zip(columns, self._arrow_schema, strict=True)]
            return pa.Table.from_arrays(arrays, schema=self._arrow_schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            # e.g. more fractional digits than the decimal's scale: the per-record path names the column
            log.debug("source=%s a page goes record by record: %s", self.config.name, exc)
            return None

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

    def _position(self) -> dict[str, Any]:
        after = None if self.cursor is None else [to_json_value(v) for v in self.cursor]
        return {"mode": self.config.mode, "after": after}

    def _cursor_ts_ms(self) -> int | None:
        """The newest row's timestamp column in ``timestamp`` modes (its commit time), epoch ms; else ``None``.

        The worker stamps the batch's records with it (``threes.source_ts``), so
        freshness is measured from the row's update, not from when it was read.
        """
        if self.ts_col is None or self.cursor is None or self.config.mode == "incrementing":
            return None
        ts = self.cursor[0]
        if not isinstance(ts, dt.datetime):
            return None
        if ts.tzinfo is None:  # sessions run in UTC (utc_sessions): a naive timestamp is UTC
            ts = ts.replace(tzinfo=dt.UTC)
        return int(ts.timestamp() * 1000)

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
        except Exception as exc:  # noqa: BLE001 - a status read never fails the task
            log.debug("source=%s records behind unknown: %s", self.config.name, exc)
            return None

    def _page_statement(self, bound: Any, limit: int | None) -> Any:
        stmt = select(*self.columns)
        if self.split is not None:
            stmt = stmt.where(self.split)
        if self.cursor is not None:
            if len(self.order_cols) == 1:
                c = self.order_cols[0]
                stmt = stmt.where(c > literal(self.cursor[0], c.type))
            else:
                stmt = stmt.where(
                    tuple_(*self.order_cols)
                    > tuple_(*[literal(v, c.type) for v, c in zip(self.cursor, self.order_cols, strict=True)])
                )
        if bound is not None and self.ts_col is not None:  # a bound is read only with a timestamp column
            stmt = stmt.where(self.ts_col < literal(bound, self.ts_col.type))
        return stmt.order_by(*self.order_cols).limit(limit)

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
        to_value, key_fields, order_idx = self.to_value, self.key_fields, self.order_idx
        single_key = key_fields[0] if len(key_fields) == 1 else None
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
                        table = self._columns(rows) if self._arrow_schema is not None else None
                        if table is not None:
                            last = rows[-1]
                            self.cursor = [last[i] for i in order_idx]
                            yield SourceBatch([], self._position(), columns=table, source_ts_ms=self._cursor_ts_ms())
                            continue
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
                        yield SourceBatch(records, self._position(), source_ts_ms=self._cursor_ts_ms())
                    if got < per_query:
                        break
        except DisconnectionError as exc:
            raise RetriableError(f"source {cfg.name!r}: reading {self.where} failed: {_reason(exc)}") from exc
        except SQLAlchemyError as exc:
            message = f"source {cfg.name!r}: reading {self.where} failed: {_reason(exc)}"
            raise _by_meaning(exc, self.dialect, message) from exc
        if scanning:
            # the scan is complete: the next cycle starts a new one; deletes are settled by reconcile
            self.cursor = None
            self._scan_finished = True
            yield SourceBatch([], self._position())

    def _arrow_batches(self, stmt: Any) -> Iterator[SourceBatch]:
        """Pages read as Arrow through ADBC (PostgreSQL), one column-wise batch each, the next read meanwhile.

        A page whose columns do not convert to the value schema's Arrow types (a
        ``numeric`` value with more digits than its scale, ``NaN``) becomes one
        dict per row, so the per-record path reports the column as it always did.

        Raises:
            RetriableError: the connection failed.
            FatalError: the database rejected the query.
        """
        import adbc_driver_manager

        cfg = self.config
        try:
            if self._adbc is None:
                self._adbc = adbc_connect(self.connection.sqlalchemy_url(), self.connection.connect_timeout_s)
            pages = arrow_pages(self._adbc, stmt, cfg.batch_records)
            for raw, table in prefetched((raw, self._conform(raw)) for raw in pages):
                last = _python_rows(raw.slice(raw.num_rows - 1), self._arrow_schema)[0]
                self.cursor = [last[i] for i in self.order_idx]
                if table is not None:
                    yield SourceBatch([], self._position(), columns=table, source_ts_ms=self._cursor_ts_ms())
                    continue
                records: list[Any] = []
                for row in _python_rows(raw, self._arrow_schema):
                    v = self.to_value(row)
                    if v is not None:  # None: a row left out (a NaN in a NOT NULL decimal)
                        records.append(({k: v[k] for k in self.key_fields}, v))
                yield SourceBatch(records, self._position(), source_ts_ms=self._cursor_ts_ms())
        except adbc_driver_manager.Error as exc:
            self._close_adbc()
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if isinstance(exc, (adbc_driver_manager.OperationalError, adbc_driver_manager.InterfaceError)):
                raise RetriableError(f"source {cfg.name!r}: reading {self.where} failed: {reason}") from exc
            raise FatalError(f"source {cfg.name!r}: reading {self.where} failed: {reason}") from exc

    def _conform(self, raw: Any) -> Any:
        """A page from ADBC in the value schema's Arrow types (``None`` when a value does not convert)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        try:
            arrays = []
            for i, f in enumerate(self._arrow_schema):
                col = _storage(raw.column(i))
                arrays.append(col if col.type == f.type else pc.cast(col, f.type))
            return pa.Table.from_arrays(arrays, schema=self._arrow_schema)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            log.debug("source=%s a page goes record by record: %s", self.config.name, exc)
            return None

    def _close_adbc(self) -> None:
        if self._adbc is not None:
            try:
                self._adbc.close()
            except Exception as exc:  # noqa: BLE001 - a broken connection may fail to close
                log.debug("source=%s closing the ADBC connection: %s", self.config.name, exc)
            self._adbc = None

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

    def reconcile(self, state: TopicState) -> Iterator[SourceBatch]:
        """Compare the table's keys with the topic's live keys (as encoded bytes), in bounded memory.

        The table's keys are streamed (server-side cursor) and looked up in
        chunks in the worker's on-disk key set, which marks them seen; the live
        keys never seen are the deleted rows. Memory: one chunk of keys, plus
        the keys of rows the topic lacks (normally none).

        Yields:
            Tombstones for live keys whose row is gone, then the rows the topic lacks.

        Raises:
            RetriableError: the connection failed.
        """
        self._scan_finished = False
        live, encode = state.live, state.encode_key
        # a LiveKeys (the worker's) compares on disk in chunks; a plain dict (tests) in memory
        bounded = hasattr(live, "split")
        seen: set[bytes] = set()
        missing: list[tuple[Any, ...]] = []

        def split(rows: list[tuple[Any, ...]], keys: list[bytes]) -> None:
            if bounded:
                absent = set(live.split(keys))
                missing.extend(r for r, kb in zip(rows, keys, strict=True) if kb in absent)
                return
            for r, kb in zip(rows, keys, strict=True):
                if kb in live:
                    seen.add(kb)
                else:
                    missing.append(r)

        key_sel = select(*self.key_cols)
        try:
            with self.engine.connect() as conn:
                result = conn.execution_options(stream_results=True, yield_per=10_000).execute(key_sel)
                rows: list[tuple[Any, ...]] = []
                keys: list[bytes] = []
                for row in result:
                    rows.append(tuple(row))
                    keys.append(encode(self.to_key(row)))
                    if len(keys) >= _RECONCILE_CHUNK * 10:
                        split(rows, keys)
                        rows, keys = [], []
                split(rows, keys)
                result.close()
                conn.rollback()
                gone_keys = live.unseen() if bounded else (kb for kb in live if kb not in seen)
                yield from tombstone_batches(gone_keys, self.config.batch_records)
                if missing:
                    log.info(
                        "source=%s reconcile: %d row(s) of %s missing from the topic, emitting them",
                        self.name,
                        len(missing),
                        self.where,
                    )
                for i in range(0, len(missing), _RECONCILE_CHUNK):
                    chunk = missing[i : i + _RECONCILE_CHUNK]
                    if len(self.key_cols) == 1:
                        cond = self.key_cols[0].in_([k[0] for k in chunk])
                    else:
                        cond = tuple_(*self.key_cols).in_(chunk)
                    rows = conn.execute(select(*self.columns).where(cond)).fetchall()
                    conn.rollback()
                    records = []
                    for row in rows:
                        v = self.to_value(row)
                        if v is not None:
                            records.append(({k: v[k] for k in self.key_fields}, v))
                    yield SourceBatch(records, None)
        except DisconnectionError as exc:
            raise RetriableError(f"source {self.name!r}: reconciling {self.where} failed: {_reason(exc)}") from exc
        except SQLAlchemyError as exc:
            message = f"source {self.name!r}: reconciling {self.where} failed: {_reason(exc)}"
            raise _by_meaning(exc, self.engine.dialect.name, message) from exc

    # -- errors ---------------------------------------------------------------------------------------

    def describe_key(self, key: Any) -> str:
        """E.g. ``table "public.orders" key {'id': 7}``."""
        shown = dict(key) if isinstance(key, Mapping) else key
        return f"{self.where} key {shown}"

    def describe_field(self, field: str) -> str:
        """E.g. ``column "unit price"``."""
        return f'column "{self.field_to_column.get(field, field)}"'

    def close(self) -> None:
        """Dispose of the engine's pool and close the ADBC (and replication) connections."""
        self._close_adbc()
        if self._cdc is not None:
            self._cdc.close()
        if self.engine is not None:
            self.engine.dispose()


def adbc_available() -> bool:
    """Whether ADBC's PostgreSQL driver is installed (pages are then read as Arrow, see :meth:`RdsSource.poll`)."""
    import importlib.util

    return importlib.util.find_spec("adbc_driver_postgresql") is not None


def _adbc_bindable(sql_type: Any) -> bool:
    """Whether a cursor column's values bind as ADBC parameters exactly (integers, text, dates, date-times)."""
    from sqlalchemy import types as sqltypes

    if isinstance(sql_type, sqltypes.Enum):
        return False
    return isinstance(sql_type, (sqltypes.Integer, sqltypes.String, sqltypes.DateTime, sqltypes.Date))


def _storage(column: Any) -> Any:
    """An extension-typed column (ADBC's ``numeric`` is an opaque text type) as its storage."""
    import pyarrow as pa

    if isinstance(column.type, pa.ExtensionType):
        return pa.chunked_array([c.storage for c in column.chunks], type=column.type.storage_type)
    return column


def _python_rows(raw: Any, schema: Any) -> list[tuple[Any, ...]]:
    """A page from ADBC as row tuples of the values psycopg would return (``numeric`` as ``Decimal``)."""
    import decimal

    import pyarrow as pa

    columns = []
    for i, f in enumerate(schema):
        values = _storage(raw.column(i)).to_pylist()
        if pa.types.is_decimal(f.type):
            values = [None if v is None or isinstance(v, decimal.Decimal) else decimal.Decimal(v) for v in values]
        columns.append(values)
    return list(zip(*columns, strict=True))


def _needed(column: Column[Any] | None, option: str, mode: str) -> Column[Any]:
    """The column an option names, which ``mode`` orders by.

    Raises:
        ConfigError: the option is not set (the config model requires it in that mode).
    """
    if column is None:
        raise ConfigError(f"mode {mode!r} needs `{option}`")
    return column


def _is_integer(sql_type: Any) -> bool:
    from sqlalchemy import types as sqltypes

    return isinstance(sql_type, sqltypes.Integer)


def _by_meaning(exc: BaseException, dialect: str, message: str) -> Exception:
    """The error to raise for a failed read, by what the server said (:mod:`connectors.rds.errors`).

    ``RetriableError`` when the error passes (a lost connection, a serialization
    failure, a shutdown), ``FatalError`` otherwise (a permission, a missing column).
    """
    from connectors.rds.errors import classify

    meaning = classify(exc, dialect)
    suffix = f" (SQLSTATE/code {meaning.code})" if meaning.code else ""
    if meaning.meaning in ("busy", "transient"):
        return RetriableError(message + suffix)
    return FatalError(message + suffix)


def _reason(exc: BaseException) -> str:
    """The database's own message, first line, without SQLAlchemy's statement dump (no values leak)."""
    orig = getattr(exc, "orig", None)
    text_ = str(orig if orig is not None else exc).strip()
    return text_.splitlines()[0] if text_ else type(exc).__name__
