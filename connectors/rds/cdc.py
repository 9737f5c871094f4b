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
import re
import select as select_module
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from connectors.api.source import SourceBatch
from connectors.rds import pgoutput
from connectors.rds.pgoutput import UNCHANGED, lsn_int, lsn_text
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


def default_name(connector: str) -> str:
    """``threes_<connector>`` folded to what a slot name may hold (``[a-z0-9_]``, at most 63 characters)."""
    return ("threes_" + re.sub(r"[^a-z0-9_]", "_", connector.lower()))[:63]


def server_problems(
    *, wal_level: str, superuser: bool, replication: bool, role: str, source: str
) -> list[str]:
    """What keeps a PostgreSQL server from serving ``mode: cdc`` (empty when nothing).

    Args:
        wal_level: ``current_setting('wal_level')``.
        superuser: the connector's role is a superuser.
        replication: the role has the ``REPLICATION`` attribute.
        role: the role's name, for the message.
        source: the connector's name, for the message.

    Returns:
        One line per problem, each saying what to change.
    """
    problems = []
    if wal_level != "logical":
        problems.append(
            f"source {source!r}: mode cdc needs wal_level = logical on the PostgreSQL server (it is {wal_level!r}); "
            "set it in postgresql.conf (on RDS: rds.logical_replication = 1 in the parameter group) and restart "
            "the server"
        )
    if not (superuser or replication):
        problems.append(
            f"source {source!r}: mode cdc needs the REPLICATION attribute for role {role!r}; run "
            f"ALTER ROLE \"{role}\" REPLICATION (on RDS: GRANT rds_replication TO \"{role}\")"
        )
    return problems


def identity_problem(
    *, ident: str, identity_columns: list[str], key_columns: list[str], table: str, source: str
) -> str | None:
    """Whether deletes of ``table`` carry its key (a message when they do not).

    Args:
        ident: ``pg_class.relreplident``: ``d`` default, ``f`` full, ``i`` index, ``n`` nothing.
        identity_columns: the columns of the replica identity (primary key or index; empty when none).
        key_columns: the connector's key columns.
        table: the table's name, for the message.
        source: the connector's name, for the message.
    """
    if ident == "f":
        return None
    if ident != "n" and identity_columns and set(key_columns) <= set(identity_columns):
        return None
    what = {"n": "REPLICA IDENTITY NOTHING", "d": "its primary key", "i": "its replica identity index"}[ident]
    if ident == "d" and not identity_columns:
        what = "no primary key"
    return (
        f"source {source!r}: deletes of table {table} would not carry the key {key_columns} ({what}); run "
        f"ALTER TABLE {table} REPLICA IDENTITY FULL (or USING INDEX on a unique index of the key)"
    )


