"""The set-up of a MySQL/MariaDB binlog change stream (``rds_source`` ``mode: cdc`` on a ``mysql`` connection).

The server checks (binary log on, row-based, full row images and row metadata, replication privileges), the
positions (binlog file and offset, their version number), the replication client's server id and the
``TRUNCATE`` statements of the table. Each check says in one line what to set on the server
(see :mod:`connectors.rds.binlog` for the requirements).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from typing import Any

REQUIRED_SETTINGS = (
    ("log_bin", "ON", "log-bin (log_bin = ON; on RDS: automated backups on)"),
    ("binlog_format", "ROW", "binlog_format = ROW"),
    ("binlog_row_image", "FULL", "binlog_row_image = FULL"),
    ("binlog_row_metadata", "FULL", "binlog_row_metadata = FULL (MySQL 8.0.14+, MariaDB 10.5+)"),
)
"""``(variable, required value, what to set)``: the server variables binlog change capture needs."""

_REPLICATION = ("REPLICATION SLAVE", "REPLICATION REPLICA")
_MONITOR = ("REPLICATION CLIENT", "BINLOG MONITOR", "SUPER")


def server_problems(variables: Mapping[str, str], grants: list[str], *, user: str, source: str) -> list[str]:
    """What keeps a MySQL/MariaDB server from serving ``mode: cdc`` (empty when nothing).

    Args:
        variables: the global server variables (``SHOW GLOBAL VARIABLES``), names in lower case; a variable
            missing from it counts as unset.
        grants: the lines of ``SHOW GRANTS`` for the connector's user.
        user: the user, for the message.
        source: the connector's name, for the message.

    Returns:
        One line per problem, each saying what to set (in my.cnf or the RDS parameter group) or grant.
    """
    problems = []
    for name, wanted, how in REQUIRED_SETTINGS:
        value = (variables.get(name) or "").upper()
        if value != wanted:
            problems.append(
                f"source {source!r}: mode cdc reads the row-based binary log and needs {name} = {wanted} "
                f"(it is {variables.get(name, 'unset')!r}); set {how} in the server's configuration "
                "(on RDS: its parameter group)"
            )
    missing = missing_privileges(grants)
    if missing:
        problems.append(
            f"source {source!r}: mode cdc needs the {' and '.join(missing)} privilege(s) for user {user}; run "
            f"GRANT {', '.join(missing)} ON *.* TO {user}"
        )
    return problems


def missing_privileges(grants: list[str]) -> list[str]:
    """``REPLICATION SLAVE`` (read the binlog) and ``REPLICATION CLIENT`` (list it) when ``grants`` lack them.

    Args:
        grants: ``SHOW GRANTS`` lines; only global ones (``ON *.*``) count. ``ALL PRIVILEGES`` holds both;
            MariaDB's ``REPLICATION REPLICA`` and ``BINLOG MONITOR`` (or ``SUPER``) count as their aliases.
    """
    held: set[str] = set()
    for line in grants:
        m = re.match(r"\s*GRANT\s+(.*?)\s+ON\s+\*\.\*\s+TO\s", line, re.IGNORECASE | re.DOTALL)
        if m:
            held |= {p.strip().upper() for p in m.group(1).split(",")}
    if "ALL PRIVILEGES" in held or "ALL" in held:
        return []
    missing = []
    if not held & set(_REPLICATION):
        missing.append("REPLICATION SLAVE")
    if not held & set(_MONITOR):
        missing.append("REPLICATION CLIENT")
    return missing


def read_server(cursor: Any) -> tuple[dict[str, str], list[str], str]:
    """The variables :func:`server_problems` checks, the user's grants and the user (``'name'@'host'``).

    Args:
        cursor: a PyMySQL cursor.
    """
    names = ", ".join(f"'{n}'" for n, _, _ in REQUIRED_SETTINGS)
    cursor.execute(f"SHOW GLOBAL VARIABLES WHERE Variable_name IN ({names})")
    variables = {str(k).lower(): str(v) for k, v in cursor.fetchall()}
    cursor.execute("SHOW GRANTS")
    grants = [str(r[0]) for r in cursor.fetchall()]
    cursor.execute("SELECT CURRENT_USER()")
    name, _, host = str(cursor.fetchone()[0]).partition("@")
    return variables, grants, f"'{name}'@'{host}'"


def default_server_id(connector: str) -> int:
    """The server id the replication client registers with: stable per connector, away from usual ids.

    A replica's id must differ from the server's and from every other replica's; ids of hand-configured
    servers are small, so this one is ``0x7E000000`` plus a 24-bit hash of the connector's name.
    """
    return 0x7E000000 + (zlib.crc32(connector.encode()) & 0xFFFFFF)


def file_number(log_file: str) -> int:
    """The sequence number of a binlog file name (``mariadb-bin.000042`` -> 42)."""
    m = re.search(r"\.(\d+)$", log_file)
    if m is None:
        raise ValueError(f"binlog file name without a sequence number: {log_file!r}")
    return int(m.group(1))


def version_of(log_file: str, pos: int) -> int:
    """A record version from a binlog position: monotonic in binlog (commit) order.

    Returns:
        ``file number << 32 | offset`` (a binlog file is at most 4 GiB).
    """
    return (file_number(log_file) << 32) | int(pos)


def truncates(query: str, schema: str | None, database: str, table: str) -> bool:
    """Whether the statement ``query`` (run with default database ``schema``) is a ``TRUNCATE`` of the table.

    Args:
        query: a ``QueryEvent``'s statement.
        schema: the database the statement ran in (``QueryEvent.schema``).
        database: the table's database.
        table: the table's name.
    """
    m = re.match(
        r"\s*TRUNCATE\s+(?:TABLE\s+)?((?:`[^`]+`|\w+)(?:\s*\.\s*(?:`[^`]+`|\w+))?)\s*;?\s*$", query, re.IGNORECASE
    )
    if m is None:
        return False
    parts = [p.strip().strip("`") for p in m.group(1).split(".")]
    db, name = (parts[0], parts[1]) if len(parts) == 2 else (schema, parts[0])
    return name == table and db == database


def begin_snapshot(conn: Any) -> tuple[str, int]:
    """Start a consistent-snapshot transaction on ``conn``; the binlog position it saw.

    MariaDB reports the position of the transaction's own snapshot (``Binlog_snapshot_file``/``_position``);
    MySQL has no such status: a brief ``FLUSH TABLES WITH READ LOCK`` holds commits while the snapshot starts
    and ``SHOW MASTER STATUS`` is read (Debezium's method; needs the ``RELOAD`` privilege).

    Args:
        conn: a SQLAlchemy connection to the server, outside a transaction.

    Returns:
        ``(binlog file, offset)``: the first change the snapshot does not see is at or after it.
    """
    conn.exec_driver_sql("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
    status = dict(conn.exec_driver_sql("SHOW STATUS LIKE 'binlog_snapshot_%%'").all())
    if status.get("Binlog_snapshot_file"):  # MariaDB: the position of this very snapshot
        return str(status["Binlog_snapshot_file"]), int(status["Binlog_snapshot_position"])
    conn.rollback()  # MySQL: no commit between the lock and the snapshot
    conn.exec_driver_sql("FLUSH TABLES WITH READ LOCK")
    try:
        conn.exec_driver_sql("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        row = conn.exec_driver_sql("SHOW MASTER STATUS").first()
    finally:
        conn.exec_driver_sql("UNLOCK TABLES")
    return str(row[0]), int(row[1])
