"""How RdsSource reads: the commit-safe upper bound of a timestamp cursor, and streamed pages.

**Commit-safe watermark.** A naive poller that reads ``ts > last`` up to "now"
loses a row whose transaction started (``updated_at = now()`` is the
*transaction start* on PostgreSQL) before the poll and commits after it: the
row appears behind the watermark. RdsSource reads only rows with ``ts < bound``
where ``bound = min(db_now - commit_delay_s, start of the oldest open
transaction)``. On PostgreSQL the second term comes from
``pg_stat_activity.xact_start`` of the database's client backends (visible for
the connector's role, or any role with ``pg_read_all_stats``):

* ``hold_for_transactions: writers`` (default) counts the transactions that
  already hold a transaction id, i.e. have written: a writer's rows carry
  ``now()`` >= its start, so however long it stays open, its rows are read
  after it commits. A transaction that reads for longer than
  ``commit_delay_s`` *before its first write* is the one case left to the delay
  (PostgreSQL assigns the transaction id lazily, at the first write).
* ``all`` counts every open transaction (exact, but a long report or
  ``pg_dump`` then holds the watermark for its whole length).
* ``none`` relies on ``commit_delay_s`` alone (the bound other databases get).

**MySQL/MariaDB** have no snapshot horizon to read, so the bound is the delay
alone: a row is read once its timestamp is ``commit_delay_s`` older than the
server's clock, and a transaction that commits within ``commit_delay_s`` of
writing its rows loses none (Kafka Connect JDBC's ``timestamp.delay.interval.ms``).
The clock is the one the column is written in: ``NOW(6)`` in the server's
default time zone (``@@global.time_zone``, what ``DEFAULT CURRENT_TIMESTAMP``
writes) for a ``DATETIME`` column, UTC for a ``TIMESTAMP`` column (an instant,
read in the connectors' UTC sessions, see :func:`utc_sessions`).

The same idea as transactional-outbox pollers that read only below
``pg_snapshot_xmin(pg_current_snapshot())``, expressed as a time bound because
the cursor is a timestamp column.

**Streaming.** Each query reads at most :data:`BATCHES_PER_QUERY` batches
through a server-side cursor, then the caller continues after the last key with
a new query: a table scan holds no snapshot for its whole length, and a crash
resumes after the last stored key.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from typing import Any

from sqlalchemy import DateTime, column, event, func, select, table
from sqlalchemy.exc import DBAPIError

MYSQL_DIALECTS = frozenset({"mysql", "mariadb"})

BATCHES_PER_QUERY = 50
"""Rows of one query (one transaction) = ``batch_records`` * this."""

_pg_activity = table(
    "pg_stat_activity",
    column("xact_start", DateTime(timezone=True)),
    column("pid"),
    column("datname"),
    column("backend_type"),
    column("backend_xid"),
)


def utc_sessions(engine: Any, lock_wait_s: float | None = None) -> None:
    """MySQL/MariaDB: start every connection of ``engine`` with ``SET time_zone = '+00:00'``.

    A ``TIMESTAMP`` column is an instant that the server converts to the
    session's time zone on every read and write; in UTC sessions the naive
    values the driver returns (and takes) are UTC, whatever the server's default
    zone, so they map exactly to Avro ``timestamp-micros``. ``DATETIME`` values
    are never converted. A no-op for other dialects.

    Args:
        engine: a SQLAlchemy engine, before its first connection.
        lock_wait_s: also bound waits for row locks (InnoDB) and table/metadata
            locks to this many seconds (rounded up to whole seconds, at least 1),
            once per connection instead of once per transaction.
    """
    if engine.dialect.name not in MYSQL_DIALECTS:
        return
    statements = ["SET time_zone = '+00:00'"]
    if lock_wait_s is not None:
        wait = max(1, math.ceil(lock_wait_s))
        statements.append(f"SET SESSION innodb_lock_wait_timeout = {wait}, lock_wait_timeout = {wait}")

    @event.listens_for(engine, "connect")
    def _session(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        try:
            for statement in statements:
                cur.execute(statement)
        finally:
            cur.close()


def _mysql_now(conn: Any, server_zone: bool) -> dt.datetime:
    """``NOW(6)`` in UTC, or in the server's default time zone when ``server_zone``."""
    if not server_zone:
        return conn.exec_driver_sql("SELECT UTC_TIMESTAMP(6)").scalar_one()
    # the session is UTC (utc_sessions); the writers' DATETIME clock is the server default zone
    conn.exec_driver_sql("SET time_zone = DEFAULT")
    try:
        return conn.exec_driver_sql("SELECT NOW(6)").scalar_one()
    finally:
        conn.exec_driver_sql("SET time_zone = '+00:00'")