class PgChangeStream:
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

    def conninfo(self) -> str:
        """The libpq connection string SQLAlchemy's psycopg dialect would use (TLS options included)."""
        import psycopg
        from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

        _args, kwargs = PGDialect_psycopg().create_connect_args(self.source.connection.sqlalchemy_url())
        kwargs.setdefault("connect_timeout", int(max(1, self.source.connection.connect_timeout_s)))
        return psycopg.conninfo.make_conninfo(**kwargs)

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
            raise RetriableError(f"source {self.name!r}: cannot check the server for cdc: {_first(exc)}") from exc
        except psycopg.Error as exc:
            raise SetupError(f"source {self.name!r}: cannot prepare cdc: {_first(exc)}") from exc
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

    def _check_server(self, pc: Any) -> None:
        wal_level, role, superuser, replication = pc.execute(
            "SELECT current_setting('wal_level'), current_user, rolsuper, rolreplication "
            "FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        problems = server_problems(
            wal_level=wal_level, superuser=superuser, replication=replication, role=role, source=self.name
        )
        if problems:
            raise SetupError("; ".join(problems))

    def _check_table(self, pc: Any) -> int:
        """The table's OID, after checking its replica identity carries the key."""
        from psycopg import sql

        src, cfg = self.source, self.source.config
        qualified = sql.Identifier(*([cfg.schema_name] if cfg.schema_name else []), cfg.table or "")
        self.qualified = qualified.as_string(pc)
        oid, ident = pc.execute(
            sql.SQL("SELECT c.oid, c.relreplident FROM pg_class c WHERE c.oid = {}::regclass").format(
                sql.Literal(self.qualified)
            )
        ).fetchone()
        columns = [
            r[0]
            for r in pc.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a "
                "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) "
                "WHERE i.indrelid = %s AND CASE WHEN %s = 'i' THEN i.indisreplident ELSE i.indisprimary END",
                (oid, ident),
            ).fetchall()
        ]
        problem = identity_problem(
            ident=ident, identity_columns=columns, key_columns=src.key_columns, table=self.qualified, source=self.name
        )
        if problem:
            raise SetupError(problem)
        return int(oid)

    def _ensure_publication(self, pc: Any) -> None:
        import psycopg
        from psycopg import sql

        row = pc.execute(
            "SELECT puballtables, pubinsert AND pubupdate AND pubdelete FROM pg_publication WHERE pubname = %s",
            (self.publication,),
        ).fetchone()
        if row is None:
            stmt = sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(
                sql.Identifier(self.publication), sql.SQL(self.qualified)
            )
            try:
                pc.execute(stmt)
                pc.commit()
            except psycopg.errors.InsufficientPrivilege as exc:
                pc.rollback()
                raise SetupError(
                    f"source {self.name!r}: cannot create publication {self.publication!r} "
                    f"({_first(exc)}); the table's owner (or a superuser) can run: {stmt.as_string(pc)}"
                ) from exc
            log.info("source=%s created publication %s for %s", self.name, self.publication, self.qualified)
            return
        alltables, all_ops = row
        if not all_ops:
            raise SetupError(
                f"source {self.name!r}: publication {self.publication!r} does not publish every insert, update "
                f"and delete; run ALTER PUBLICATION \"{self.publication}\" SET (publish = 'insert, update, delete, "
                "truncate')"
            )
        published = pc.execute(
            "SELECT 1 FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
            "WHERE p.pubname = %s AND r.prrelid = %s",
            (self.publication, self.table_oid),
        ).fetchone()
        if not alltables and published is None:
            raise SetupError(
                f"source {self.name!r}: publication {self.publication!r} does not publish table {self.qualified}; "
                f"run ALTER PUBLICATION \"{self.publication}\" ADD TABLE {self.qualified}"
            )

    def _slot_state(self, pc: Any) -> dict[str, Any] | None:
        row = pc.execute(
            "SELECT plugin, d.datname = current_database(), confirmed_flush_lsn::text, wal_status, active_pid "
            "FROM pg_replication_slots s LEFT JOIN pg_database d ON d.oid = s.datoid WHERE slot_name = %s",
            (self.slot,),
        ).fetchone()
        if row is None:
            return None
        plugin, same_db, confirmed, wal_status, active_pid = row
        if plugin != "pgoutput" or not same_db:
            raise SetupError(
                f"source {self.name!r}: replication slot {self.slot!r} exists for plugin {plugin!r} or another "
                "database; set `slot_name` to another name or drop that slot"
            )
        if active_pid is not None:
            raise RetriableError(
                f"source {self.name!r}: replication slot {self.slot!r} is in use by server process {active_pid} "
                "(another instance of this source, or one that just died)"
            )
        return {"confirmed_flush_lsn": confirmed, "wal_status": wal_status}

    def _connect_replication(self) -> None:
        import psycopg2
        import psycopg2.extras

        try:
            self._repl = psycopg2.connect(
                self.conninfo(), connection_factory=psycopg2.extras.LogicalReplicationConnection
            )
        except psycopg2.OperationalError as exc:
            reason = _first(exc)
            if "pg_hba.conf" in reason or "replication" in reason:
                raise SetupError(
                    f"source {self.name!r}: the server refuses replication connections ({reason}); allow them "
                    "for this role in pg_hba.conf (database `replication`)"
                ) from exc
            raise RetriableError(f"source {self.name!r}: replication connection failed: {reason}") from exc
        self._cur = self._repl.cursor()

    def _create_slot(self) -> None:
        import psycopg2

        try:
            self._cur.execute(f'CREATE_REPLICATION_SLOT "{self.slot}" LOGICAL pgoutput EXPORT_SNAPSHOT')
            _name, consistent, snapshot, _plugin = self._cur.fetchone()
        except psycopg2.Error as exc:
            raise SetupError(
                f"source {self.name!r}: cannot create replication slot {self.slot!r}: {_first(exc)}"
            ) from exc
        self.lsn = self.snapshot_lsn = lsn_int(consistent)
        self.snapshot_name = snapshot
        self.snapshot_after = None
        log.info("source=%s created slot %s at lsn=%s (snapshot %s)", self.name, self.slot, consistent, snapshot)

    def _drop_slot(self, pc: Any) -> None:
        pc.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        pc.commit()
        log.warning("source=%s dropped replication slot %s (a new snapshot follows)", self.name, self.slot)

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
            raise RetriableError(f"source {self.name!r}: change stream interrupted: {_first(exc)}") from exc
        except psycopg2.Error as exc:
            self._close_replication()
            raise FatalError(f"source {self.name!r}: the change stream failed: {_first(exc)}") from exc

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
                    yield SourceBatch(records, None, headers=headers, source_ts_ms=begin.commit_ts_ms)
                    records = []
            elif isinstance(parsed, pgoutput.Commit):
                self.lsn = parsed.end_lsn
                if begin is not None and (records or time.monotonic() - self._last_yield > _HEARTBEAT_S):
                    self._last_yield = time.monotonic()
                    yield SourceBatch(records, self._position(), headers=headers, source_ts_ms=parsed.commit_ts_ms)
                begin = None
                records = []
            elif isinstance(parsed, pgoutput.Relation):
                self._relation(parsed)
            elif isinstance(parsed, pgoutput.Truncate):
                if self.table_oid in parsed.relids:
                    log.warning("source=%s table %s truncated: reconciling", self.name, self.qualified)
                    self.truncated = True

    def _relation(self, rel: pgoutput.Relation) -> None:
        """Map a relation's columns to the source's columns by name (a table of another publication is kept out)."""
        from psycopg.adapt import Transformer
        from psycopg.pq import Format

        if rel.relid != self.table_oid:
            return
        src = self.source
        names = [c[0] for c in rel.columns]
        index = {n: i for i, n in enumerate(names)}
        wanted = [src.field_to_column[f] for f in src.field_names]
        missing = [c for c in wanted if c not in index]
        if missing or len(names) != len(wanted):
            log.warning(
                "source=%s table %s changed shape (columns now %s); mapped by name, missing %s as null; "
                "restart the source to publish the new schema",
                self.name, self.qualified, names, missing,
            )
        tx = Transformer(self._raw.driver_connection)
        tx.set_loader_types([c[1] for c in rel.columns], Format.TEXT)
        positions = [index.get(c) for c in wanted]
        key_positions = [index.get(k) for k in src.key_columns]
        self._relations[rel.relid] = (tx, positions, key_positions)

    def _load(self, rel: Any, values: tuple[Any, ...]) -> list[Any]:
        tx, positions, _keys = rel
        loaded = tx.load_sequence([None if v is UNCHANGED else v for v in values])
        out = [None if p is None else loaded[p] for p in positions]
        for i, p in enumerate(positions):
            if p is not None and values[p] is UNCHANGED:
                out[i] = UNCHANGED
        return out

    def _key_of(self, rel: Any, values: tuple[Any, ...]) -> dict[str, Any]:
        src = self.source
        row = self._load(rel, values)
        v = src.to_key(tuple(row[src.field_names.index(f)] for f in src.key_fields))
        return dict(v)

    def _apply(self, rel: Any, change: pgoutput.Change, records: list[Any]) -> None:
        src = self.source
        if change.op == "delete":
            key = self._key_of(rel, change.old or ())
            if any(v is None for v in key.values()):
                raise FatalError(
                    f"source {self.name!r}: a delete of {self.qualified} carries no key {src.key_columns}; "
                    f"run ALTER TABLE {self.qualified} REPLICA IDENTITY FULL"
                )
            records.append((key, None))
            return
        row = self._load(rel, change.new or ())
        if any(v is UNCHANGED for v in row):
            filled = self._fill_unchanged(rel, change, row)
            if filled is None:
                return  # the row is gone: its delete follows in the stream
            row = filled
        value = src.to_value(tuple(row))
        if value is None:
            return  # a row left out (a NaN in a NOT NULL decimal, see RdsSource)
        key = {k: value[k] for k in src.key_fields}
        if change.op == "update" and change.old is not None:
            old_key = self._key_of(rel, change.old)
            if all(v is not None for v in old_key.values()) and old_key != key:
                records.append((old_key, None))  # the key changed: the old entity is gone
        records.append((key, value))

    def _fill_unchanged(self, rel: Any, change: pgoutput.Change, row: list[Any]) -> list[Any] | None:
        """Unchanged TOASTed values: from the old row (``REPLICA IDENTITY FULL``), else read from the table."""
        from sqlalchemy import and_, literal, select

        src = self.source
        if change.old is not None and not change.old_is_key:
            old = self._load(rel, change.old)
            return [o if v is UNCHANGED else v for v, o in zip(row, old, strict=True)]
        key_idx = [src.field_names.index(f) for f in src.key_fields]
        cond = and_(*[c == literal(row[i], c.type) for c, i in zip(src.key_cols, key_idx, strict=True)])
        compiled = select(*src.columns).where(cond).compile(dialect=src.engine.dialect)
        pc = self._raw.driver_connection
        try:
            current = pc.execute(str(compiled), compiled.params).fetchone()
        finally:
            pc.rollback()
        if current is None:
            return None
        return [current[i] if v is UNCHANGED else v for i, v in enumerate(row)]

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
            except Exception as exc:  # noqa: BLE001 - a broken connection may fail to close
                log.debug("source=%s closing the replication connection: %s", self.name, exc)
        self._repl = None
        self._cur = None

    def close(self) -> None:
        """Close the replication connection (the slot stays: the next start resumes from it)."""
        self._close_replication()
        if self._raw is not None:
            try:
                self._raw.close()
            except Exception as exc:  # noqa: BLE001
                log.debug("source=%s closing the connection: %s", self.name, exc)
            self._raw = None


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
