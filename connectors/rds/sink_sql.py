"""The RDS sink's statements, per dialect: conditional upsert, versioned delete, tombstones, PostgreSQL's COPY path.

Every statement applies a change only when its version is newer than what the
table holds (the update-topic contract): ``INSERT ... ON CONFLICT (key) DO UPDATE
... WHERE row.version < excluded.version`` on PostgreSQL and SQLite, ``ON
DUPLICATE KEY UPDATE col = IF(new version > version, new, old)`` on
MySQL/MariaDB. :class:`~connectors.rds.sink.RdsSink` runs them in one
transaction per batch.
"""

from __future__ import annotations

import io
import logging
import zlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Column, MetaData, Table, and_, bindparam, delete, func, literal, select, tuple_
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection
from sqlalchemy.sql.dml import Delete

from connectors.rds.reading import MYSQL_DIALECTS
from kernel.exceptions import FatalError

log = logging.getLogger(__name__)


def pg_lock_timeout(conn: Connection, seconds: float) -> None:
    """Bound this transaction's lock waits on PostgreSQL (``SET LOCAL lock_timeout``), in whole milliseconds."""
    conn.execute(select(func.set_config("lock_timeout", f"{int(seconds * 1000)}ms", True)))


def upsert_statement(table: Table, key: Sequence[str], version: str, dialect: str) -> Any:
    """The dialect's conditional upsert of whole rows, for ``executemany``.

    Args:
        table: the target table.
        key: its key columns.
        version: its version column.
        dialect: SQLAlchemy's dialect name (``postgresql``, ``sqlite``, ``mysql``, ``mariadb``).

    Returns:
        An ``INSERT`` statement taking one parameter per column.

    Raises:
        FatalError: a dialect without a supported upsert.
    """
    others = [c.name for c in table.c if c.name not in key and c.name != version]
    if dialect in MYSQL_DIALECTS:
        my = mysql.insert(table)
        newer = my.inserted[version] > table.c[version]
        # assignments run left to right: the version column must come last
        updates = [(c, func.if_(newer, my.inserted[c], table.c[c])) for c in others]
        updates.append((version, func.greatest(my.inserted[version], table.c[version])))
        return my.on_duplicate_key_update(updates)
    if dialect in ("postgresql", "sqlite"):  # the same ON CONFLICT ... DO UPDATE ... WHERE in both
        ins = (postgresql if dialect == "postgresql" else sqlite).insert(table)
        return ins.on_conflict_do_update(
            index_elements=list(key),
            set_={c: ins.excluded[c] for c in [*others, version]},
            where=table.c[version] < ins.excluded[version],
        )
    raise FatalError(f"dialect {dialect!r} has no supported upsert")


def delete_versioned(conn: Connection, table: Table, key: Sequence[str], version: str,
                     keys: list[dict[str, Any]]) -> None:
    """``DELETE`` each key's row from ``table`` when its version is older than ``_v``.

    Args:
        conn: the transaction.
        table: the table (the target or its tombstone table).
        key: the key columns.
        version: the version column.
        keys: ``{key columns..., "_v": version}`` per key.
    """
    stmt: Delete = delete(table).where(
        and_(*[table.c[k] == bindparam(f"k_{i}") for i, k in enumerate(key)], table.c[version] < bindparam("_v"))
    )
    conn.execute(stmt, [{**{f"k_{i}": d[k] for i, k in enumerate(key)}, "_v": d["_v"]} for d in keys])


def record_tombstones(conn: Connection, tombstones: Table, key: Sequence[str], version: str,
                      deletes: list[dict[str, Any]], dialect: str) -> None:
    """Keep each deleted key's version (the newest seen) in the tombstone table.

    Args:
        conn: the transaction.
        tombstones: the tombstone table (key columns and the version column).
        key: the key columns.
        version: the version column.
        deletes: ``{key columns..., "_v": version}`` per deleted key.
        dialect: SQLAlchemy's dialect name.
    """
    params = [{**{k: d[k] for k in key}, version: d["_v"]} for d in deletes]
    newest = tombstones.c[version]
    if dialect in MYSQL_DIALECTS:
        my = mysql.insert(tombstones)
        conn.execute(my.on_duplicate_key_update({version: func.greatest(newest, my.inserted[version])}), params)
    elif dialect == "postgresql":
        pg = postgresql.insert(tombstones)
        conn.execute(pg.on_conflict_do_update(index_elements=list(key), set_={version: pg.excluded[version]},
                                              where=newest < pg.excluded[version]), params)
    else:
        lite = sqlite.insert(tombstones)
        conn.execute(lite.on_conflict_do_update(index_elements=list(key), set_={version: lite.excluded[version]},
                                                where=newest < lite.excluded[version]), params)


def not_deleted(
    conn: Connection, tombstones: Table, key: Sequence[str], version: str,
    upserts: list[tuple[tuple[Any, ...], int, tuple[Any, ...]]],
) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """Drop the upserts whose key was deleted at the same or a newer version (read in chunks of 1,000 keys).

    Args:
        conn: the transaction.
        tombstones: the tombstone table.
        key: the key columns.
        version: the version column.
        upserts: ``(key values in key column order, version, row values)`` per upsert.

    Returns:
        The values of the upserts to apply, and ``{key columns..., "_v": version}``
        of the tombstones they supersede (to remove once they are applied).
    """
    deleted: dict[tuple[Any, ...], int] = {}
    key_cols = [tombstones.c[k] for k in key]
    column = key_cols[0] if len(key) == 1 else tuple_(*key_cols)
    for start in range(0, len(upserts), 1_000):
        chunk = [k[0] if len(key) == 1 else k for k, _v, _values in upserts[start : start + 1_000]]
        for row in conn.execute(select(*key_cols, tombstones.c[version]).where(column.in_(chunk))):
            deleted[tuple(row[: len(key)])] = row[-1]
    if not deleted:
        return [values for _k, _v, values in upserts], []
    live, pruned = [], []
    for k, at_version, values in upserts:
        at = deleted.get(k)
        if at is not None and at_version <= at:
            continue  # older than (or as old as) the delete: the key stays deleted
        live.append(values)
        if at is not None:
            pruned.append({**dict(zip(key, k, strict=True)), "_v": at_version})
    return live, pruned


