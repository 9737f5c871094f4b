"""Columnar decoding (schemas.columnar) against the per-record path (fastavro) on the same bytes."""

from __future__ import annotations

import datetime as dt
import decimal
import uuid

import pyarrow as pa
import pytest

from schemas.arrow import arrow_type
from schemas.columnar import ColumnarDecodeError, ColumnarDecoder
from schemas.serde import AvroDeserializer, AvroSerializer, parse, split
from schemas.store import InMemorySchemaStore

UTC = dt.UTC

# every Avro type schemas.arrow maps (maps excepted: polars cannot read them, see test below)
EVERY_TYPE = {
    "type": "record",
    "name": "Every",
    "namespace": "t",
    "fields": [
        {"name": "i", "type": "int"},
        {"name": "l", "type": ["null", "long"]},
        {"name": "f", "type": "float"},
        {"name": "d", "type": ["double", "null"]},
        {"name": "s", "type": "string"},
        {"name": "b", "type": "bytes"},
        {"name": "bo", "type": "boolean"},
        {"name": "ts_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "ts_ms", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
        {"name": "lts_us", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "lts_ms", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t_ms", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "t_us", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 4}},
        {
            "name": "dec_fixed",
            "type": {"type": "fixed", "name": "D8", "size": 8, "logicalType": "decimal", "precision": 12, "scale": 2},
        },
        {"name": "u", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "e", "type": {"type": "enum", "name": "Color", "symbols": ["RED", "GREEN"]}},
        {"name": "a", "type": {"type": "array", "items": "long"}},
        {"name": "a_null", "type": {"type": "array", "items": ["null", "string"]}},
        {
            "name": "r",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Inner",
                    "fields": [
                        {"name": "x", "type": "int"},
                        {"name": "y", "type": ["null", "string"]},
                        {"name": "when", "type": {"type": "long", "logicalType": "timestamp-micros"}},
                        {
                            "name": "amt",
                            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
                        },
                        {"name": "ok", "type": "boolean"},
                        {"name": "raw", "type": {"type": "fixed", "name": "F2", "size": 2}},
                        {"name": "tags", "type": {"type": "array", "items": "string"}},
                        {
                            "name": "deep",
                            "type": {"type": "record", "name": "Deep", "fields": [{"name": "z", "type": "long"}]},
                        },
                    ],
                },
            ],
        },
        {
            "name": "ra",
            "type": {
                "type": "array",
                "items": {"type": "record", "name": "Item", "fields": [{"name": "q", "type": ["null", "int"]}]},
            },
        },
        {"name": "fx", "type": {"type": "fixed", "name": "F4", "size": 4}},
    ],
}


def every_value(n: int) -> dict:
    return {
        "i": n - 3,
        "l": None if n % 3 == 0 else n * 10_000_000_000,
        "f": 1.5 * n,
        "d": None if n % 2 else n / 7,
        "s": f"s{n} é",
        "b": bytes([n % 256, 0]),
        "bo": n % 2 == 0,
        "ts_us": dt.datetime(2013, 1, 1, 5, tzinfo=UTC) + dt.timedelta(seconds=n, microseconds=7),
        "ts_ms": None if n % 2 else dt.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=UTC),
        "lts_us": dt.datetime(2013, 1, 1, 5, 0, 0, 123456),
        "lts_ms": dt.datetime(2013, 1, 1, 5, 0, 0, 123000),
        "day": dt.date(2013, 1, 2) + dt.timedelta(days=n),
        "t_ms": dt.time(1, 2, 3, 4000),
        "t_us": dt.time(23, 59, 59, 999999),
        "dec": decimal.Decimal("-1.2345") * n,
        "dec_fixed": decimal.Decimal("3.25"),
        "u": str(uuid.UUID(int=n)),
        "e": "GREEN" if n % 2 else "RED",
        "a": [1, 2, n] if n % 2 else [],
        "a_null": [None, "x"],
        "r": {
            "x": n,
            "y": None,
            "when": dt.datetime(2020, 2, 29, tzinfo=UTC),
            "amt": decimal.Decimal("9.99"),
            "ok": True,
            "raw": b"zz",
            "tags": ["a"],
            "deep": {"z": n},
        }
        if n % 2
        else None,
        "ra": [{"q": None}, {"q": n}] if n % 2 else [],
        "fx": b"abcd",
    }


def encode(schema: dict, values: list[dict]) -> tuple[InMemorySchemaStore, bytes, list[bytes]]:
    store = InMemorySchemaStore()
    ser = AvroSerializer(schema, store)
    messages = [ser(v) for v in values]
    return store, split(messages[0])[0], messages


def test_columnar_equals_per_record_for_every_mapped_type() -> None:
    values = [every_value(n) for n in range(50)]
    store, fp, messages = encode(EVERY_TYPE, values)
    decoder = ColumnarDecoder(store)
    assert decoder.supports(fp)
    table = decoder.decode(fp, [split(m)[1] for m in messages])
    per_record = [AvroDeserializer(store)(m) for m in messages]
    assert table.num_rows == len(values)
    # the table has exactly schemas.arrow's types
    assert table.schema == pa.schema(list(arrow_type(parse(EVERY_TYPE))))
    for row, expected in zip(table.to_pylist(), per_record, strict=True):
        expected = {**expected, "u": str(expected["u"])}  # fastavro gives uuid.UUID, Arrow the string
        assert row == expected
    # and what was written is what was read
    assert [r["dec"] for r in table.to_pylist()] == [v["dec"] for v in values]