def commit_safe_bound(
    conn: Any,
    dialect: str,
    commit_delay_s: float,
    hold_for_transactions: str = "writers",
    *,
    server_zone: bool = True,
) -> tuple[Any, Any, Any]:
    """The exclusive upper bound for a timestamp cursor, in the database's clock (see module docstring).

    Args:
        conn: a SQLAlchemy connection (its transaction is left open; the caller ends it).
        dialect: the engine's dialect name (``postgresql``, ``mysql``, ``sqlite``...).
        commit_delay_s: seconds a row must be old before it is read.
        hold_for_transactions: ``writers``, ``all`` or ``none`` (PostgreSQL only).
        server_zone: MySQL/MariaDB: the cursor column is a ``DATETIME`` written
            in the server's default time zone (``False``: a ``TIMESTAMP``, read in UTC).

    Returns:
        ``(bound, oldest, now)``: the bound; the start of the oldest open
        transaction that holds it back (``None`` if none, or not PostgreSQL);
        the database's current time.
    """
    delay = dt.timedelta(seconds=commit_delay_s)
    if dialect == "postgresql":
        now = conn.execute(select(func.statement_timestamp())).scalar_one()
        oldest = None
        if hold_for_transactions != "none":
            act = _pg_activity.c
            conditions = [
                act.datname == func.current_database(),
                act.pid != func.pg_backend_pid(),
                act.xact_start.is_not(None),
                act.backend_type == "client backend",
            ]
            if hold_for_transactions == "writers":
                conditions.append(act.backend_xid.is_not(None))
            oldest = conn.execute(select(func.min(act.xact_start)).where(*conditions)).scalar_one()
        bound = now - delay
        if oldest is not None and oldest < bound:
            return oldest, oldest, now
        return bound, oldest, now
    if dialect in MYSQL_DIALECTS:
        now = _mysql_now(conn, server_zone)
        return now - delay, None, now
    now = conn.execute(select(func.current_timestamp(type_=DateTime))).scalar_one()
    if isinstance(now, str):  # SQLite without type processing
        now = dt.datetime.fromisoformat(now)
    return now - delay, None, now


def stream_rows(conn: Any, stmt: Any, dialect: Any, size: int) -> Iterator[list[Any]]:
    """Rows of a Core statement in lists of ``size``, through a server-side cursor; the transaction ends after.

    The SQL is built by SQLAlchemy (quoted identifiers, bound parameters). On
    PostgreSQL it runs on a psycopg named cursor directly: psycopg already
    returns the exact Python types (Decimal, aware datetime), and skipping
    SQLAlchemy's ``Row`` layer halves the per-row cost. Other dialects stream
    through SQLAlchemy (``stream_results``), whose result processing SQLite
    needs for datetimes and decimals.

    Args:
        conn: a SQLAlchemy connection.
        stmt: a Core ``Select``.
        dialect: the engine's dialect object.
        size: rows per list.

    Raises:
        sqlalchemy.exc.DBAPIError: the same subclasses as through SQLAlchemy
            (``OperationalError`` for a lost connection...), without parameters.
    """
    if dialect.name != "postgresql":
        try:
            result = conn.execution_options(stream_results=True).execute(stmt)
            yield from result.partitions(size)
        finally:
            conn.rollback()
        return
    compiled = stmt.compile(dialect=dialect)
    dbapi_conn = conn.connection.driver_connection
    error_class = dialect.loaded_dbapi.Error
    try:
        with dbapi_conn.cursor(name="threes_source") as cur:
            cur.itersize = size
            cur.execute(str(compiled), compiled.params)
            while True:
                rows = cur.fetchmany(size)
                if not rows:
                    break
                yield rows
    except error_class as exc:
        raise DBAPIError.instance(str(compiled), None, exc, error_class, hide_parameters=True) from exc
    finally:
        try:
            dbapi_conn.rollback()
        except error_class as exc:
            # a lost connection fails the rollback too: raise it as SQLAlchemy's error (retriable), never
            # as the driver's own, which would replace the error being raised and escape the caller's handling
            raise DBAPIError.instance("ROLLBACK", None, exc, error_class, hide_parameters=True) from exc


