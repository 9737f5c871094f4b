"""``rds_source`` ``mode: cdc`` on MySQL/MariaDB: the row-based binary log into the state topic.

**Library.** ``mysql-replication`` (``pymysqlreplication.BinLogStreamReader``) registers as a replica and
decodes the row events. Its table maps name the columns only with ``binlog_row_metadata = FULL``, so that is
required, like ``binlog_format = ROW`` and ``binlog_row_image = FULL``.

**Positions: binlog file and offset.** The position stored in the offsets topic is the binlog file and the
offset just past the last transaction delivered (``{"mode": "cdc", "file", "pos", "gtid", "snapshot"}``);
``gtid`` is that transaction's GTID (MariaDB ``domain-server-sequence``, or MySQL ``uuid:n``), kept for
operators, not used to resume. Resuming by GTID was not reliable with the library: after a dropped connection
it reconnects from the GTID state it was *started* with and replays every transaction since, and with
``is_mariadb`` but no GTID it ignores the file and offset; file/offset resumes are exact in both cases (its
own reconnects resume from the last event read). A failover to another server therefore needs a new snapshot
(``threes offsets reset``), as with any file/offset replica.

**Snapshot then stream.** On first start the table is copied in one ``START TRANSACTION WITH CONSISTENT
SNAPSHOT`` (``REPEATABLE READ``); MariaDB reports the binlog position that snapshot saw
(``Binlog_snapshot_file``/``Binlog_snapshot_position``, read inside it), MySQL, which has no such status,
under a brief ``FLUSH TABLES WITH READ LOCK`` (Debezium's method; ``RELOAD`` privilege). The stream then
starts at exactly that position: nothing is missed, nothing applied twice. A crash during the copy resumes it
after the last stored key with a fresh snapshot, and the stream still starts at the first snapshot's position,
so the topic converges (older changes carry older versions).

**Stream.** Each committed transaction (an ``Xid`` or ``COMMIT``) is one batch (several of ``batch_records`` for
a large one, the position moving only at its end): inserts and updates are the new row, deletes a tombstone at
once, an update that changed the key a tombstone of the old key first. Every record carries the ``version``
header = ``file number << 32 | offset`` just past its transaction's first event (monotonic in commit order) and
``threes.source_ts`` = the transaction's time. With ``exactly_once`` a transaction is in one Kafka transaction.

**Purged binlog.** A stored file the server no longer lists (``PURGE BINARY LOGS``, ``binlog_expire_logs_seconds``)
means changes are gone: ``binlog_purged: stop`` (default) refuses to start in one line; ``snapshot`` takes a new
snapshot and reconciles (tombstones for the keys gone). Never a silent gap.

**DDL** is schema evolution (see :mod:`connectors.rds.binlog_rows`). ``TRUNCATE`` of the table triggers a
reconciliation: a tombstone for every key gone (the binlog logs it as a statement, without rows).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from connectors.api.source import SourceBatch
from connectors.rds.binlog_rows import BinlogRows
from connectors.rds.binlog_setup import (
    begin_snapshot,
    default_server_id,
    read_server,
    server_problems,
    truncates,
    version_of,
)
from connectors.rds.cdc_setup import first_line
from connectors.rds.types import from_json_value, to_json_value
from kernel.exceptions import ConfigError, FatalError, RetriableError, SetupError
from kernel.updates import VERSION_HEADER, encode_version

if TYPE_CHECKING:
    from connectors.rds.source_columnar import ColumnarPages

log = logging.getLogger(__name__)

_IDLE_RETURN_S = 1.0
"""A cycle ends after this long without a change of the table (the worker then commits and sleeps
``poll_interval_s``): other tables' transactions keep a shared binlog busy, so it is never idle itself."""
_CYCLE_MAX_S = 10.0
"""A cycle also ends at the first transaction boundary after this long (a table that never stops changing)."""
_HEARTBEAT_S = 0.5
_HEARTBEAT_POSITION_S = 5.0
_PURGED = 1236  # ER_MASTER_FATAL_ERROR_READING_BINLOG: the requested file or position is gone
_IN_TRANSACTION = ("BEGIN", "SAVEPOINT", "ROLLBACK TO", "RELEASE SAVEPOINT", "XA ")


