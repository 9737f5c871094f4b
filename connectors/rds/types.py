"""SQL column types to Avro types that Spark's ``from_avro`` reads, and position values to JSON.

Public so that the RDS sink can map the other way with the same rules:

============================  ================================================  =========================
SQL (SQLAlchemy generic type)  Avro                                             Python value written
============================  ================================================  =========================
SmallInteger, Integer          ``int`` (``long`` when MySQL ``UNSIGNED``)        int
BigInteger                     ``long`` (``decimal(20,0)`` when ``UNSIGNED``)    int
Float / REAL, MySQL DOUBLE     ``double`` / ``float``                            float
Numeric(p, s)                  ``bytes`` + ``decimal(p, s)`` (exact)             Decimal
Numeric (unbounded)            ``string``: the exact decimal text (see below)    str
Boolean                        ``boolean``                                       bool
String, Text, Enum             ``string``                                        str
MySQL SET                      ``string``: members in definition order, ``a,c``  str
Uuid                           ``string`` + ``uuid``                             str
Date                           ``int`` + ``date``                                date
Time                           ``long`` + ``time-micros``                        time
DateTime(timezone=True)        ``long`` + ``timestamp-micros`` (UTC instant)     aware datetime
MySQL TIMESTAMP                ``long`` + ``timestamp-micros`` (UTC instant)     aware datetime
DateTime(timezone=False)       ``long`` + ``local-timestamp-micros``             naive datetime
JSON / JSONB                   ``string`` (the JSON text)                        str
LargeBinary, BYTEA, BINARY     ``bytes``                                         bytes
ARRAY of any of these          ``array`` of the nullable item type               list
============================  ================================================  =========================

MySQL's ``BOOLEAN`` is ``TINYINT(1)``, which can hold -128..127: it stays an
``int`` (never a lossy ``boolean``); cast it in a ``mode: query`` SELECT if wanted.

A nullable column becomes the union ``["null", T]`` with default ``null``.
Spark reads ``timestamp-micros`` as ``TimestampType``, ``local-timestamp-micros``
as ``TimestampNTZType``, ``date`` as ``DateType`` and ``decimal`` as
``DecimalType(p, s)`` (Spark's ``from_avro`` documentation, "Supported types").
Fixed-point numbers follow the source's ``decimal_handling`` (Debezium's
``decimal.handling.mode``); the table above is ``precise``, the default:

* ``precise``: every digit kept. ``numeric(p, s)`` is ``decimal(p, s)``. An
  unbounded ``numeric`` has no scale to declare (PostgreSQL keeps up to 16383
  fractional digits), so no Avro ``decimal`` holds all its values: it is the
  exact decimal text, a ``string`` (``"0.12345678901"``, never an exponent;
  ``NaN``, ``Infinity`` and ``-Infinity`` as such). A string rather than
  Debezium's ``VariableScaleDecimal`` record ``{scale, value}``: Spark's
  ``from_avro`` reads it as ``StringType``, which Spark SQL casts to any
  ``DECIMAL(p, s)`` the job chooses, whereas the record's two's-complement
  bytes need a UDF in Spark, and every sink writes a string as it is.
  A topic whose unbounded ``numeric`` was written as ``decimal(38, 9)`` (before
  ``decimal_handling``) refuses the new schema at start, naming the field
  (:mod:`schemas.compatibility`: Avro would read the decimal's bytes as text);
  write to a new topic, or set ``topic_spec.compatibility: NONE`` knowing that
  readers see both types.
* ``string``: every ``numeric`` (bounded too) as its exact decimal text.
* ``double``: every ``numeric`` as a ``double`` (lossy: about 15-17 significant
  digits; opt-in).

``NaN``/``±Infinity`` have no Avro decimal: ``RdsSource`` sends them in a
``decimal`` field as null (or leaves a ``NOT NULL`` column's row out), with a
log line naming the column. Any other type is refused with an error naming
the column; cast it in a ``mode: query`` SELECT.

Avro names allow ``[A-Za-z_][A-Za-z0-9_]*`` only (Avro specification, "Names"):
a column such as ``unit price`` is the field ``unit_price``, and the original
name is kept in the field's ``"sql.column"`` property.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from sqlalchemy import types as sqltypes
from sqlalchemy.dialects import mysql

from connectors.runtime.avro import avro_name
from kernel.exceptions import FatalError

DecimalHandling = Literal["precise", "string", "double"]
"""How fixed-point numbers are written (Debezium's ``decimal.handling.mode``; see the module docstring)."""

Converter = Callable[[Any], Any]


def _json_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def decimal_text(value: Any) -> str:
    """The exact decimal text of a number: ``Decimal("1E-11")`` -> ``"0.00000000001"`` (no exponent)."""
    if not isinstance(value, decimal.Decimal):
        value = decimal.Decimal(str(value))
    return format(value, "f")


def exact_mysql_time(t: sqltypes.TypeEngine) -> sqltypes.TypeEngine:
    """A MySQL ``TIME`` column type whose values outside 00:00-24:00 stay ``timedelta`` (other types as they are).

    SQLAlchemy's ``mysql.TIME`` turns the driver's ``timedelta`` into a ``datetime.time`` by dropping whole
    days: ``'30:00:00'`` (MySQL's range is ±838 h) would silently read as 06:00. Kept a ``timedelta``, such
    a value is refused when encoded, naming the column (Avro's ``time-micros`` is a time of day), and the
    binlog change stream reads it the same way (:func:`time_of_day`).
    """
    if not isinstance(t, mysql.TIME) or isinstance(t, ExactMysqlTime):
        return t
    return ExactMysqlTime(timezone=t.timezone, fsp=t.fsp)


def time_of_day(value: Any) -> Any:
    """A MySQL ``TIME`` value (``timedelta``) as a ``datetime.time`` when it is one (00:00-24:00), else as it is."""
    if isinstance(value, dt.timedelta) and dt.timedelta(0) <= value < dt.timedelta(days=1):
        return (dt.datetime.min + value).time()
    return value


class ExactMysqlTime(mysql.TIME):
    """``mysql.TIME`` read with :func:`time_of_day` (see :func:`exact_mysql_time`)."""

    cache_ok = True

    def result_processor(self, dialect: Any, coltype: object) -> Any:
        """Values as :func:`time_of_day` returns them."""
        return lambda value: None if value is None else time_of_day(value)


def _set_members(t: sqltypes.TypeEngine) -> tuple[str, ...] | None:
    """The members of a MySQL ``SET`` column type, in definition order (``None`` for any other type)."""
    return tuple(t.values) if isinstance(t, mysql.SET) else None


def set_text(value: Any, members: tuple[str, ...]) -> str:
    """A MySQL ``SET`` value as MySQL writes it: its members in definition order, comma-separated (``"x,z"``).

    SQLAlchemy (over the driver) and the binlog hand a Python ``set``; text is kept as it is.
    """
    if isinstance(value, str):
        return value
    return ",".join(m for m in members if m in value)


def _to_bytes(value: Any) -> bytes:
    return bytes(value)


def ensure_naive(value: dt.datetime) -> dt.datetime:
    """A datetime without time zone (an aware one converted to UTC first)."""
    return value if value.tzinfo is None else value.astimezone(dt.UTC).replace(tzinfo=None)


def ensure_aware(value: dt.datetime) -> dt.datetime:
    """A datetime with time zone (a naive one taken as UTC)."""
    # a naive value in a "with time zone" column (SQLite, MySQL) is taken as UTC
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def is_instant(sql_type: sqltypes.TypeEngine) -> bool:
    """Whether a date-time column holds an instant: ``timestamptz``, or MySQL's ``TIMESTAMP``.

    MySQL/MariaDB store a ``TIMESTAMP`` as UTC and convert it to the session's
    time zone, which the connectors set to UTC (``utc_sessions``), so its naive
    values are UTC instants; a ``DATETIME`` is a wall-clock value without zone.
    """
    from sqlalchemy.dialects import mysql

    return bool(getattr(sql_type, "timezone", False)) or isinstance(sql_type, mysql.TIMESTAMP)


def avro_type_for_sql(
    sql_type: sqltypes.TypeEngine, where: str = "column", decimal_handling: DecimalHandling = "precise"
) -> tuple[Any, Converter | None]:
    """Map one SQL type to its Avro type and the converter of its Python values.

    Args:
        sql_type: a reflected or declared SQLAlchemy type.
        where: names the column in the error (``column "amount" of table "t"``).
        decimal_handling: how fixed-point numbers are written (see the module docstring).

    Returns:
        ``(avro_type, converter)``: a non-null Avro type (dict or primitive name)
        and a function applied to non-null values before encoding, or ``None``
        when the driver's value is written as is.

    Raises:
        FatalError: a type without an Avro mapping (cast it in a custom query).
    """
    t = sql_type
    if isinstance(t, sqltypes.ARRAY):
        item, item_conv = avro_type_for_sql(t.item_type, where, decimal_handling)
        conv = (lambda v: [None if x is None else item_conv(x) for x in v]) if item_conv else list
        return {"type": "array", "items": ["null", item]}, conv
    if isinstance(t, sqltypes.Boolean):
        return "boolean", None
    number = _avro_number(t, decimal_handling)
    if number is not None:
        return number
    if isinstance(t, sqltypes.DateTime):
        if is_instant(t):
            return {"type": "long", "logicalType": "timestamp-micros"}, ensure_aware
        return {"type": "long", "logicalType": "local-timestamp-micros"}, ensure_naive
    if isinstance(t, sqltypes.Date):
        return {"type": "int", "logicalType": "date"}, None
    if isinstance(t, sqltypes.Time):
        return {"type": "long", "logicalType": "time-micros"}, None
    if isinstance(t, sqltypes.JSON):
        return "string", _json_text
    if isinstance(t, sqltypes.Uuid):
        return {"type": "string", "logicalType": "uuid"}, str
    members = _set_members(t)
    if members is not None:
        return "string", lambda v: set_text(v, members)
    if isinstance(t, (sqltypes.String, sqltypes.Enum)):
        return "string", None
    if isinstance(t, sqltypes._Binary):
        return "bytes", _to_bytes
    raise FatalError(
        f"{where} has SQL type {t!r}, which has no Avro mapping; "
        "select it cast to a supported type in a `mode: query` source"
    )


def _avro_number(t: sqltypes.TypeEngine, decimal_handling: DecimalHandling) -> tuple[Any, Converter | None] | None:
    """:func:`avro_type_for_sql` of an integer, floating-point or fixed-point type; ``None`` for other types."""
    if isinstance(t, sqltypes.BigInteger):
        if getattr(t, "unsigned", False):
            return {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 0}, decimal.Decimal
        return "long", None
    if isinstance(t, sqltypes.Integer):
        return ("long" if getattr(t, "unsigned", False) else "int"), None
    if isinstance(t, sqltypes.Float):
        is_single = type(t).__name__.upper() in ("REAL", "FLOAT4") or getattr(t, "precision", None) in range(1, 25)
        # MySQL's reflected DOUBLE/FLOAT default to asdecimal=True: SQLAlchemy hands out Decimal
        return ("float" if is_single else "double"), (float if t.asdecimal else None)
    if isinstance(t, sqltypes.Numeric):
        precision, scale = t.precision, t.scale
        if decimal_handling == "double":
            return "double", float
        if decimal_handling == "string" or precision is None:  # unbounded: no Avro decimal holds every value
            return "string", decimal_text
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": int(precision),
            "scale": int(scale or 0),
        }, None
    return None