def test_fields_with_defaults_decode_columnar() -> None:
    # polars' reader refused a block whose schema had a non-null default (avro-error: OutOfSpec)
    schema = {"type": "record", "name": "D", "fields": [
        {"name": "a", "type": "long"}, {"name": "n", "type": "int", "default": 7},
        {"name": "s", "type": "string", "default": "x"}, {"name": "o", "type": ["null", "long"], "default": None},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["P", "Q"], "default": "P"}, "default": "Q"}]}
    values = [{"a": n, "n": n * 2, "s": f"s{n}", "o": n if n % 2 else None, "e": "PQ"[n % 2]} for n in range(5)]
    store, fp, messages = encode(schema, values)
    decoder = ColumnarDecoder(store)
    assert decoder.supports(fp)
    assert decoder.decode(fp, [split(m)[1] for m in messages]).to_pylist() == values


def test_a_body_with_extra_bytes_is_caught_not_shifted() -> None:
    # only longs: a shifted read still decodes, so only the row numbers can tell
    schema = {"type": "record", "name": "L", "fields": [{"name": "a", "type": "long"}, {"name": "b", "type": "long"}]}
    store, fp, messages = encode(schema, [{"a": n, "b": -n} for n in range(10)])
    bodies = [bytes(split(m)[1]) for m in messages]
    decoder = ColumnarDecoder(store)
    assert decoder.decode(fp, bodies).column("a").to_pylist() == list(range(10))
    bodies[4] += b"\x02"  # fastavro would read this body alone; in a block it would shift every later record
    with pytest.raises(ColumnarDecodeError, match="misaligned"):
        decoder.decode(fp, bodies)


@pytest.mark.parametrize("bad", [b"", b"\xff\xff\xff\xff\x0f", b"\x02"])
def test_a_truncated_or_garbage_body_fails_the_block(bad: bytes) -> None:
    store, fp, messages = encode(EVERY_TYPE, [every_value(n) for n in range(10)])
    bodies = [bytes(split(m)[1]) for m in messages]
    bodies[5] = bad
    with pytest.raises(ColumnarDecodeError):
        ColumnarDecoder(store).decode(fp, bodies)


@pytest.mark.parametrize(
    "field_type",
    [
        {"type": "map", "values": "long"},  # polars 2.1 panics on maps
        ["null", "long", "string"],  # no faithful Arrow type
        "null",  # polars 2.1 cannot read a null field
    ],
)
def test_schemas_without_a_columnar_reading_are_decoded_per_record(field_type) -> None:
    schema = {"type": "record", "name": "M", "fields": [{"name": "m", "type": field_type}]}
    value = {"a": 1} if isinstance(field_type, dict) else None if field_type == "null" else 5
    store, fp, _messages = encode(schema, [{"m": value}])
    decoder = ColumnarDecoder(store)
    assert not decoder.supports(fp)
    with pytest.raises(ColumnarDecodeError):
        decoder.decode(fp, [b"\x00"])


def test_a_non_record_value_is_decoded_per_record() -> None:
    store, fp, _ = encode({"type": "array", "items": "long"}, [[1]])
    assert not ColumnarDecoder(store).supports(fp)


def test_python_objects_of_scalar_and_record_columns_equal_to_pylist() -> None:
    import pyarrow as pa

    from schemas.columnar import _python_objects

    n = 50
    record = pa.StructArray.from_arrays(
        [pa.array(range(n)), pa.array([f"é{i}" for i in range(n)]), pa.array([i / 3 for i in range(n)]),
         pa.array([i % 2 == 0 for i in range(n)]), pa.array(range(n), pa.int16())],
        names=["year", "carrier", "x", "b", "flight"],
    )
    with_null_field = pa.StructArray.from_arrays([pa.array([1, None, 3])], names=["a"])
    columns = [
        pa.chunked_array([record.slice(0, 7), record.slice(7)]),  # chunks, one with an offset
        pa.chunked_array([record.slice(11, 5)]),
        pa.chunked_array([pa.array(range(n), pa.int32())]),
        pa.chunked_array([pa.array(["a", "é", ""])]),
        pa.chunked_array([pa.array([1, None, 2])]),  # nulls: to_pylist's path
        pa.chunked_array([with_null_field]),
        pa.chunked_array([pa.array([{"d": 1}], pa.struct([("d", pa.date32())]))]),  # a date field: to_pylist's path
    ]
    for column in columns:
        got, want = _python_objects(column), column.to_pylist()
        assert got == want
        assert [type(v) for v in got] == [type(v) for v in want]
        if want and isinstance(want[0], dict):
            assert [[type(v) for v in d.values()] for d in got] == [[type(v) for v in d.values()] for d in want]


def test_row_numbers_past_the_table_are_avro_longs() -> None:
    from schemas.columnar import _row_numbers, _zigzag

    n = (1 << 20) + 3  # 1, 2, 3 and 4 encoded bytes
    rows = _row_numbers(n)
    assert len(rows) == n
    edges = [0, 63, 64, 8191, 8192, 16383, 16384, 16385, (1 << 20) - 1, 1 << 20, (1 << 20) + 2]
    for i in [*edges, *range(16380, 16400), *range(n - 10, n), *range(16384, n, 997)]:
        assert rows[i] == _zigzag(i), i


def test_a_block_of_more_rows_than_the_table_decodes_in_order() -> None:
    schema = {"type": "record", "name": "L", "fields": [{"name": "a", "type": "long"}]}
    n = 40_000  # row numbers past the precomputed 16,384 take the numpy path
    store, fp, messages = encode(schema, [{"a": -i} for i in range(n)])
    table = ColumnarDecoder(store).decode(fp, [split(m)[1] for m in messages])
    assert table.column("a").to_pylist() == [-i for i in range(n)]
