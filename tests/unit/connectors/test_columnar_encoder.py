"""The columnar Avro encoder writes exactly fastavro's bytes, row by row, for every type it accepts."""

from __future__ import annotations

import datetime as dt
import decimal
import math
import random
import uuid
from typing import Any

import pyarrow as pa
import pytest

from connectors.runtime.columnar import ColumnarEncoder, ColumnarUnsupported
from schemas.serde import AvroSerializer

D = decimal.Decimal
UTC = dt.UTC

VALUE = {
    "type": "record",
    "name": "everything",
    "namespace": "threes.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "i", "type": "int"},
        {"name": "n_i", "type": ["null", "int"], "default": None},
        {"name": "b", "type": "boolean"},
        {"name": "n_b", "type": ["null", "boolean"], "default": None},
        {"name": "f", "type": "float"},
        {"name": "d", "type": ["double", "null"]},
        {"name": "s", "type": "string"},
        {"name": "n_s", "type": ["null", "string"], "default": None},
        {"name": "raw", "type": ["null", "bytes"], "default": None},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 2}},
        {
            "name": "n_big",
            "type": ["null", {"type": "bytes", "logicalType": "decimal", "precision": 38, "scale": 9}],
            "default": None,
        },
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "n_ts_ms", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}], "default": None},
        {"name": "local", "type": ["null", {"type": "long", "logicalType": "local-timestamp-micros"}], "default": None},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
        {"name": "t_us", "type": ["null", {"type": "long", "logicalType": "time-micros"}], "default": None},
        {"name": "t_ms", "type": ["null", {"type": "int", "logicalType": "time-millis"}], "default": None},
        {"name": "u", "type": ["null", {"type": "string", "logicalType": "uuid"}], "default": None},
    ],
}
KEY = {"type": "record", "name": "everything_key", "fields": [{"name": "id", "type": "long"}]}

EDGE_INTS = [0, 1, -1, 63, -64, 64, -65, 127, 128, 8191, 8192, -8193, 2**31 - 1, -(2**31)]
EDGE_LONGS = [*EDGE_INTS, 2**35, -(2**35), 2**56, 2**62, 2**63 - 1, -(2**63)]
EDGE_UNSCALED = [
    0,
    1,
    -1,
    127,
    -127,
    128,
    -128,
    255,
    -255,
    256,
    -256,
    32767,
    -32768,
    32768,
    -32769,
    2**55,
    -(2**55),
    2**62,
    -(2**62),
    2**63 - 1,
    -(2**63 - 1),
    -(2**63),
]