def _cycle_done(started: float, idle_since: float, reached: bool) -> bool:
    """Whether a cycle ends: caught up with the binlog's end as of its start, then idle or long enough."""
    now = time.monotonic()
    return reached and (now - idle_since >= _IDLE_RETURN_S or now - started >= _CYCLE_MAX_S)


class MysqlChangeStream(BinlogRows):
    """The ``cdc`` mode of one :class:`~connectors.rds.source.RdsSource` task on MySQL/MariaDB.

    Args:
        source: the opened source (table reflected, converters built).
    """

    def __init__(self, source: ColumnarPages):
        self.source = source
        cfg = source.config
        self.name = cfg.name
        self.table = cfg.table or ""
        self.database = cfg.schema_name or ""
        self.server_id = cfg.binlog_server_id or default_server_id(cfg.name)
        self.log_file: str | None = None
        self.log_pos = 0
        self.gtid: str | None = None
        self.snapshot_after: list[Any] | None = None
        self.snapshotting = False
        self.truncated = False
        self.resnapshot = False
        self._reader: Any = None
        self._raw_connection: Any = None
        self._shapes = {}
        self._last_yield = time.monotonic()

    # -- open -----------------------------------------------------------------------------------------

    def open(self, position: Mapping[str, Any] | None) -> None:
        """Check the server and decide where to start (a snapshot, or the stored binlog position).

        Raises:
            SetupError: the server is not configured for binlog change capture, or the stored position was
                purged with ``binlog_purged: stop`` (one line saying what to do).
            ConfigError: the stored position belongs to another mode.
            RetriableError: the database cannot be reached.
        """
        import pymysql

        if position and (position.get("mode") != "cdc" or "file" not in position):
            raise ConfigError(
                f"source {self.name!r}: the stored position was written in mode {position.get('mode')!r} "
                f"or by another database, the config says 'cdc'; reset it with "
                f"`threes offsets reset --connector {self.name}`"
            )
        self._raw_connection = self.source.engine.raw_connection()
        try:
            cur = self._raw_connection.cursor()
            variables, grants, user = read_server(cur)
            problems = server_problems(variables, grants, user=user, source=self.name)
            if problems:
                raise SetupError("; ".join(problems))
            if not self.database:
                cur.execute("SELECT DATABASE()")
                self.database = str(cur.fetchone()[0])
            cur.execute("SHOW BINARY LOGS")
            files = {str(r[0]) for r in cur.fetchall()}
            cur.close()
            self._raw_connection.rollback()
        except pymysql.err.OperationalError as exc:
            raise RetriableError(f"source {self.name!r}: cannot check the server for cdc: {first_line(exc)}") from exc
        except pymysql.err.Error as exc:
            raise SetupError(f"source {self.name!r}: cannot prepare cdc: {first_line(exc)}") from exc
        if position is None:
            self.snapshotting = True
            return
        self.log_file, self.log_pos, self.gtid = str(position["file"]), int(position["pos"]), position.get("gtid")
        if self.log_file not in files:
            self._purged(f"binlog file {self.log_file} is no longer on the server (purged)")
            return
        snap = position.get("snapshot")
        if snap is not None:  # the copy was interrupted: resume it with a fresh snapshot (see module docstring)
            self.snapshotting = True
            after = snap.get("after")
            self.snapshot_after = [from_json_value(v) for v in after] if after is not None else None
            log.info("source=%s resuming the interrupted snapshot after key %s", self.name, self.snapshot_after)
        log.info(
            "source=%s streaming %s.%s from %s:%d (server_id %d)",
            self.name,
            self.database,
            self.table,
            self.log_file,
            self.log_pos,
            self.server_id,
        )

    def _purged(self, what: str) -> None:
        """The stored position is gone: a new snapshot (``binlog_purged: snapshot``) or a one-line refusal."""
        if self.source.config.binlog_purged != "snapshot":
            raise SetupError(
                f"source {self.name!r}: {what}: the changes since the stored position are lost; set "
                f"binlog_purged: snapshot to take a new snapshot (and tombstone the keys gone), or run "
                f"`threes offsets reset --connector {self.name}`; keep binlog_expire_logs_seconds above the "
                "longest stop of the source"
            )
        log.warning(
            "source=%s %s: the changes since the stored position are gone; taking a new snapshot and "
            "reconciling deletes (binlog_purged: snapshot)",
            self.name,
            what,
        )
        self._close_reader()
        self.log_file, self.log_pos, self.snapshot_after = None, 0, None
        self.snapshotting = self.resnapshot = True

    # -- snapshot -------------------------------------------------------------------------------------

    def _position(self) -> dict[str, Any]:
        snap = None
        if self.snapshotting:
            after = None if self.snapshot_after is None else [to_json_value(v) for v in self.snapshot_after]
            snap = {"after": after}
        return {"mode": "cdc", "file": self.log_file, "pos": self.log_pos, "gtid": self.gtid, "snapshot": snap}

    def _copy(self) -> Iterator[SourceBatch]:
        """The table, keyset-ordered after the stored key, in one consistent-snapshot transaction."""
        src = self.source
        rows_total = 0
        with src.engine.connect() as conn:
            snap_file, snap_pos = begin_snapshot(conn)
            if self.log_file is None:  # the first snapshot: the stream starts where it stands
                self.log_file, self.log_pos = snap_file, snap_pos
            headers = [(VERSION_HEADER, encode_version(version_of(snap_file, snap_pos)))]
            src.cursor = self.snapshot_after
            result = conn.execution_options(stream_results=True).execute(src._page_statement(None, None))
            for rows in result.partitions(src.config.batch_records):
                rows_total += len(rows)
                self.snapshot_after = [rows[-1][i] for i in src.order_idx]
                records = []
                for row in rows:
                    v = src.to_value(row)
                    if v is not None:  # None: a row left out (see RdsSource)
                        records.append(({k: v[k] for k in src.key_fields}, v))
                yield SourceBatch(records, self._position(), headers=list(headers))
            conn.rollback()
        self.snapshotting = False
        src.cursor = None
        log.info(
            "source=%s snapshot of %s.%s copied: rows=%d at %s:%d; streaming from %s:%d",
            self.name,
            self.database,
            self.table,
            rows_total,
            snap_file,
            snap_pos,
            self.log_file,
            self.log_pos,
        )
        yield SourceBatch([], self._position())

    # -- stream ---------------------------------------------------------------------------------------

    def poll(self) -> Iterator[SourceBatch]:
        """The snapshot (first), then committed transactions until the binlog is idle for a second.

        Raises:
            RetriableError: a connection was lost (the next cycle resumes after the last transaction yielded).
            SetupError: the stored position was purged and ``binlog_purged`` is ``stop``.
            FatalError: the server sent something this source cannot apply.
        """
        import pymysql
        from sqlalchemy.exc import DBAPIError

        try:
            if self.snapshotting:
                yield from self._copy()
            yield from self._read()
        except pymysql.err.OperationalError as exc:
            self._close_reader()
            self._close_control()  # the next cycle opens a new one
            if exc.args and exc.args[0] == _PURGED:
                self._purged(f"the server cannot send {self.log_file}:{self.log_pos} ({first_line(exc)})")
                raise RetriableError(f"source {self.name!r}: binlog position purged: taking a new snapshot") from exc
            raise RetriableError(f"source {self.name!r}: change stream interrupted: {first_line(exc)}") from exc
        except DBAPIError as exc:
            self._close_reader()
            raise RetriableError(f"source {self.name!r}: snapshot interrupted: {first_line(exc.orig or exc)}") from exc
        except pymysql.err.Error as exc:
            self._close_reader()
            raise FatalError(f"source {self.name!r}: the change stream failed: {first_line(exc)}") from exc

    def _connect(self) -> Any:
        from pymysqlreplication import BinLogStreamReader
        from pymysqlreplication.event import (
            GtidEvent,
            HeartbeatLogEvent,
            MariadbGtidEvent,
            QueryEvent,
            RotateEvent,
            XidEvent,
        )
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent
        from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql

        src = self.source
        _args, settings = MySQLDialect_pymysql().create_connect_args(src.connection.sqlalchemy_url())
        settings.pop("database", None)
        settings.update(connect_timeout=int(max(1, src.connection.connect_timeout_s)), read_timeout=30)
        self._reader = BinLogStreamReader(
            connection_settings=settings,
            server_id=self.server_id,
            log_file=self.log_file,
            log_pos=self.log_pos,
            resume_stream=True,
            blocking=True,
            slave_heartbeat=_HEARTBEAT_S,
            only_schemas=[self.database],
            only_tables=[self.table],
            only_events=[
                GtidEvent,
                MariadbGtidEvent,
                QueryEvent,
                XidEvent,
                RotateEvent,
                HeartbeatLogEvent,
                WriteRowsEvent,
                UpdateRowsEvent,
                DeleteRowsEvent,
            ],
            enable_logging=False,
        )
        log.info("source=%s reading the binlog from %s:%d", self.name, self.log_file, self.log_pos)
        return self._reader

    def _read(self) -> Iterator[SourceBatch]:
        from pymysqlreplication.event import GtidEvent, HeartbeatLogEvent, MariadbGtidEvent, QueryEvent, XidEvent
        from pymysqlreplication.row_event import RowsEvent

        reader = self._reader or self._connect()
        size = self.source.config.batch_records
        records: list[Any] = []
        headers: list[tuple[str, bytes]] = []
        ts_ms: int | None = None
        in_group = parted = False
        started = idle_since = time.monotonic()
        target = self._binlog_end()
        for event in reader:
            if isinstance(event, HeartbeatLogEvent):  # the binlog is idle: its end is reached
                target = 0
                if not in_group and _cycle_done(started, idle_since, True):
                    return
                continue
            query = event.query.strip() if isinstance(event, QueryEvent) else None
            if isinstance(event, (GtidEvent, MariadbGtidEvent)) or (query and query.upper() == "BEGIN"):
                if not in_group:
                    in_group, records, ts_ms = True, [], event.timestamp * 1000
                    headers = [(VERSION_HEADER, encode_version(version_of(reader.log_file, reader.log_pos)))]
                if not isinstance(event, QueryEvent):
                    self.gtid = str(event.gtid)
                continue
            if isinstance(event, RowsEvent):
                if event.schema == self.database and event.table == self.table:
                    idle_since = time.monotonic()
                    self._apply(event, records)
                    if len(records) >= size:  # a large transaction: parts before its end; the position waits
                        yield SourceBatch(records, None, headers=headers, source_ts_ms=ts_ms, continues=True)
                        records, parted = [], True
                continue
            if query is not None and query.upper().startswith(_IN_TRANSACTION):
                continue
            if query is not None:
                self._statement(event, query)
            elif not isinstance(event, XidEvent):
                continue  # a rotation: positions follow the reader
            self.log_file, self.log_pos = reader.log_file, reader.log_pos
            if records or parted or time.monotonic() - self._last_yield > _HEARTBEAT_POSITION_S:
                self._last_yield = time.monotonic()
                yield SourceBatch(records, self._position(), headers=headers, source_ts_ms=ts_ms)
            in_group, records, parted = False, [], False
            reached = version_of(self.log_file, self.log_pos) >= target
            if _cycle_done(started, idle_since, reached):  # at a transaction boundary: the next cycle goes on
                return

    def _binlog_end(self) -> int:
        """The version (:func:`version_of`) of the server's binlog end now: a cycle reads at least that far."""
        cur = self._control().cursor()
        try:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
        finally:
            cur.close()
            self._control().rollback()
        return version_of(str(row[0]), int(row[1])) if row else 0

    def _statement(self, event: Any, query: str) -> None:
        """A statement ending an event group (``COMMIT``, DDL): a ``TRUNCATE`` of the table reconciles."""
        schema = event.schema.decode() if isinstance(event.schema, bytes) else event.schema
        if truncates(query, schema, self.database, self.table):
            log.warning("source=%s table %s.%s truncated: reconciling", self.name, self.database, self.table)
            self.truncated = True

    # -- commit ---------------------------------------------------------------------------------------

    def commit(self, position: Mapping[str, Any]) -> None:
        """Nothing to confirm on the server: the binlog position lives in the offsets topic only."""

    def _close_reader(self) -> None:
        if self._reader is not None:
            try:
                self._reader.close()
            except Exception as exc:  # a broken connection may fail to close
                log.debug("source=%s closing the binlog reader: %s", self.name, exc)
        self._reader = None

    def close(self) -> None:
        """Close the binlog reader and the control connection."""
        self._close_reader()
        self._close_control()

    def _close_control(self) -> None:
        if self._raw_connection is not None:
            try:
                self._raw_connection.close()
            except Exception as exc:
                log.debug("source=%s closing the connection: %s", self.name, exc)
            self._raw_connection = None
