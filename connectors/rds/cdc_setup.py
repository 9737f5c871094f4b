"""The set-up of a PostgreSQL change stream (``rds_source`` ``mode: cdc``): server, table, publication, slot.

Each check says in one line what to change on the server (see :mod:`connectors.rds.cdc` for the requirements).
"""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from connectors.rds.pgoutput import lsn_int
from kernel.exceptions import RetriableError, SetupError

if TYPE_CHECKING:
    from connectors.rds.source_columnar import ColumnarPages

# the change stream's log lines keep the logger name they always had
log = logging.getLogger("connectors.rds.cdc")


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



def first_line(exc: BaseException) -> str:
    """The first line of an error's message (its class name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ReplicationSetup:
    """The server checks, the publication, the replication slot and connection (a mixin of ``PgChangeStream``)."""

    source: ColumnarPages
    name: str  # the connector's
    slot: str
    publication: str
    qualified: str  # the table's qualified name, quoted
    table_oid: int
    lsn: int
    snapshot_lsn: int
    snapshot_name: str | None
    snapshot_after: list[Any] | None
    _repl: Any
    _cur: Any

    def conninfo(self) -> str:
        """The libpq connection string SQLAlchemy's psycopg dialect would use (TLS options included)."""
        import psycopg
        from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

        _args, kwargs = PGDialect_psycopg().create_connect_args(self.source.connection.sqlalchemy_url())
        kwargs.setdefault("connect_timeout", int(max(1, self.source.connection.connect_timeout_s)))
        return psycopg.conninfo.make_conninfo(**kwargs)

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
                    f"({first_line(exc)}); the table's owner (or a superuser) can run: {stmt.as_string(pc)}"
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
            reason = first_line(exc)
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
                f"source {self.name!r}: cannot create replication slot {self.slot!r}: {first_line(exc)}"
            ) from exc
        self.lsn = self.snapshot_lsn = lsn_int(consistent)
        self.snapshot_name = snapshot
        self.snapshot_after = None
        log.info("source=%s created slot %s at lsn=%s (snapshot %s)", self.name, self.slot, consistent, snapshot)

    def _drop_slot(self, pc: Any) -> None:
        pc.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
        pc.commit()
        log.warning("source=%s dropped replication slot %s (a new snapshot follows)", self.name, self.slot)

