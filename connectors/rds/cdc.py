"""``rds_source`` ``mode: cdc``: PostgreSQL logical replication (``pgoutput``) into the state topic.

**Why the streaming replication protocol.** psycopg 3 does not speak it, so
the stream is read through psycopg2's ``LogicalReplicationConnection`` with the
built-in ``pgoutput`` plugin (nothing to install on the server, available on
RDS/Aurora/Cloud SQL, the plugin Debezium and PostgreSQL's own subscribers
use). The SQL functions (``pg_logical_slot_peek_binary_changes``) were the
alternative: no new driver, but every call decodes the WAL again from the slot's
start and materialises whole transactions server-side, and changes arrive only
when polled. The protocol pushes each transaction as it commits, keeps the
connection alive with status updates, and moves the slot with the standard
feedback message. Values arrive as text and are loaded with psycopg 3's own
loaders for the column's type OID, so a row read from the WAL has exactly the
Python types of a row read by ``SELECT`` (the same converters then apply).

**Start.** On first start (no stored position) the slot is created with an
exported snapshot (``CREATE_REPLICATION_SLOT ... LOGICAL pgoutput
EXPORT_SNAPSHOT``); the table is copied in one ``REPEATABLE READ`` transaction
that adopts it (``SET TRANSACTION SNAPSHOT``), so the copy holds exactly the
transactions committed before the slot's consistent point and the stream then
starts at that point: nothing is missed, nothing is applied twice. Snapshot rows
carry the consistent point as their version. A crash during the copy resumes it
after the last stored key with a fresh snapshot (versioned by the WAL position
read just before it); the slot, which never moved during the copy, then replays
every change since the consistent point, so the topic converges to the same
state (older changes carry older versions, which version guards ignore).

**Stream.** Each committed transaction is one batch (several of
``batch_records`` for a large one), in commit order: inserts and updates are
the new row, deletes a tombstone at once, an update that changed the key a
tombstone of the old key first. Every record carries the ``version`` header =
the transaction's commit LSN (monotonic in commit order, so downstream version
guards work; changes of one key *within* one transaction share it) and
``threes.source_ts`` = its commit time. The position is the commit's end LSN
(where the slot resumes after it).

**Slot progress.** The slot's confirmed flush LSN is moved only in
:meth:`PgChangeStream.commit`, which the worker calls once every record before
a position is acknowledged by Kafka (committed, with ``exactly_once``); WAL is
therefore retained until Kafka holds the changes, and a crash resumes at the
first transaction not acknowledged (at least once).

**Server requirements** (checked at start, one line each): ``wal_level =
logical``; a role with the ``REPLICATION`` attribute (or superuser) and a
``pg_hba.conf`` entry for replication connections; the publication (created as
``threes_<name>`` if absent: needs ownership of the table) publishing the table's
inserts, updates and deletes; a replica identity that carries the key (the
primary key by default; ``REPLICA IDENTITY FULL`` or ``USING INDEX`` when
``key`` is not the primary key, never ``NOTHING``). An update that leaves a large
(TOASTed) value unchanged does not carry it unless the identity is ``FULL``: the
value is then read from the table by key (possibly newer than the change; the
next change of it arrives anyway).

``TRUNCATE`` triggers a reconciliation (tombstones for every key gone). A
column added or dropped mid-stream is mapped by name (a missing nullable column
is null); restart the source to publish the new schema.
"""

from __future__ import annotations

import logging
import select as select_module
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from connectors.api.source import SourceBatch
from connectors.rds import pgoutput
from connectors.rds.cdc_changes import ChangeRows
from connectors.rds.cdc_setup import ReplicationSetup, default_name, first_line
from connectors.rds.pgoutput import lsn_int, lsn_text
from connectors.rds.types import from_json_value, to_json_value
from kernel.exceptions import ConfigError, FatalError, RetriableError, SetupError
from kernel.updates import VERSION_HEADER, encode_version