def avro_record_schema(
    name: str,
    columns: Iterable[tuple[str, sqltypes.TypeEngine, bool]],
    *,
    namespace: str = "threes.rds",
    where: str = "table",
    doc: str | None = None,
    decimal_handling: DecimalHandling = "precise",
) -> tuple[dict[str, Any], list[tuple[str, Converter]]]:
    """Build an Avro record schema from columns.

    Args:
        name: the record name (made a valid Avro name).
        columns: ``(column name, SQL type, nullable)`` in the order wanted.
        namespace: Avro namespace of the record.
        where: names the table in errors (``table "public.t"``).
        doc: the record's ``doc``.
        decimal_handling: how fixed-point numbers are written (see the module docstring).

    Returns:
        ``(schema, converters)``: the schema (a dict, fields in column order,
        each with ``"sql.column"`` = the original name) and ``(field name,
        converter)`` for the fields whose values need converting.

    Raises:
        FatalError: a column type has no mapping, or two columns map to the same Avro name.
    """
    fields: list[dict[str, Any]] = []
    converters: list[tuple[str, Converter]] = []
    seen: dict[str, str] = {}
    for col, sql_type, nullable in columns:
        field_name = avro_name(col)
        if field_name in seen:
            raise FatalError(
                f"{where}: columns {seen[field_name]!r} and {col!r} both become the Avro field "
                f"{field_name!r}; rename one with a `mode: query` SELECT ... AS"
            )
        seen[field_name] = col
        avro_type, conv = avro_type_for_sql(sql_type, f'column "{col}" of {where}', decimal_handling)
        f: dict[str, Any] = {"name": field_name, "type": ["null", avro_type] if nullable else avro_type}
        if nullable:
            f["default"] = None
        f["sql.column"] = col
        fields.append(f)
        if conv is not None:
            converters.append((field_name, conv))
    schema: dict[str, Any] = {"type": "record", "name": avro_name(name), "namespace": namespace, "fields": fields}
    if doc:
        schema["doc"] = doc
    return schema, converters