# -- PostgreSQL: COPY into a stage, then one INSERT ... SELECT --------------------------------------------


def csv_safe(typ: Any) -> bool:
    """Whether pyarrow's CSV text of a column reads back equal in PostgreSQL (no binary, nothing nested)."""
    import pyarrow as pa

    return not (
        pa.types.is_binary(typ)
        or pa.types.is_large_binary(typ)
        or pa.types.is_fixed_size_binary(typ)
        or pa.types.is_nested(typ)
        or pa.types.is_dictionary(typ)
    )


def utc_wall_time(table: Any) -> Any:
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


def pg_copy_upsert(conn: Connection, table: Table, tombstones: Table, key: Sequence[str], version: str, *,
                   rows: list[tuple[Any, ...]], tables: Sequence[Any] = (), json_at: Sequence[int] = ()) -> None:
    """COPY into a session temporary table, then one conditional ``INSERT ... SELECT`` (PostgreSQL).

    The bulk-upsert recipe of the PostgreSQL docs' "Populating a Database". One key
    appears once in ``rows`` and ``tables`` together (the batch's newest update per key).

    Args:
        conn: the transaction (psycopg 3 underneath).
        table: the target table.
        tombstones: its tombstone table: an upsert not newer than its key's tombstone is dropped.
        key: the key columns.
        version: the version column.
        rows: values in the table's column order, sent row by row (psycopg's ``COPY``).
        tables: ``pyarrow.Table`` s with the table's columns in order, sent as CSV written by pyarrow.
        json_at: positions of the JSON columns in ``rows`` (sent as ``jsonb``).
    """
    stage = _pg_stage(conn, table)
    cols = [c.name for c in table.c]
    if rows:
        _copy_rows(conn, stage.name, cols, rows, json_at)
    if tables:
        _copy_csv(conn, stage.name, cols, tables)
    others = [c for c in cols if c not in key and c != version]
    same_key = [tombstones.c[k] == stage.c[k] for k in key]
    # an upsert not newer than its key's tombstone is dropped: the key stays deleted
    deleted = select(literal(1)).where(*same_key, tombstones.c[version] >= stage.c[version]).exists()
    pg = postgresql.insert(table).from_select(cols, select(*[stage.c[c] for c in cols]).where(~deleted))
    conn.execute(pg.on_conflict_do_update(
        index_elements=list(key),
        set_={c: pg.excluded[c] for c in [*others, version]},
        where=table.c[version] < pg.excluded[version],
    ))
    # tombstones older than an applied upsert are no longer needed (DELETE ... USING the stage)
    conn.execute(delete(tombstones).where(*same_key, tombstones.c[version] < stage.c[version]))


def _pg_stage(conn: Connection, table: Table) -> Table:
    """Create (once per session) the temporary table the batch is copied into, emptied at each commit."""
    from psycopg import sql

    # the column types are part of the name: a session's stage made before evolve_table widened a
    # column would otherwise round the new values on COPY
    signature = (f"{table.schema}.{table.name}" if table.schema else table.name) + "|".join(
        f"{c.name}:{c.type!r}" for c in table.c)
    name = f"_threes_stage_{zlib.crc32(signature.encode()):08x}"
    target = sql.Identifier(table.schema, table.name) if table.schema else sql.Identifier(table.name)
    with _cursor(conn) as cur:
        cur.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS {} (LIKE {} INCLUDING DEFAULTS) ON COMMIT DELETE ROWS")
                    .format(sql.Identifier(name), target))
    return Table(name, MetaData(), *[Column(c.name, c.type) for c in table.c], prefixes=["TEMPORARY"])


def _cursor(conn: Connection) -> Any:
    """A psycopg cursor on the transaction's own connection."""
    driver: Any = conn.connection.driver_connection  # psycopg's Connection: SQLAlchemy does not type it
    return driver.cursor()


def _copy_rows(conn: Connection, stage: str, cols: list[str], rows: list[tuple[Any, ...]],
               json_at: Sequence[int]) -> None:
    from psycopg import sql
    from psycopg.types.json import Jsonb

    copy_sql = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(stage), sql.SQL(", ").join(map(sql.Identifier, cols)))
    with _cursor(conn) as cur, cur.copy(copy_sql) as copy:
        for values in rows:
            if json_at:
                row = list(values)
                for i in json_at:
                    if row[i] is not None:
                        row[i] = Jsonb(row[i])
                values = tuple(row)
            copy.write_row(values)


def _copy_csv(conn: Connection, stage: str, cols: list[str], tables: Sequence[Any]) -> None:
    import pyarrow.csv as pacsv
    from psycopg import sql

    csv_sql = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        sql.Identifier(stage), sql.SQL(", ").join(map(sql.Identifier, cols)))
    with _cursor(conn) as cur:
        # zoned timestamps go as UTC wall time: pyarrow formats a zoned timestamp far slower than a
        # naive one; the rest of the transaction converts no text
        cur.execute("SELECT set_config('TimeZone', 'UTC', true)")
        for arrow_table in tables:
            out = io.BytesIO()
            pacsv.write_csv(utc_wall_time(arrow_table), out, pacsv.WriteOptions(include_header=False))
            with cur.copy(csv_sql) as copy:
                copy.write(out.getvalue())
