"""Rows to replay: a CSV file (or a zipped one), an Arrow table, or a SQL table, as dicts of Python values.

Values are what fastavro writes directly: ``None`` for null, ints, floats,
strings, and timestamps as epoch integers in their column's unit (Avro's
``timestamp-micros`` holds microseconds), so no ``datetime`` is built per row.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from connectors.rds.connection import RdsConnection, sql_engine
from kernel.exceptions import ConfigError, SetupError

log = logging.getLogger(__name__)

Row = dict[str, Any]


def _python_column(col: Any) -> list[Any]:
    """An Arrow column as Python values, nulls as ``None``, timestamps as epoch integers.

    Arrow's ``to_pylist`` builds one Python object per value through Arrow
    scalars; going through NumPy is several times faster on 336,776 rows.
    Timestamps stay integers in the column's unit (what Avro's
    ``timestamp-micros`` holds), which fastavro writes as they are.
    """
    import pyarrow as pa

    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_timestamp(col.type):
        col = col.cast(pa.int64())
    if pa.types.is_date(col.type) or pa.types.is_binary(col.type):
        return col.to_pylist()
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col.to_numpy(zero_copy_only=False).tolist()
    if col.null_count:
        nulls = col.is_null().to_numpy(zero_copy_only=False).nonzero()[0].tolist()
        values = col.fill_null(0 if not pa.types.is_boolean(col.type) else False).to_numpy(
            zero_copy_only=False
        ).tolist()
        for i in nulls:
            values[i] = None
        return values
    return col.to_numpy(zero_copy_only=False).tolist()


def arrow_rows(table: Any, batch_rows: int = 20_000) -> Iterator[Row]:
    """Yield the rows of an Arrow table as dicts, one batch of columns converted at a time."""
    names = table.column_names
    for batch in table.to_batches(max_chunksize=batch_rows):
        columns = [_python_column(batch.column(i)) for i in range(batch.num_columns)]
        for values in zip(*columns, strict=True):
            yield dict(zip(names, values, strict=True))


def filter_table(table: Any, match: Mapping[str, Sequence[str]] | None = None, limit: int | None = None) -> Any:
    """Keep the rows whose columns hold one of the given values, then the first ``limit`` of them.

    Args:
        table: an Arrow table.
        match: column -> accepted values written as text (``{"month": ["1"], "day": ["1", "2"]}``);
            every column must match (AND), any listed value (OR).
        limit: at most this many rows.

    Raises:
        ConfigError: a column is not in the table, or a value does not parse as its type.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    for column, values in (match or {}).items():
        if column not in table.column_names:
            raise ConfigError(f"--match {column}=...: no column {column!r} (have: {', '.join(table.column_names)})")
        typ = table.schema.field(column).type
        try:
            wanted = pa.array(list(values), pa.string()).cast(typ)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ConfigError(f"--match {column}={','.join(values)}: not values of type {typ}: {exc}") from exc
        table = table.filter(pc.is_in(table.column(column), value_set=wanted))
    if limit is not None:
        table = table.slice(0, limit)
    return table


