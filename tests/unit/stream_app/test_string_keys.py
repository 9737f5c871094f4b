"""Snapshots of topics keyed by plain UTF-8 strings (``key_format: string``, Kafka Streams' Serdes.String())."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pydantic import ValidationError

from kernel.exceptions import ConfigError
from schemas.serde import AvroSerializer, fingerprint, schema_json
from stream_app.config import LookupConfig, StreamJobConfig
from stream_app.enrich import BoundLookup, enrich
from stream_app.plan import build_plan
from stream_app.plan.model import Schema
from stream_app.plan.spark_types import spark_type
from stream_app.snapshot.arrow_tables import nullable_schema
from stream_app.snapshot.data import DELETED, ERROR, LH, LK, OFFSET, PARTITION, TOPIC, latest_per_key
from stream_app.snapshot.decoding import record_decoder
from stream_app.snapshot.delta import DriverDecoder, simple_key_field
from stream_app.snapshot.view import SnapshotView
from stream_app.snapshot_config import SnapshotConfig

# the Kafka Streams reference's value schema (anchors/kstreams-ref Schemas.java)
REF = {
    "type": "record",
    "name": "Ref",
    "namespace": "bench",
    "fields": [
        {"name": "name", "type": "string"},
        {"name": "category", "type": "string"},
        {"name": "score", "type": "double"},
        {"name": "updated_ms", "type": "long"},
    ],
}
EVENT = {
    "type": "record",
    "name": "Event",
    "namespace": "bench",
    "fields": [
        {"name": "eid", "type": "long"},
        {"name": "fk", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "ts", "type": "long"},
    ],
}


def snapshot(**extra) -> dict:
    return {"name": "refs", "topics": ["ref"], "value_schema": "ref.avsc", **extra}


def job_config(tmp_path, **snap) -> StreamJobConfig:
    (tmp_path / "ref.avsc").write_text(json.dumps(REF))
    (tmp_path / "event.avsc").write_text(json.dumps(EVENT))
    return StreamJobConfig.model_validate(
        {
            "events": {"topic": "events", "value_schema": "event.avsc"},
            "snapshots": [snapshot(**snap)],
            "lookups": [{"snapshot": "refs", "on": {"fk": snap.get("key_field", "key")}, "prefix": "ref_"}],
            "enriched_topic": "enriched",
            "dead_letter_topic": "dlq",
            "checkpoint_location": str(tmp_path / "cp"),
        }
    )


def test_key_schema_applies_to_avro_keys_only():
    assert SnapshotConfig.model_validate(snapshot(key_format="string")).key_schema is None
    assert SnapshotConfig.model_validate(snapshot(key_schema="k.avsc")).key_format == "avro"  # the default
    for bad, reason in (
        (snapshot(key_format="string", key_schema="k.avsc"), "does not apply to key_format string"),
        (snapshot(key_schema="k.avsc", key_field="id"), "key_field applies to key_format string only"),
        (snapshot(key_format="json"), "key_format"),
    ):
        with pytest.raises(ValidationError, match=reason):
            SnapshotConfig.model_validate(bad)


def test_plan_gives_a_string_key_one_field_named_by_key_field(tmp_path):
    plan = build_plan(job_config(tmp_path, key_format="string", key_field="id"), None, tmp_path)
    key = plan.snapshots["refs"].key.avro
    assert [(f["name"], f["type"]) for f in key["fields"]] == [("id", "string")]
    names = [f["name"] for f in plan.enriched.avro["fields"]]
    assert names == ["eid", "fk", "amount", "ts", "ref_name", "ref_category", "ref_score", "ref_updated_ms"]
    default = build_plan(job_config(tmp_path, key_format="string"), None, tmp_path)
    assert default.snapshots["refs"].key.avro["fields"][0]["name"] == "key"
    # a lookup must name the key field
    bad = job_config(tmp_path, key_format="string", key_field="id").model_dump()
    bad["lookups"][0]["on"] = {"fk": "key"}
    with pytest.raises(ConfigError, match=r"lookups\[0\]\.on\.fk"):
        build_plan(StreamJobConfig.model_validate(bad), None, tmp_path)


def raw_records() -> pa.Table:
    """Records as Spark's Kafka source gives them: string keys, Avro values, an update, a tombstone, no key."""
    ser = AvroSerializer(REF)

    def ref(i: int, name: str | None = None) -> bytes:
        return ser({"name": name or f"customer-{i}", "category": f"segment-{i % 3}", "score": i / 2, "updated_ms": i})

    rows = [
        (b"k0", ref(0), 0, 0),
        (b"k1", ref(1), 1, 0),
        ("k\u00e9".encode(), ref(2), 0, 1),  # a non-ASCII key: UTF-8 bytes
        (b"k1", ref(1, "customer-1 RENAMED"), 1, 1),
        (b"k0", None, 0, 2),  # tombstone
        (None, ref(9), 1, 2),  # a record without a key: a dead letter
    ]
    return pa.table(
        {
            "key": pa.array([r[0] for r in rows], pa.binary()),
            "value": pa.array([r[1] for r in rows], pa.binary()),
            "topic": pa.array(["ref"] * len(rows), pa.string()),
            "partition": pa.array([r[2] for r in rows], pa.int32()),
            "offset": pa.array([r[3] for r in rows], pa.int64()),
        }
    )


