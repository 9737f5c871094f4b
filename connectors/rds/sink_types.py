"""Avro to SQL types for the RDS sink's optional table creation.

After the Avro 1.11 specification (primitive and logical types) and
SQLAlchemy's generic types, which each dialect renders as its own: a
``timestamp-micros`` becomes ``TIMESTAMP WITH TIME ZONE`` on PostgreSQL and
``DATETIME(6)`` holding UTC on MySQL/MariaDB (their plain ``DATETIME`` keeps whole
seconds only; ``TIMESTAMP`` ends in 2038). Nested records, maps and arrays become JSON (``JSONB``
on PostgreSQL). A union with ``null`` is the nullable form of its other branch.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    Date,
    DateTime,
    Double,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    Numeric,
    String,
    Table,
    Text,
    Time,
    Uuid,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.types import TypeEngine

from connectors.rds.sink_fit import REQUIRED_COMMENT
from kernel.exceptions import FatalError

_PRIMITIVES: dict[str, Any] = {
    "boolean": Boolean,
    "int": Integer,
    "long": BigInteger,
    "float": Float,
    "double": Double,
    "bytes": LargeBinary,
    "string": Text,
}


def _micros(generic: TypeEngine, mysql_type: TypeEngine) -> TypeEngine:
    """``generic``, as ``mysql_type`` (with fractional seconds) on MySQL/MariaDB, whose default is whole seconds."""
    return generic.with_variant(mysql_type, "mysql", "mariadb")


_LOGICAL: dict[str, Any] = {
    "date": Date,
    "time-millis": lambda: _micros(Time(), mysql.TIME(fsp=3)),
    "time-micros": lambda: _micros(Time(), mysql.TIME(fsp=6)),
    # an instant: DATETIME(6) holding UTC on MySQL (the sink's sessions are UTC), timestamptz on PostgreSQL
    "timestamp-millis": lambda: _micros(DateTime(timezone=True), mysql.DATETIME(fsp=3)),
    "timestamp-micros": lambda: _micros(DateTime(timezone=True), mysql.DATETIME(fsp=6)),
    "local-timestamp-millis": lambda: _micros(DateTime(), mysql.DATETIME(fsp=3)),
    "local-timestamp-micros": lambda: _micros(DateTime(), mysql.DATETIME(fsp=6)),
    "uuid": Uuid,
}


def json_type() -> TypeEngine:
    """JSON, as ``JSONB`` on PostgreSQL."""
    return JSON().with_variant(JSONB(), "postgresql")


def sql_type(avro: Any, *, key: bool = False) -> tuple[TypeEngine, bool]:
    """Map an Avro field type to a SQL type.

    Args:
        avro: the field's Avro type (a name, a dict, or a union list), as parsed JSON.
        key: the column is part of the primary key (MySQL needs a bounded string there).

    Returns:
        ``(type, nullable)``.

    Raises:
        FatalError: a union of several non-null types (no single column type fits).
    """
    nullable = False
    if isinstance(avro, list):
        branches = [b for b in avro if b != "null"]
        nullable = len(branches) < len(avro)
        if len(branches) != 1:
            raise FatalError(f"Avro union {avro} has several non-null branches: no single SQL column type fits")
        avro = branches[0]
    if isinstance(avro, dict):
        logical = avro.get("logicalType")
        if logical == "decimal":
            return Numeric(avro.get("precision", 38), avro.get("scale", 0)), nullable
        if logical in _LOGICAL:
            return _LOGICAL[logical](), nullable
        kind = avro.get("type")
        if kind in ("record", "map", "array"):
            return json_type(), nullable
        if kind == "enum":
            return (String(255) if key else Text()), nullable
        if kind == "fixed":
            return LargeBinary(), nullable
        return sql_type(kind, key=key)[0], nullable
    if avro == "string" and key:
        return Text().with_variant(String(255), "mysql", "mariadb"), nullable
    if avro in _PRIMITIVES:
        return _PRIMITIVES[avro](), nullable
    # a named type defined earlier in the schema: records become JSON
    return json_type(), nullable


def python_sql_type(value: Any) -> TypeEngine:
    """A SQL type for a key column known only from a decoded value (not in the value schema)."""
    if isinstance(value, bool):
        return Boolean()
    if isinstance(value, int):
        return BigInteger()
    return Text().with_variant(String(255), "mysql", "mariadb")


def table_from_avro(
    name: str,
    schema: dict[str, Any],
    key: list[str],
    version_column: str,
    *,
    schema_name: str | None = None,
    key_sample: dict[str, Any] | None = None,
) -> Table:
    """Build the table of a sink from the value's Avro record schema.

    Args:
        name: the table name.
        schema: the Avro record schema of values (parsed JSON or fastavro's parsed form).
        key: primary key column(s).
        version_column: the column holding the applied version (``BIGINT NOT NULL``).
        schema_name: the database schema.
        key_sample: decoded key fields, to type key columns absent from the value schema.

    Returns:
        An unbound :class:`sqlalchemy.Table` (call ``create``).

    Raises:
        FatalError: the schema is not a record, or a key column has no type.
    """
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise FatalError(f"table {name!r}: the value schema is not an Avro record, cannot create the table")
    columns: list[Column] = []
    fields = {f["name"]: f for f in schema.get("fields", [])}
    for column in key:
        if column in fields:
            typ, _ = sql_type(fields[column]["type"], key=True)
        elif key_sample and column in key_sample:
            typ = python_sql_type(key_sample[column])
        else:
            raise FatalError(f"table {name!r}: key column {column!r} is neither in the value schema nor in the key")
        columns.append(Column(column, typ, primary_key=True, autoincrement=False))
    for fname, f in fields.items():
        if fname in key or fname == version_column:
            continue
        typ, nullable = sql_type(f["type"])
        # every column is nullable, so that a field a compatible schema change removes still writes (NULL);
        # the comment keeps that the field was required, for the sink's warning when it disappears
        comment = None if nullable else REQUIRED_COMMENT
        columns.append(Column(fname, typ, nullable=True, comment=comment))
    columns.append(Column(version_column, BigInteger(), nullable=False))
    return Table(name, MetaData(), *columns, schema=schema_name)