def select_days(table: Any, days: Sequence[tuple[int, int, int]]) -> Any:
    """Keep the rows whose ``year``, ``month`` and ``day`` columns are one of ``days``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    stamp = pc.add(pc.add(pc.multiply(table.column("year").cast(pa.int64()), 10_000),
                          pc.multiply(table.column("month").cast(pa.int64()), 100)),
                   table.column("day").cast(pa.int64()))
    wanted = pa.array([y * 10_000 + m * 100 + d for y, m, d in days], pa.int64())
    return table.filter(pc.is_in(stamp, value_set=wanted))


def sort_table(table: Any, by: Sequence[str]) -> Any:
    """The rows ordered by some columns, ascending; ties keep their order (Arrow's sort is stable).

    Raises:
        ConfigError: a column is not in the table.
    """
    missing = [c for c in by if c not in table.column_names]
    if missing:
        raise ConfigError(f"--order-by: no column(s) {missing} (have: {', '.join(table.column_names)})")
    return table.sort_by([(c, "ascending") for c in by]) if by else table


@dataclass
class RowSource:
    """Rows to replay and how many there are (for the progress bar).

    Attributes:
        rows: the rows, as dicts of the value schema's fields.
        total: how many rows ``rows`` yields, or ``None`` when unknown.
        description: what they are, for logs and the progress bar.
        table: the same rows as a ``pyarrow.Table``, when they come from one (``None`` otherwise):
            the replayer then encodes them a batch of columns at a time.
    """

    rows: Iterable[Row]
    total: int | None
    description: str
    table: Any = None


def csv_source(
    path: str | Path,
    value_schema: dict[str, Any],
    *,
    match: Mapping[str, Sequence[str]] | None = None,
    limit: int | None = None,
    null_values: Sequence[str] = ("NA",),
    order_by: Sequence[str] = (),
    timezone: str = "UTC",
) -> RowSource:
    """The rows of a CSV file (or a ``.zip`` holding one), typed by the value schema.

    Args:
        path: the file.
        value_schema: the record schema the rows are read as.
        match: column -> accepted values (see :func:`filter_table`).
        limit: at most this many rows (after ``match`` and ``order_by``).
        null_values: texts read as null.
        order_by: columns to sort by before replaying (file order when empty).
        timezone: the zone of timestamps without an offset (see :func:`threes.demo.data.read_csv`).

    Raises:
        ConfigError: the file is missing or does not match the schema (see
            :func:`threes.demo.data.read_csv`).
    """
    from threes.demo.data import read_csv

    table = read_csv(path, value_schema, null_values=null_values, timezone=timezone)
    table = sort_table(filter_table(table, match), order_by)
    table = filter_table(table, None, limit)
    return RowSource(arrow_rows(table), table.num_rows, str(path), table)


def table_source(table: Any, description: str, *, match: Mapping[str, Sequence[str]] | None = None,
                 limit: int | None = None) -> RowSource:
    """The rows of an Arrow table already in memory (e.g. a dataset table read once)."""
    table = filter_table(table, match, limit)
    return RowSource(arrow_rows(table), table.num_rows, description, table)


def sql_source(
    conn: RdsConnection,
    table: str,
    value_schema: dict[str, Any],
    *,
    schema_name: str | None = None,
    match: Mapping[str, Sequence[str]] | None = None,
    limit: int | None = None,
    order_by: Sequence[str] | None = None,
) -> RowSource:
    """The rows of a SQL table, selected with SQLAlchemy Core (identifiers are quoted, never spliced).

    Rows are streamed from a server-side cursor, 5,000 at a time.

    Args:
        conn: the database.
        table: the table name.
        value_schema: the record schema; its fields must be columns of the table.
        schema_name: the database schema of the table.
        match: column -> accepted values (``IN``), as for CSV files.
        limit: at most this many rows.
        order_by: columns to order by (default: the table's primary key, else none).

    Raises:
        ConfigError: the table or a field's column does not exist.
        SetupError: the database cannot be reached.
    """
    from sqlalchemy import MetaData, Table, func, select
    from sqlalchemy.exc import NoSuchTableError, SQLAlchemyError

    engine = sql_engine(conn)
    try:
        tbl = Table(table, MetaData(), schema=schema_name, autoload_with=engine)
    except NoSuchTableError as exc:
        engine.dispose()
        raise ConfigError(f"table {table!r} does not exist") from exc
    except SQLAlchemyError as exc:
        engine.dispose()
        raise SetupError(f"cannot read table {table!r}: {exc}") from exc
    try:
        stmt = _select(tbl, table, value_schema, match, limit, order_by)
    except ConfigError:
        engine.dispose()
        raise
    with engine.connect() as db:
        total = db.execute(select(func.count()).select_from(stmt.subquery())).scalar_one()

    def rows() -> Iterator[Row]:
        try:
            with engine.connect() as db:
                result = db.execution_options(stream_results=True, yield_per=5_000).execute(stmt)
                for row in result.mappings():
                    yield dict(row)
        finally:
            engine.dispose()

    return RowSource(rows(), total, f"table {table}")


def _select(tbl: Any, table: str, value_schema: dict[str, Any], match: Mapping[str, Sequence[str]] | None,
            limit: int | None, order_by: Sequence[str] | None) -> Any:
    """The ``SELECT`` of :func:`sql_source` on the reflected ``tbl`` (arguments as there).

    Raises:
        ConfigError: a field's or a ``match`` column does not exist.
    """
    from sqlalchemy import select

    names = [f["name"] for f in value_schema["fields"]]
    missing = [n for n in names if n not in tbl.c]
    if missing:
        raise ConfigError(f"table {table!r} has no column(s) {missing} of schema {value_schema.get('name')}")
    stmt = select(*(tbl.c[n] for n in names))
    for column, values in (match or {}).items():
        if column not in tbl.c:
            raise ConfigError(f"--match {column}=...: table {table!r} has no column {column!r}")
        stmt = stmt.where(tbl.c[column].in_([tbl.c[column].type.python_type(v) for v in values]))
    order = [tbl.c[c] for c in order_by] if order_by else list(tbl.primary_key.columns)
    if order:
        stmt = stmt.order_by(*order)
    if limit is not None:
        stmt = stmt.limit(limit)
    return stmt
