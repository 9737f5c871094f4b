"""Spark decodes the serde's bytes in the JVM (from_avro, no Python UDF), and the other way round."""

from __future__ import annotations

import datetime as dt
import decimal
import json

from confluent_kafka import Producer

from kernel.kafka.topics import ensure_compacted_topic
from schemas import load_schema
from schemas.serde import AvroDeserializer, AvroSerializer, canonical_form, fingerprint, parsing_fingerprint
from schemas.store import SchemaStore
from stream_app.avro import decode_avro, encode_avro, fingerprint_hex

AIRPORT = load_schema("nycflights13/airport")
AIRPORT_KEY = load_schema("nycflights13/airport_key")
# an older writer of the same entity: without `tzone`, with a field since removed
AIRPORT_V0 = {
    "type": "record",
    "name": "Airport",
    "namespace": "threes.nycflights13",
    "fields": [
        {"name": "faa", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "lat", "type": "double"},
        {"name": "lon", "type": "double"},
        {"name": "alt", "type": "int"},
        {"name": "tz", "type": ["null", "int"], "default": None},
        {"name": "dst", "type": ["null", "string"], "default": None},
        {"name": "icao", "type": ["null", "string"], "default": None},
    ],
}
TYPES = {
    "type": "record",
    "name": "Typed",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "blob", "type": ["null", "bytes"], "default": None},
    ],
}


def produce(kafka_conf, topic, records):
    producer = Producer({**kafka_conf, "acks": "all"})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def test_spark_from_avro_reads_serde_bytes_with_schema_evolution(spark, kafka_conf, topic):
    store = SchemaStore(kafka_conf, topic=f"{topic}.schemas")
    key_ser = AvroSerializer(AIRPORT_KEY, store)
    new, old = AvroSerializer(AIRPORT, store), AvroSerializer(AIRPORT_V0, store)
    rows = [
        {"faa": "EWR", "name": "Newark Liberty Intl", "lat": 40.69, "lon": -74.17, "alt": 18, "tz": -5, "dst": "A", "tzone": "America/New_York"},
        {"faa": "JFK", "name": "John F Kennedy Intl", "lat": 40.64, "lon": -73.78, "alt": 13, "tz": None, "dst": None, "tzone": None},
    ]
    old_row = {"faa": "LGA", "name": "La Guardia", "lat": 40.78, "lon": -73.87, "alt": 22, "tz": -5, "dst": "A", "icao": "KLGA"}
    ensure_compacted_topic(kafka_conf, topic)
    produce(
        kafka_conf,
        topic,
        [(key_ser({"faa": r["faa"]}), new(r)) for r in rows]
        + [(key_ser({"faa": "LGA"}), old(old_row)), (key_ser({"faa": "XXX"}), None), (b"k", b"\xc3\x01garbage!!")],
    )

    # a reader that has never seen these schemas resolves them from the schema topic
    writers = SchemaStore(kafka_conf, topic=f"{topic}.schemas").schemas_json()
    assert set(writers) == {fingerprint(AIRPORT_KEY), fingerprint(AIRPORT), fingerprint(AIRPORT_V0)}

    df = spark.read.format("kafka").option("kafka.bootstrap.servers", kafka_conf["bootstrap.servers"]).option(
        "subscribe", topic
    ).option("startingOffsets", "earliest").load()
    decoded = df.select(
        "offset",
        decode_avro(df.key, writers, json.dumps(AIRPORT_KEY)).alias("k"),
        decode_avro(df.value, writers, json.dumps(AIRPORT)).alias("v"),
        fingerprint_hex(df.value).alias("fp"),
        df.value.isNull().alias("tombstone"),
    ).orderBy("offset")
    got = [r.asDict(recursive=True) for r in decoded.collect()]

    assert [g["v"] for g in got[:2]] == rows
    assert got[0]["k"] == {"faa": "EWR"} and got[0]["fp"] == fingerprint(AIRPORT).hex()
    # old writer, new reader: `tzone` takes its default, `icao` is dropped
    assert got[2]["v"] == {**{k: v for k, v in old_row.items() if k != "icao"}, "tzone": None}
    assert got[3]["k"] == {"faa": "XXX"} and got[3]["v"] is None and got[3]["tombstone"]
    # a record whose fingerprint is unknown decodes to null, not to garbage, and is not a tombstone
    assert got[4]["v"] is None and not got[4]["tombstone"]


def test_jvm_fingerprint_matches_serde(spark):
    """Java's Rabin fingerprint agrees: of the Parsing Canonical Form, and of our logical canonical form."""
    jvm = spark.sparkContext._jvm
    normalization = jvm.org.apache.avro.SchemaNormalization
    for schema in (AIRPORT, AIRPORT_KEY, TYPES, "int"):
        text = json.dumps(schema)
        parsed = jvm.org.apache.avro.Schema.Parser().parse(text)
        java_pcf = normalization.parsingFingerprint64(parsed).to_bytes(8, "little", signed=True)
        assert java_pcf == parsing_fingerprint(schema)
        # a JVM producer frames exactly like the serde by fingerprinting canonical_form's text
        java_fp = normalization.fingerprint64(bytearray(canonical_form(schema).encode()))
        assert java_fp.to_bytes(8, "little", signed=True) == fingerprint(schema)
    assert fingerprint(TYPES) != parsing_fingerprint(TYPES)  # TYPES has logical types: they count now


def test_spark_to_avro_bytes_decode_in_python_with_logical_types(spark):
    from pyspark.sql import Row

    store_types = json.dumps(TYPES)
    fp = fingerprint(TYPES)
    row = Row(
        id=7,
        amount=decimal.Decimal("1234.56"),
        at=dt.datetime(2013, 1, 1, 6, 0, 0, 123456),
        day=dt.date(2013, 12, 31),
        blob=b"\x00\x01",
    )
    df = spark.createDataFrame([row], "id long, amount decimal(12,2), at timestamp, day date, blob binary")
    from pyspark.sql import functions as f

    data = df.select(encode_avro(f.struct(*df.columns), store_types, fp).alias("value")).first()["value"]

    class OneSchema:
        def get(self, wanted):
            assert wanted == fp
            from schemas.serde import parse

            return parse(TYPES)

    decoded = AvroDeserializer(OneSchema())(bytes(data))
    assert decoded["id"] == 7 and decoded["amount"] == decimal.Decimal("1234.56")
    assert decoded["at"] == dt.datetime(2013, 1, 1, 6, 0, 0, 123456, tzinfo=dt.UTC)  # session time zone is UTC
    assert decoded["day"] == dt.date(2013, 12, 31) and decoded["blob"] == b"\x00\x01"