@pytest.fixture
def types(spark):
    from stream_app.avro_schemas import string_key_schema

    key = string_key_schema("refs", "id")
    key_type = spark_type(spark, Schema(key, schema_json(key), fingerprint(key)))
    value_type = spark_type(spark, Schema(REF, schema_json(REF), fingerprint(REF)))
    return schema_json(key), key_type, value_type


@pytest.mark.spark
def test_string_keys_decode_load_and_join(spark, types):
    key_json, key_type, value_type = types
    writers = {fingerprint(REF): schema_json(REF)}
    decoded = record_decoder(writers, key_json, schema_json(REF), key_type, {"ref": 0}, "string")(
        spark.createDataFrame(raw_records())
    ).cache()
    errors = [(r[PARTITION], r[OFFSET], r[ERROR]) for r in decoded.filter(decoded[ERROR].isNotNull()).collect()]
    assert errors == [(1, 2, "record has no key")]
    base = latest_per_key(decoded).cache()
    assert sorted((r[LK], r["name"]) for r in base.collect()) == [
        ("k1", "customer-1 RENAMED"),
        ("k\u00e9", "customer-2"),
    ]
    view = SnapshotView("refs", key_type, value_type, {}, "broadcast", base.count(), base_df=base)
    events = spark.createDataFrame([(1, "k1"), (2, "k0"), (3, "k\u00e9"), (4, "k7")], "eid long, fk string")
    lookup = BoundLookup(LookupConfig(snapshot="refs", on={"fk": "id"}, prefix="ref_"), view)
    got = {r["eid"]: r.asDict() for r in enrich(events, [lookup]).collect()}
    assert got[1]["ref_name"] == "customer-1 RENAMED" and got[1]["ref_category"] == "segment-1"
    assert got[2]["ref_name"] is None  # deleted by its tombstone
    assert got[3]["ref_name"] == "customer-2" and got[3]["ref_score"] == 1.0
    assert got[4]["ref_name"] is None  # never in the snapshot: left join keeps it


@pytest.mark.spark
def test_driver_decoding_of_string_keys_equals_jvm_decoding(spark, types):
    from pyspark.sql import types as T
    from pyspark.sql.pandas.types import to_arrow_schema

    key_json, key_type, value_type = types
    writers = {fingerprint(REF): schema_json(REF)}
    raw = raw_records().slice(0, 5)  # the keyless record needs the JVM path (its dead letter)
    fields = [
        (LK, T.StringType()),
        (LH, T.LongType()),
        (DELETED, T.BooleanType()),
        (TOPIC, T.StringType()),
        (PARTITION, T.IntegerType()),
        (OFFSET, T.LongType()),
    ]
    spark_schema = T.StructType([T.StructField(n, t) for n, t in fields] + list(value_type.fields))
    schema = nullable_schema(to_arrow_schema(spark_schema, timezone="UTC"))
    jvm = record_decoder(writers, key_json, schema_json(REF), key_type, {"ref": 0}, "string")(
        spark.createDataFrame(raw)
    )
    expected = (
        jvm.select(LK, LH, DELETED, TOPIC, PARTITION, OFFSET, "__v.*")
        .toArrow()
        .sort_by([(PARTITION, "ascending"), (OFFSET, "ascending")])
        .cast(schema)
    )
    driver = DriverDecoder(
        writers, key_json, schema_json(REF), simple_key_field(key_type), schema, {"ref": 0}, "string"
    )
    got = driver.decode(raw)
    assert got is not None and got.to_pylist() == expected.to_pylist()
    assert got.column(LK).to_pylist() == ["k0", "k\u00e9", "k0", "k1", "k1"]
    assert got.column(DELETED).to_pylist() == [False, False, True, False, False]
    # an Avro-keyed decoder would not take these keys as they are
    avro = DriverDecoder(writers, key_json, schema_json(REF), "id", schema, {"ref": 0})
    assert avro.decode(raw) is None
    invalid = raw.slice(0, 1).set_column(0, "key", pa.array([b"\xff\xfe"], pa.binary()))
    assert driver.decode(invalid) is None  # not UTF-8: the JVM path decodes it as Spark's cast does
