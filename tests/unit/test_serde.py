"""The Avro single-object serde: wire format, round trip, evolution, errors."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from schemas import load_schema
from schemas.exceptions import NotSingleObjectError, SerdeError, UnknownSchemaError
from schemas.serde import MARKER, AvroDeserializer, AvroSerializer, fingerprint, split
from schemas.store import InMemorySchemaStore

V1 = {
    "type": "record",
    "name": "Plane",
    "namespace": "t",
    "fields": [
        {"name": "tailnum", "type": "string"},
        {"name": "year", "type": ["null", "int"], "default": None},
        {"name": "seats", "type": "int", "default": 0},
    ],
}
# v2 adds an optional field and removes `seats` (which has a default in v1)
V2 = {
    "type": "record",
    "name": "Plane",
    "namespace": "t",
    "fields": [
        {"name": "tailnum", "type": "string"},
        {"name": "year", "type": ["null", "int"], "default": None},
        {"name": "manufacturer", "type": ["null", "string"], "default": None},
    ],
}
KEY = {
    "type": "record",
    "name": "WeatherKey",
    "fields": [
        {"name": "origin", "type": "string"},
        {"name": "time_hour", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def test_wire_format_is_single_object_encoding():
    store = InMemorySchemaStore()
    data = AvroSerializer(V1, store)({"tailnum": "N10156", "year": 2004, "seats": 55})
    assert data[:2] == MARKER == b"\xc3\x01"
    fp, body = split(data)
    assert fp == fingerprint(V1) and len(fp) == 8
    # body: string "N10156" (zigzag length 12 = 0x0c), union branch 1 (0x02), 2004, 55
    assert bytes(body) == b"\x0cN10156" + b"\x02" + b"\xa8\x1f" + b"\x6e"


def test_fingerprint_ignores_docs_and_defaults_and_matches_avro_vector():
    # "int" -> 0x7275d51a3f395c8f written little-endian; the same value comes out of Java Avro's
    # SchemaNormalization.parsingFingerprint64 in tests/integration/test_spark_avro.py
    assert fingerprint('"int"') == (0x7275D51A3F395C8F).to_bytes(8, "little")
    with_doc = {**V1, "doc": "a plane"}
    assert fingerprint(with_doc) == fingerprint(V1)
    assert fingerprint(V2) != fingerprint(V1)


def test_round_trip_with_logical_types_and_composite_key():
    store = InMemorySchemaStore()
    ser, de = AvroSerializer(KEY, store), AvroDeserializer(store)
    key = {"origin": "EWR", "time_hour": dt.datetime(2013, 1, 1, 6, tzinfo=dt.UTC)}
    assert de(ser(key)) == key
    money = {
        "type": "record",
        "name": "M",
        "fields": [{"name": "v", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}}],
    }
    ser_m = AvroSerializer(money, store)
    assert de(ser_m({"v": decimal.Decimal("1234.56")})) == {"v": decimal.Decimal("1234.56")}


def test_tombstone_stays_none():
    store = InMemorySchemaStore()
    assert AvroSerializer(V1, store)(None) is None
    assert AvroDeserializer(store)(None) is None


@pytest.mark.parametrize(
    ("writer", "reader", "record", "expected"),
    [
        # old data, new reader: added optional field gets its default, removed field dropped
        (V1, V2, {"tailnum": "N1", "year": 1999, "seats": 5}, {"tailnum": "N1", "year": 1999, "manufacturer": None}),
        # new data, old reader: unknown field skipped, removed field gets its default
        (V2, V1, {"tailnum": "N2", "year": None, "manufacturer": "BOEING"}, {"tailnum": "N2", "year": None, "seats": 0}),
        # no reader schema: the writer's own shape
        (V2, None, {"tailnum": "N3", "year": 1, "manufacturer": "X"}, {"tailnum": "N3", "year": 1, "manufacturer": "X"}),
    ],
)
def test_schema_evolution(writer, reader, record, expected):
    store = InMemorySchemaStore()
    data = AvroSerializer(writer, store)(record)
    assert AvroDeserializer(store, reader_schema=reader)(data) == expected


def test_unknown_fingerprint_is_a_clear_error():
    data = AvroSerializer(V1)({"tailnum": "N1", "year": None, "seats": 1})  # not registered anywhere
    with pytest.raises(UnknownSchemaError) as exc:
        AvroDeserializer(InMemorySchemaStore())(data)
    assert fingerprint(V1).hex() in str(exc.value)
    assert exc.value.fingerprint == fingerprint(V1)


def test_not_single_object_and_bad_values():
    with pytest.raises(NotSingleObjectError, match="expected marker c301, found 7b22"):
        AvroDeserializer(InMemorySchemaStore())(b'{"json": true}')
    with pytest.raises(SerdeError, match="does not match schema"):
        AvroSerializer(V1)({"tailnum": 42, "seats": "many"})


def test_shipped_schema_loads_by_name():
    airport = load_schema("nycflights13/airport")
    assert airport["name"] == "Airport"
    with pytest.raises(Exception, match="not found"):
        load_schema("nope/nothing")


def test_a_schema_that_is_not_found_lists_each_place_looked_at_once(tmp_path) -> None:
    from schemas import load_schema
    from schemas.exceptions import SchemaNotFoundError

    with pytest.raises(SchemaNotFoundError) as err:
        load_schema(str(tmp_path / "nothere.avsc"))
    assert str(err.value).count(str(tmp_path / "nothere.avsc")) == 2  # the reference, then one place looked at
    with pytest.raises(SchemaNotFoundError) as err:
        load_schema("nothere.avsc", base_dir=tmp_path)
    assert str(err.value).count("nothere.avsc") == 3  # the reference, the config's folder, the shipped schemas