# -- Arrow pages (PostgreSQL through ADBC) -------------------------------------------------------------------


def adbc_connect(url: Any, connect_timeout_s: float) -> Any:
    """An ADBC PostgreSQL connection (autocommit: each page query is its own transaction) to a SQLAlchemy URL.

    The libpq connection string is the one SQLAlchemy's psycopg dialect would use
    (host, port, user, password, database and the URL's query options).

    Raises:
        ImportError: ``adbc-driver-postgresql`` is not installed.
        adbc_driver_manager.Error: the connection failed.
    """
    import adbc_driver_postgresql.dbapi as adbc
    import psycopg
    from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

    _args, kwargs = PGDialect_psycopg().create_connect_args(url)
    kwargs.setdefault("connect_timeout", int(max(1, connect_timeout_s)))
    return adbc.connect(psycopg.conninfo.make_conninfo(**kwargs), autocommit=True)


_DOLLAR_DIALECT: Any = None


def _dollar_dialect() -> Any:
    """PostgreSQL with ``$1`` placeholders (libpq's, which ADBC binds)."""
    global _DOLLAR_DIALECT
    if _DOLLAR_DIALECT is None:
        from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

        _DOLLAR_DIALECT = PGDialect_psycopg(paramstyle="numeric_dollar")
    return _DOLLAR_DIALECT


def arrow_pages(adbc_conn: Any, stmt: Any, size: int) -> Iterator[Any]:
    """Rows of a Core statement as Arrow tables of ``size`` rows (the last one shorter), read through ADBC.

    ADBC's PostgreSQL driver reads the result with ``COPY ... TO STDOUT (FORMAT
    binary)`` straight into Arrow columns: no Python object per value. Types
    are the driver's (``numeric`` arrives as text in an opaque extension type);
    the caller casts them.

    Args:
        adbc_conn: from :func:`adbc_connect`.
        stmt: a Core ``Select`` (compiled with ``$n`` placeholders, values bound by ADBC).
        size: rows per table.

    Raises:
        adbc_driver_manager.Error: the query failed (``OperationalError`` for a lost connection).
    """
    import pyarrow as pa

    compiled = stmt.compile(dialect=_dollar_dialect())
    params = tuple(compiled.params[name] for name in compiled.positiontup or ())
    with adbc_conn.cursor() as cur:
        cur.execute(str(compiled), params or None)
        reader = cur.fetch_record_batch()
        pending: list[Any] = []
        rows = 0
        for batch in reader:
            pending.append(batch)
            rows += batch.num_rows
            while rows >= size:
                table = pa.Table.from_batches(pending)
                yield table.slice(0, size)
                rest = table.slice(size)
                pending, rows = rest.to_batches(), rest.num_rows
        if rows:
            yield pa.Table.from_batches(pending)


def prefetched(items: Iterator[Any], depth: int = 2) -> Iterator[Any]:
    """Iterate ``items`` in a background thread, at most ``depth`` items ahead of the caller.

    Reading a page through ADBC (libpq, Arrow's C++ reader) releases the GIL,
    so the next page is read while the caller encodes and produces this one.
    An error of ``items`` is raised to the caller, at the item where it occurred.
    When the caller stops early, the thread stops after the item it is reading
    and closes ``items`` (which closes its cursor) before this generator returns.

    Args:
        items: a generator; it runs only in the background thread.
        depth: items read ahead (each is a page: bounds memory).
    """
    import queue
    import threading

    done = object()
    handoff: queue.Queue[tuple[Any, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any, error: BaseException | None = None) -> bool:
        while not stop.is_set():
            try:
                handoff.put((item, error), timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(done)
        except BaseException as exc:  # handed to the caller, raised there
            put(done, exc)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=run, name="threes-rds-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = handoff.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()
