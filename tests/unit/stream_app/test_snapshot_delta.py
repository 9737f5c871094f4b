"""Small deltas decoded on the driver (fastavro) give exactly the overlay rows the JVM decoding gives."""

from __future__ import annotations

import datetime as dt
import decimal

import pyarrow as pa
import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from schemas.serde import AvroSerializer, fingerprint, schema_json
from stream_app.plan.model import Schema
from stream_app.plan.spark_types import spark_type
from stream_app.snapshot.arrow_tables import nullable_schema
from stream_app.snapshot.data import DELETED, LH, LK, OFFSET, PARTITION, TOPIC
from stream_app.snapshot.decoding import record_decoder
from stream_app.snapshot.delta import DriverDecoder, simple_key_field, spark_xxhash64, supported_schema

pytestmark = pytest.mark.spark

KEY = {"type": "record", "name": "Key", "namespace": "t", "fields": [{"name": "faa", "type": "string"}]}
V1 = {
    "type": "record",
    "name": "Airport",
    "namespace": "t",
    "fields": [
        {"name": "faa", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "alt", "type": "int"},
        {"name": "lat", "type": "double"},
        {"name": "tz", "type": ["null", "long"], "default": None},
        {"name": "opened", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "fee", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["SMALL", "LARGE"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "codes", "type": {"type": "map", "values": "int"}},
        {
            "name": "loc",
            "type": ["null", {"type": "record", "name": "Loc", "fields": [{"name": "x", "type": "float"}]}],
            "default": None,
        },
    ],
}
# the reader: a field added with a default, one dropped (Avro schema resolution)
V2 = {
    **V1,
    "fields": [f for f in V1["fields"] if f["name"] != "lat"]
    + [{"name": "country", "type": "string", "default": "US"}],
}


def value(i: int) -> dict:
    return {
        "faa": f"K{i:03d}",
        "name": f"airport é{i}",
        "alt": i,
        "lat": i / 3,
        "tz": None if i % 2 else -5,
        "opened": dt.datetime(2020, 1, 1, 12, i % 60, tzinfo=dt.UTC),
        "day": dt.date(2021, 3, 1 + i % 20),
        "fee": decimal.Decimal(f"{i}.25"),
        "kind": "LARGE" if i % 3 else "SMALL",
        "tags": [f"t{i}"] * (i % 3),
        "codes": {"a": i},
        "loc": {"x": 1.5} if i % 2 else None,
    }


def records(n: int = 20) -> pa.Table:
    key, val = AvroSerializer(KEY), AvroSerializer(V1)
    rows = []
    for i in range(n):  # two topics, two partitions, out of order, updates and tombstones
        topic, partition, offset = ("b", "a")[i % 2], i % 3 % 2, 100 - i
        rows.append((key({"faa": f"K{i % 7:03d}"}), None if i % 5 == 4 else val(value(i)), topic, partition, offset))
    cols = list(zip(*rows, strict=True))
    return pa.table(
        {
            "key": pa.array(cols[0], pa.binary()),
            "value": pa.array(cols[1], pa.binary()),
            "topic": pa.array(cols[2], pa.string()),
            "partition": pa.array(cols[3], pa.int32()),
            "offset": pa.array(cols[4], pa.int64()),
        }
    )


def log_schema(value_type: T.StructType) -> pa.Schema:
    spark_schema = T.StructType(
        [
            T.StructField(LK, T.StringType()),
            T.StructField(LH, T.LongType()),
            T.StructField(DELETED, T.BooleanType()),
            T.StructField(TOPIC, T.StringType()),
            T.StructField(PARTITION, T.IntegerType()),
            T.StructField(OFFSET, T.LongType()),
            *value_type.fields,
        ]
    )
    return nullable_schema(to_arrow_schema(spark_schema, timezone="UTC"))


def test_driver_decoding_equals_jvm_decoding(spark):
    writers = {fingerprint(s): schema_json(s) for s in (KEY, V1)}
    key_type = spark_type(spark, Schema(KEY, schema_json(KEY), fingerprint(KEY)))
    value_type = spark_type(spark, Schema(V2, schema_json(V2), fingerprint(V2)))
    rank = {"a": 0, "b": 1}
    raw = records()
    schema = log_schema(value_type)

    jvm = record_decoder(writers, schema_json(KEY), schema_json(V2), key_type, rank)(spark.createDataFrame(raw))
    expected = (
        jvm.select(LK, LH, DELETED, TOPIC, PARTITION, OFFSET, "__rank", "__v.*")
        .toArrow()
        .sort_by([("__rank", "ascending"), (PARTITION, "ascending"), (OFFSET, "ascending")])
        .select(schema.names)
        .cast(schema)
    )
    assert supported_schema(V2) and supported_schema(KEY)
    driver = DriverDecoder(writers, schema_json(KEY), schema_json(V2), simple_key_field(key_type), schema, rank)
    got = driver.decode(raw)

    assert got is not None and got.num_rows == 20
    assert got.schema.equals(expected.schema)
    assert got.to_pylist() == expected.to_pylist()
    assert got.column(DELETED).to_pylist().count(True) == 4


def test_spark_xxhash64_is_sparks(spark):
    keys = ["K0000000", "", "é", "a longer key with more than thirty-two bytes in it", None]
    got = spark.createDataFrame([(k,) for k in keys], "k string").select(F.xxhash64("k").alias("h")).collect()
    assert [spark_xxhash64(k) for k in keys[:-1]] == [r["h"] for r in got[:-1]]


def test_records_the_driver_cannot_decode_go_to_the_jvm_path(spark):
    writers = {fingerprint(s): schema_json(s) for s in (KEY, V1)}
    value_type = spark_type(spark, Schema(V1, schema_json(V1), fingerprint(V1)))
    driver = DriverDecoder(writers, schema_json(KEY), schema_json(V1), "faa", log_schema(value_type), {"a": 0})
    good = records(3)
    for bad_value in (b"not avro", b"\xc3\x01" + b"\x00" * 8 + b"\x02", good.column("value")[0].as_py()[:12]):
        bad = pa.concat_tables([good, good.slice(0, 1).set_column(1, "value", pa.array([bad_value], pa.binary()))])
        assert driver.decode(bad) is None  # no header, unknown writer schema, truncated body
    no_key = good.slice(0, 1).set_column(0, "key", pa.array([None], pa.binary()))
    assert driver.decode(no_key) is None


def test_schemas_whose_spark_form_differs_are_not_decoded_on_the_driver(spark):
    assert not supported_schema({"type": "record", "name": "U", "fields": [{"name": "u", "type": ["int", "string"]}]})
    assert not supported_schema({"type": "string", "logicalType": "uuid"})
    assert not supported_schema({"type": "int", "logicalType": "time-millis"})
    composite = T.StructType([T.StructField("a", T.StringType()), T.StructField("b", T.IntegerType())])
    assert simple_key_field(composite) is None
    assert simple_key_field(T.StructType([T.StructField("id", T.LongType())])) == "id"