def row(i: int, rnd: random.Random) -> dict[str, Any]:
    def maybe(v: Any) -> Any:
        return None if rnd.random() < 0.3 else v

    big = rnd.choice(
        [D("0"), D("123456789.123456789"), D("-0.000000001"), D("9223372036.854775807"), D("-9223372036.854775808")]
    )
    return {
        "id": EDGE_LONGS[i % len(EDGE_LONGS)] if i < 3 * len(EDGE_LONGS) else rnd.randint(-(2**63), 2**63 - 1),
        "i": EDGE_INTS[i % len(EDGE_INTS)],
        "n_i": maybe(rnd.randint(-(2**31), 2**31 - 1)),
        "b": bool(i % 2),
        "n_b": maybe(rnd.random() < 0.5),
        "f": rnd.choice([0.0, -1.5, 3.25, float("inf"), -float("inf"), 1e-30]),
        "d": maybe(rnd.choice([0.0, -0.0, math.pi, 1e308, -2.5e-308, float("nan")])),
        "s": rnd.choice(["", "a", "customer-42", "é€😀 unicode", "x" * 200]),
        "n_s": maybe("n" * rnd.randint(0, 130)),
        "raw": maybe(bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 20)))),
        "amount": D(EDGE_UNSCALED[i % len(EDGE_UNSCALED)]).scaleb(-2),
        "n_big": maybe(big),
        "ts": dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC) + dt.timedelta(seconds=rnd.randint(0, 2**33)),
        "n_ts_ms": maybe(
            dt.datetime(2013, 3, 10, 7, 0, tzinfo=UTC) + dt.timedelta(milliseconds=rnd.randint(-(10**9), 10**9))
        ),
        "local": maybe(dt.datetime(1900, 1, 1) + dt.timedelta(microseconds=rnd.randint(0, 2**62 // 1000))),
        "day": maybe(dt.date(1960, 1, 1) + dt.timedelta(days=rnd.randint(0, 40000))),
        "t_us": maybe(dt.time(rnd.randint(0, 23), rnd.randint(0, 59), rnd.randint(0, 59), rnd.randint(0, 999999))),
        "t_ms": maybe(dt.time(rnd.randint(0, 23), rnd.randint(0, 59), rnd.randint(0, 59), rnd.randint(0, 999) * 1000)),
        "u": maybe(str(uuid.UUID(int=rnd.getrandbits(128)))),
    }


def table_of(rows: list[dict[str, Any]], encoder: ColumnarEncoder) -> pa.Table:
    schema = encoder.arrow_schema
    return pa.table({f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in schema}, schema=schema)


def test_every_row_encodes_to_fastavro_s_bytes() -> None:
    rnd = random.Random(12)
    rows = [row(i, rnd) for i in range(3_000)]
    key_ser, value_ser = AvroSerializer(KEY), AvroSerializer(VALUE)
    encoder = ColumnarEncoder(VALUE, value_ser.header, KEY, key_ser.header)
    keys, values = encoder.encode(table_of(rows, encoder))
    assert len(keys) == len(values) == len(rows)
    for r, k, v in zip(rows, keys, values, strict=True):
        assert k == key_ser({"id": r["id"]}), r["id"]
        assert v == value_ser(r), r


def test_a_slice_of_a_table_and_several_chunks_encode_like_the_rows() -> None:
    rnd = random.Random(5)
    rows = [row(i, rnd) for i in range(400)]
    key_ser, value_ser = AvroSerializer(KEY), AvroSerializer(VALUE)
    encoder = ColumnarEncoder(VALUE, value_ser.header, KEY, key_ser.header)
    table = table_of(rows, encoder)
    two_chunks = pa.concat_tables([table.slice(0, 150), table.slice(150)])
    _, values = encoder.encode(two_chunks.slice(100, 200))
    assert values == [value_ser(r) for r in rows[100:300]]
    assert encoder.encode(table.slice(0, 0)) == ([], [])


def test_a_null_in_a_non_null_field_and_a_decimal_past_64_bits_are_refused_per_batch() -> None:
    key_ser, value_ser = AvroSerializer(KEY), AvroSerializer(VALUE)
    encoder = ColumnarEncoder(VALUE, value_ser.header, KEY, key_ser.header)
    rows = [row(i, random.Random(1)) for i in range(3)]
    rows[1]["s"] = None
    with pytest.raises(ValueError, match="'s'"):
        encoder.encode(table_of(rows, encoder))
    rows[1]["s"] = "ok"
    rows[2]["n_big"] = D("99999999999999999999.5")  # 10^29 unscaled
    with pytest.raises(ValueError, match="64 bits"):
        encoder.encode(table_of(rows, encoder))


@pytest.mark.parametrize(
    "field_type",
    [
        {"type": "array", "items": "long"},
        {"type": "map", "values": "long"},
        {"type": "enum", "name": "e", "symbols": ["A"]},
        {"type": "fixed", "name": "f", "size": 4},
        ["null", "long", "string"],
        {"type": "record", "name": "inner", "fields": [{"name": "x", "type": "long"}]},
    ],
)
def test_types_it_does_not_write_are_refused_up_front(field_type: Any) -> None:
    schema = {
        "type": "record",
        "name": "r",
        "fields": [{"name": "id", "type": "long"}, {"name": "x", "type": field_type}],
    }
    with pytest.raises(ColumnarUnsupported):
        ColumnarEncoder(schema, b"\xc3\x01" + bytes(8), KEY, b"\xc3\x01" + bytes(8))


def test_a_key_field_must_be_a_value_field_of_the_same_type() -> None:
    key = {"type": "record", "name": "k", "fields": [{"name": "id", "type": "int"}]}
    with pytest.raises(ColumnarUnsupported):
        ColumnarEncoder(VALUE, b"\xc3\x01" + bytes(8), key, b"\xc3\x01" + bytes(8))
