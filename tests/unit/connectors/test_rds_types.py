"""Unit tests of the SQL -> Avro type mapping and position value encoding (no database)."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import uuid

import fastavro
import pytest
from sqlalchemy import types as sqltypes
from sqlalchemy.dialects import mysql, postgresql

from connectors.rds.types import (
    avro_record_schema,
    avro_type_for_sql,
    converters_for_schema,
    drop_needless_converters,
    from_json_value,
    make_row_converter,
    to_json_value,
)
from kernel.exceptions import FatalError


@pytest.mark.parametrize(("sql_type", "avro"), [
    (sqltypes.Integer(), "int"),
    (sqltypes.SmallInteger(), "int"),
    (sqltypes.BigInteger(), "long"),
    (mysql.INTEGER(unsigned=True), "long"),
    (mysql.BIGINT(unsigned=True), {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 0}),
    (postgresql.DOUBLE_PRECISION(), "double"),
    (postgresql.REAL(), "float"),
    (sqltypes.Numeric(12, 3), {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}),
    (sqltypes.Numeric(), "string"),  # unbounded: no scale to declare, the exact decimal text
    (sqltypes.Boolean(), "boolean"),
    (sqltypes.Text(), "string"),
    (sqltypes.String(10), "string"),
    (sqltypes.Date(), {"type": "int", "logicalType": "date"}),
    (sqltypes.Time(), {"type": "long", "logicalType": "time-micros"}),
    (sqltypes.DateTime(timezone=True), {"type": "long", "logicalType": "timestamp-micros"}),
    (sqltypes.DateTime(), {"type": "long", "logicalType": "local-timestamp-micros"}),
    (postgresql.JSONB(), "string"),
    (postgresql.BYTEA(), "bytes"),
    (postgresql.UUID(), {"type": "string", "logicalType": "uuid"}),
    (postgresql.ARRAY(sqltypes.Integer()), {"type": "array", "items": ["null", "int"]}),
])
def test_avro_type_for_sql(sql_type: sqltypes.TypeEngine, avro: object) -> None:
    assert avro_type_for_sql(sql_type)[0] == avro


@pytest.mark.parametrize(("handling", "bounded", "unbounded", "value", "written"), [
    ("precise", {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3}, "string",
     decimal.Decimal("0.12345678901"), "0.12345678901"),
    ("string", "string", "string", decimal.Decimal("1E-11"), "0.00000000001"),
    ("double", "double", "double", decimal.Decimal("0.5"), 0.5),
])
def test_decimal_handling(handling: str, bounded: object, unbounded: object, value: object, written: object) -> None:
    assert avro_type_for_sql(sqltypes.Numeric(12, 3), decimal_handling=handling)[0] == bounded  # type: ignore[arg-type]
    avro, conv = avro_type_for_sql(sqltypes.Numeric(), decimal_handling=handling)  # type: ignore[arg-type]
    assert avro == unbounded
    assert conv is not None and conv(value) == written
    # arrays of numerics follow the same mode
    item = avro_type_for_sql(postgresql.ARRAY(sqltypes.Numeric()), decimal_handling=handling)[0]  # type: ignore[arg-type]
    assert item == {"type": "array", "items": ["null", unbounded]}


def test_unmapped_type_is_refused_with_the_column() -> None:
    with pytest.raises(FatalError, match='column "span" of table "t" has SQL type'):
        avro_type_for_sql(postgresql.INTERVAL(), 'column "span" of table "t"')


def test_record_schema_names_nulls_and_converters_encode() -> None:
    schema, converters = avro_record_schema(
        "my table", [("id", sqltypes.BigInteger(), False), ("unit price", sqltypes.Numeric(8, 2), True),
                     ("doc", postgresql.JSONB(), True), ("at", sqltypes.DateTime(timezone=True), True),
                     ("raw", postgresql.BYTEA(), True)],
        where='table "my table"',
    )
    assert schema["name"] == "my_table"
    assert [f["name"] for f in schema["fields"]] == ["id", "unit_price", "doc", "at", "raw"]
    assert schema["fields"][1] == {"name": "unit_price", "type": ["null", schema["fields"][1]["type"][1]],
                                   "default": None, "sql.column": "unit price"}
    convert = make_row_converter([f["name"] for f in schema["fields"]], converters)
    value = convert((1, decimal.Decimal("3.50"), {"k": [1, None]}, dt.datetime(2024, 1, 1, 12), memoryview(b"\x00")))
    assert value == {"id": 1, "unit_price": decimal.Decimal("3.50"), "doc": '{"k":[1,null]}',
                     "at": dt.datetime(2024, 1, 1, 12, tzinfo=dt.UTC), "raw": b"\x00"}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), value)
    buf.seek(0)
    assert fastavro.schemaless_reader(buf, fastavro.parse_schema(schema))["unit_price"] == decimal.Decimal("3.50")


def test_colliding_avro_names_are_refused() -> None:
    with pytest.raises(FatalError, match="both become the Avro field 'a_b'"):
        avro_record_schema("t", [("a b", sqltypes.Text(), True), ("a-b", sqltypes.Text(), True)])


def test_postgresql_needs_no_timestamp_converters() -> None:
    _, converters = avro_record_schema("t", [("at", sqltypes.DateTime(timezone=True), True),
                                             ("doc", postgresql.JSONB(), True)])
    assert [f for f, _ in drop_needless_converters(converters, "postgresql")] == ["doc"]
    assert [f for f, _ in drop_needless_converters(converters, "sqlite")] == ["at", "doc"]


def test_converters_for_query_schema() -> None:
    schema = {"type": "record", "name": "q", "fields": [
        {"name": "a", "type": ["null", "string"]}, {"name": "b", "type": "bytes"},
        {"name": "c", "type": {"type": "bytes", "logicalType": "decimal", "precision": 4, "scale": 1}},
        {"name": "d", "type": "long"}]}
    assert [f for f, _ in converters_for_schema(schema)] == ["a", "b"]


@pytest.mark.parametrize("value", [
    None, 5, "x", 1.5, True, dt.datetime(2024, 1, 1, 1, 2, 3, 4, tzinfo=dt.UTC), dt.datetime(2024, 1, 1),
    dt.date(2024, 2, 29), dt.time(1, 2, 3), decimal.Decimal("1.000"), uuid.UUID(int=7), b"\x00\xff",
])
def test_position_values_round_trip_through_json(value: object) -> None:
    import json

    assert from_json_value(json.loads(json.dumps(to_json_value(value)))) == value