DRIVER_EXACT_TIMESTAMPS = frozenset({"postgresql"})
"""Dialects whose driver returns aware datetimes for ``timestamptz`` and naive ones for ``timestamp``:
:func:`ensure_aware` / :func:`ensure_naive` are not needed there (one Python call per value saved)."""


ARROW_NATIVE_CONVERTERS: frozenset[Converter] = frozenset({_to_bytes, decimal_text})
"""Converters an Arrow reader (ADBC) makes unnecessary: it hands ``bytea`` as Arrow binary, not ``memoryview``,
and ``numeric`` as its text (an opaque type stored as a string), which is PostgreSQL's exact decimal text."""


def drop_needless_converters(converters: Sequence[tuple[str, Converter]], dialect: str) -> list[tuple[str, Converter]]:
    """Remove the timestamp converters a dialect's driver makes unnecessary (see :data:`DRIVER_EXACT_TIMESTAMPS`)."""
    if dialect not in DRIVER_EXACT_TIMESTAMPS:
        return list(converters)
    return [(f, fn) for f, fn in converters if fn not in (ensure_aware, ensure_naive)]


def converters_for_schema(schema: dict[str, Any]) -> list[tuple[str, Converter]]:
    """Converters for rows of a custom query checked against a given Avro schema.

    Drivers return ``dict`` for JSON, ``memoryview`` for bytes...; this turns them
    into what the field's Avro type takes (JSON text for strings, bytes).

    Returns:
        ``(field name, converter)`` for string and bytes fields.
    """
    out: list[tuple[str, Converter]] = []
    for f in schema.get("fields", []):
        types = f["type"] if isinstance(f["type"], list) else [f["type"]]
        prims = [t if isinstance(t, str) else t.get("type") for t in types if t != "null"]
        if prims == ["string"]:
            out.append((f["name"], _json_text))
        elif prims == ["bytes"] and not any(isinstance(t, dict) and t.get("logicalType") for t in types):
            out.append((f["name"], _to_bytes))
    return out