if TYPE_CHECKING:
    from connectors.rds.source_columnar import ColumnarPages

log = logging.getLogger(__name__)

_IDLE_RETURN_S = 1.0
"""A cycle ends after this long without a message (the worker then commits and sleeps ``poll_interval_s``)."""
_STATUS_INTERVAL_S = 10.0
_HEARTBEAT_S = 5.0


class PgChangeStream(ReplicationSetup, ChangeRows):
    """The ``cdc`` mode of one :class:`~connectors.rds.source.RdsSource` task (see module docstring).

    Args:
        source: the opened source (table reflected, converters built).
    """

    def __init__(self, source: ColumnarPages):
        self.source = source
        cfg = source.config
        self.name = cfg.name
        self.slot = cfg.slot_name or default_name(cfg.name)
        self.publication = cfg.publication_name or default_name(cfg.name)
        self.lsn = 0
        self.snapshot_lsn = 0
        self.snapshot_name: str | None = None
        self.snapshot_after: list[Any] | None = None
        self.snapshotting = False
        self.truncated = False
        self.resnapshot = False
        self._repl: Any = None
        self._cur: Any = None
        self._streaming = False
        self._raw: Any = None
        self._relations: dict[int, Any] = {}
        self._confirmed = 0
        self._last_yield = time.monotonic()

    # -- open -----------------------------------------------------------------------------------------

    def open(self, position: Mapping[str, Any] | None) -> None:
        """Check the server, ensure the publication and slot, and decide where to start.

        Raises:
            SetupError: the server is not configured for logical replication (one line saying what to change).
            ConfigError: the stored position belongs to another mode or slot.
            RetriableError: the database cannot be reached, or the slot is in use by another connection.
        """
        import psycopg

        src = self.source
        if position and position.get("mode") != "cdc":
            raise ConfigError(
                f"source {self.name!r}: the stored position was written in mode {position.get('mode')!r}, "
                f"the config says 'cdc'; reset it with `threes offsets reset --connector {self.name}`"
            )
        self._raw = src.engine.raw_connection()
        pc = self._raw.driver_connection
        try:
            self._check_server(pc)
            self.table_oid = self._check_table(pc)
            self._ensure_publication(pc)
            slot = self._slot_state(pc)
            pc.rollback()
        except psycopg.OperationalError as exc:
            raise RetriableError(f"source {self.name!r}: cannot check the server for cdc: {first_line(exc)}") from exc
        except psycopg.Error as exc:
            raise SetupError(f"source {self.name!r}: cannot prepare cdc: {first_line(exc)}") from exc
        self._connect_replication()
        if position is None or slot is None or slot["wal_status"] == "lost":
            if position is not None:
                log.warning(
                    "source=%s slot %s is %s: the changes since the stored position are gone; taking a new "
                    "snapshot and reconciling deletes",
                    self.name, self.slot, "missing" if slot is None else "invalidated (wal_status lost)",
                )
                self.resnapshot = True
            if slot is not None:
                self._drop_slot(pc)
            self._create_slot()
            self.snapshotting = True
            return
        self.lsn = int(position.get("lsn") or 0)
        snap = position.get("snapshot")
        if snap is not None:  # the copy was interrupted: resume it with a fresh snapshot (see module docstring)
            self.snapshotting = True
            self.snapshot_lsn = self.lsn
            after = snap.get("after")
            self.snapshot_after = [from_json_value(v) for v in after] if after is not None else None
            log.info("source=%s resuming the interrupted snapshot after key %s", self.name, self.snapshot_after)
        log.info("source=%s slot=%s publication=%s streaming from lsn=%s (slot confirmed %s)",
                 self.name, self.slot, self.publication, lsn_text(self.lsn), slot["confirmed_flush_lsn"])

    # -- snapshot -------------------------------------------------------------------------------------

    def _position(self) -> dict[str, Any]:
        snap = None
        if self.snapshotting:
            after = None if self.snapshot_after is None else [to_json_value(v) for v in self.snapshot_after]
            snap = {"after": after}
        return {"mode": "cdc", "slot": self.slot, "lsn": self.lsn, "snapshot": snap}

    def _copy(self) -> Iterator[SourceBatch]:
        """The table, keyset-ordered after the stored key, in one ``REPEATABLE READ`` transaction."""
        import psycopg
        from psycopg import sql

        src = self.source
        pc = self._raw.driver_connection
        pc.rollback()
        pc.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        pc.read_only = True
        try:
            if self.snapshot_name is not None:
                pc.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(self.snapshot_name)))
                version = self.snapshot_lsn
            else:  # a resumed copy: its version is read before its snapshot, so it never overstates
                pc.rollback()
                version = lsn_int(pc.execute("SELECT pg_current_wal_lsn()::text").fetchone()[0])
                pc.rollback()
            src.cursor = self.snapshot_after
            stmt = src._page_statement(None, None)
            compiled = stmt.compile(dialect=src.engine.dialect)
            headers = [(VERSION_HEADER, encode_version(version))]
            rows_total = 0
            with pc.cursor(name="threes_cdc_snapshot") as cur:
                cur.itersize = src.config.batch_records
                cur.execute(str(compiled), compiled.params)
                while True:
                    rows = cur.fetchmany(src.config.batch_records)
                    if not rows:
                        break
                    rows_total += len(rows)
                    last = rows[-1]
                    self.snapshot_after = [last[i] for i in src.order_idx]
                    table = src._columns(rows) if src._arrow_schema is not None else None
                    if table is not None:
                        yield SourceBatch([], self._position(), headers=list(headers), columns=table)
                        continue
                    records = []
                    for row in rows:
                        v = src.to_value(row)
                        if v is None:
                            continue  # a row left out (a NaN in a NOT NULL decimal, see RdsSource)
                        records.append(({k: v[k] for k in src.key_fields}, v))
                    yield SourceBatch(records, self._position(), headers=list(headers))
        finally:
            try:
                pc.rollback()
            finally:
                pc.isolation_level = None
                pc.read_only = None
        self.snapshotting = False
        self.snapshot_name = None
        src.cursor = None
        log.info("source=%s snapshot of %s copied: rows=%d version=%s; streaming from lsn=%s",
                 self.name, self.qualified, rows_total, lsn_text(version), lsn_text(self.lsn))
        yield SourceBatch([], self._position())

    # -- stream ---------------------------------------------------------------------------------------

    def poll(self) -> Iterator[SourceBatch]:
        """The snapshot (first), then committed transactions until the stream is idle for a second.

        Raises:
            RetriableError: a connection was lost (the next cycle reconnects and resumes after the last
                transaction yielded).
            FatalError: the server sent something this source cannot apply.
        """
        import psycopg
        import psycopg2

        try:
            if self._repl is None or self._repl.closed:
                self._connect_replication()
            if self.snapshotting:
                yield from self._copy()
            if not self._streaming:
                self._start()
            yield from self._read()
        except (psycopg2.OperationalError, psycopg2.InterfaceError, psycopg.OperationalError) as exc:
            self._close_replication()
            raise RetriableError(f"source {self.name!r}: change stream interrupted: {first_line(exc)}") from exc
        except psycopg2.Error as exc:
            self._close_replication()
            raise FatalError(f"source {self.name!r}: the change stream failed: {first_line(exc)}") from exc

    def _start(self) -> None:
        self._cur.start_replication(
            slot_name=self.slot,
            decode=False,
            start_lsn=self.lsn,
            options={"proto_version": "1", "publication_names": self.publication},
            status_interval=_STATUS_INTERVAL_S,
        )
        self._streaming = True
        self._relations.clear()
        log.info("source=%s streaming slot %s from lsn=%s", self.name, self.slot, lsn_text(self.lsn))

    def _read(self) -> Iterator[SourceBatch]:
        src = self.source
        cur = self._cur
        size = src.config.batch_records
        records: list[Any] = []
        begin: pgoutput.Begin | None = None
        headers: list[tuple[str, bytes]] = []  # the version: the transaction's commit LSN
        parted = False  # parts of the open transaction were yielded (SourceBatch.continues)
        idle_since = time.monotonic()
        while True:
            msg = cur.read_message()
            if msg is None:
                now = time.monotonic()
                if begin is None and now - idle_since >= _IDLE_RETURN_S:
                    return
                select_module.select([cur], [], [], 0.5)
                continue
            idle_since = time.monotonic()
            try:
                parsed = pgoutput.parse(msg.payload)
            except pgoutput.ProtocolError as exc:
                where = f"source {self.name!r}: unreadable change at lsn {lsn_text(msg.data_start)}"
                raise FatalError(f"{where}: {exc}") from exc
            if isinstance(parsed, pgoutput.Begin):
                begin = parsed
                records = []
                headers = [(VERSION_HEADER, encode_version(begin.final_lsn))]
            elif isinstance(parsed, pgoutput.Change):
                rel = self._relations.get(parsed.relid)
                if rel is None or begin is None:
                    continue  # another table of a shared publication
                self._apply(rel, parsed, records)
                if len(records) >= size:
                    # a large transaction: parts of it before its end; the position moves only at its commit
                    yield SourceBatch(records, None, headers=headers, source_ts_ms=begin.commit_ts_ms, continues=True)
                    records, parted = [], True
            elif isinstance(parsed, pgoutput.Commit):
                self.lsn = parsed.end_lsn
                # after parts of it, the commit's position comes even with no record left (it ends the parts)
                if begin is not None and (records or parted or time.monotonic() - self._last_yield > _HEARTBEAT_S):
                    self._last_yield = time.monotonic()
                    yield SourceBatch(records, self._position(), headers=headers, source_ts_ms=parsed.commit_ts_ms)
                begin = None
                records, parted = [], False
            elif isinstance(parsed, pgoutput.Relation):
                self._relation(parsed)
            elif isinstance(parsed, pgoutput.Truncate):
                if self.table_oid in parsed.relids:
                    log.warning("source=%s table %s truncated: reconciling", self.name, self.qualified)
                    self.truncated = True

    # -- commit ---------------------------------------------------------------------------------------

    def commit(self, position: Mapping[str, Any]) -> None:
        """Move the slot's confirmed flush LSN to ``position`` (acknowledged by Kafka); snapshot positions never."""
        import psycopg2

        if position.get("snapshot") is not None or not self._streaming or self._cur is None:
            return
        lsn = int(position.get("lsn") or 0)
        if lsn <= self._confirmed:
            return
        try:
            self._cur.send_feedback(flush_lsn=lsn, force=True)
        except psycopg2.Error as exc:  # the next cycle reconnects; the slot keeps the older LSN (replayed)
            log.warning("source=%s could not confirm lsn=%s to the slot: %s", self.name, lsn_text(lsn), exc)
            return
        self._confirmed = lsn
        log.debug("source=%s slot %s confirmed lsn=%s", self.name, self.slot, lsn_text(lsn))

    def _close_replication(self) -> None:
        self._streaming = False
        if self._repl is not None:
            try:
                self._repl.close()
            except Exception as exc:  # a broken connection may fail to close
                log.debug("source=%s closing the replication connection: %s", self.name, exc)
        self._repl = None
        self._cur = None

    def close(self) -> None:
        """Close the replication connection (the slot stays: the next start resumes from it)."""
        self._close_replication()
        if self._raw is not None:
            try:
                self._raw.close()
            except Exception as exc:
                log.debug("source=%s closing the connection: %s", self.name, exc)
            self._raw = None

