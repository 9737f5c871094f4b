"""Avro writer schemas as Arrow types (``schemas.arrow``): the spark-avro / Kafka Connect mapping."""

from __future__ import annotations

import fastavro
import pyarrow as pa
import pytest

from schemas.arrow import UnsupportedAvroType, arrow_field, arrow_type, has_uuid

ALL = {
    "type": "record",
    "name": "All",
    "namespace": "t",
    "fields": [
        {"name": "b", "type": "boolean"},
        {"name": "i", "type": "int"},
        {"name": "l", "type": "long"},
        {"name": "f", "type": "float"},
        {"name": "d", "type": "double"},
        {"name": "s", "type": "string"},
        {"name": "raw", "type": "bytes"},
        {"name": "fx", "type": {"type": "fixed", "name": "Four", "size": 4}},
        {"name": "fx2", "type": "t.Four"},
        {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "arr", "type": {"type": "array", "items": ["null", "long"]}},
        {"name": "m", "type": {"type": "map", "values": "double"}},
        {"name": "opt", "type": ["null", "string"], "default": None},
        {"name": "opt_last", "type": ["int", "null"]},
        {"name": "ts_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "lts_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "lts_us", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {
            "name": "big",
            "type": {"type": "fixed", "name": "Big", "size": 32, "logicalType": "decimal", "precision": 50, "scale": 4},
        },
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "ns", "type": {"type": "long", "logicalType": "timestamp-nanos"}},
        {"name": "sub", "type": ["null", {"type": "record", "name": "Sub", "fields": [{"name": "x", "type": "int"}]}]},
        {"name": "sub2", "type": "t.Sub"},
    ],
}


def test_every_avro_type_maps_like_spark_avro() -> None:
    typ = arrow_type(fastavro.parse_schema(ALL))
    got = {f.name: (f.type, f.nullable) for f in typ}
    sub = pa.struct([pa.field("x", pa.int32(), nullable=False)])
    assert got == {
        "b": (pa.bool_(), False),
        "i": (pa.int32(), False),
        "l": (pa.int64(), False),
        "f": (pa.float32(), False),
        "d": (pa.float64(), False),
        "s": (pa.string(), False),
        "raw": (pa.binary(), False),
        "fx": (pa.binary(4), False),
        "fx2": (pa.binary(4), False),
        "e": (pa.string(), False),
        "arr": (pa.list_(pa.field("element", pa.int64(), nullable=True)), False),
        "m": (pa.map_(pa.string(), pa.field("value", pa.float64(), nullable=False)), False),
        "opt": (pa.string(), True),
        "opt_last": (pa.int32(), True),
        "ts_ms": (pa.timestamp("ms", tz="UTC"), False),
        "ts_us": (pa.timestamp("us", tz="UTC"), False),
        "lts_ms": (pa.timestamp("ms"), False),
        "lts_us": (pa.timestamp("us"), False),
        "day": (pa.date32(), False),
        "t_ms": (pa.time32("ms"), False),
        "t_us": (pa.time64("us"), False),
        "dec": (pa.decimal128(9, 2), False),
        "big": (pa.decimal256(50, 4), False),
        "id": (pa.string(), False),
        "ns": (pa.int64(), False),  # fastavro does not decode it: the underlying long
        "sub": (sub, True),
        "sub2": (sub, False),
    }
    assert has_uuid(fastavro.parse_schema(ALL)) and not has_uuid({"type": "long"})


def test_decoded_values_convert_to_the_mapped_type() -> None:
    import io
    from datetime import UTC, date, datetime, time
    from decimal import Decimal

    value = {
        "b": True,
        "i": 1,
        "l": 2,
        "f": 1.5,
        "d": 2.5,
        "s": "x",
        "raw": b"r",
        "fx": b"abcd",
        "fx2": b"efgh",
        "e": "GREEN",
        "arr": [1, None],
        "m": {"k": 1.0},
        "opt": None,
        "opt_last": 3,
        "ts_ms": datetime(2024, 5, 1, 12, tzinfo=UTC),
        "ts_us": datetime(2024, 5, 1, 12, 0, 0, 7, tzinfo=UTC),
        "lts_ms": datetime(2024, 5, 1, 12),
        "lts_us": datetime(2024, 5, 1, 12),
        "day": date(2024, 5, 1),
        "t_ms": time(1, 2, 3, 4000),
        "t_us": time(1, 2, 3, 4),
        "dec": Decimal("1.25"),
        "big": Decimal("12345678901234567890123456789012345678901.2345"),
        "id": "6c3e39b6-8d4c-4f57-9c8e-3b2f0f2b1f0a",
        "ns": 17,
        "sub": {"x": 1},
        "sub2": {"x": 2},
    }
    parsed = fastavro.parse_schema(ALL)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, value)
    decoded = fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), parsed)
    decoded["id"] = str(decoded["id"])  # uuid.UUID: has_uuid tells the sink to convert
    arr = pa.array([decoded, None], type=arrow_type(parsed))
    assert arr.to_pylist()[0] == {**value, "m": [("k", 1.0)]} and arr.to_pylist()[1] is None


@pytest.mark.parametrize(
    "schema",
    [
        ["null", "int", "string"],
        {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]},
    ],
)
def test_no_faithful_mapping_raises(schema: object) -> None:
    with pytest.raises(UnsupportedAvroType):
        arrow_type(fastavro.parse_schema(schema) if isinstance(schema, dict) else schema)


def test_arrow_field_carries_the_union_nullability() -> None:
    assert arrow_field("a", ["null", "long"]) == pa.field("a", pa.int64(), nullable=True)
    assert arrow_field("a", "long") == pa.field("a", pa.int64(), nullable=False)