def make_row_converter(
    names: Sequence[str], converters: Sequence[tuple[str, Converter]]
) -> Callable[[Sequence[Any]], dict[str, Any]]:
    """A fast function from a DB row (a sequence in ``names`` order) to the Avro value dict."""
    names = tuple(names)
    if not converters:
        return lambda row: dict(zip(names, row, strict=True))
    conv = tuple(converters)

    def convert(row: Sequence[Any]) -> dict[str, Any]:
        d = dict(zip(names, row, strict=True))
        for name, fn in conv:
            v = d[name]
            if v is not None:
                d[name] = fn(v)
        return d

    return convert


# -- positions: values of key / timestamp columns as JSON ---------------------------------------------


def to_json_value(value: Any) -> Any:
    """Encode a column value for a position (tagged, so it reads back as the same type)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dt.datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, dt.time):
        return {"$time": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, uuid.UUID):
        return {"$uuid": str(value)}
    if isinstance(value, (bytes, memoryview)):
        return {"$bytes": base64.b64encode(bytes(value)).decode()}
    return {"$str": str(value)}


def from_json_value(value: Any) -> Any:
    """Decode what :func:`to_json_value` wrote."""
    if not isinstance(value, dict) or len(value) != 1:
        return value
    ((tag, text),) = value.items()
    decoders: dict[str, Callable[[str], Any]] = {
        "$datetime": dt.datetime.fromisoformat,
        "$date": dt.date.fromisoformat,
        "$time": dt.time.fromisoformat,
        "$decimal": decimal.Decimal,
        "$uuid": uuid.UUID,
        "$bytes": base64.b64decode,
        "$str": str,
    }
    return decoders[tag](text) if tag in decoders else value
