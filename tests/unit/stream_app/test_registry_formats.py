"""The stream job's registry and Debezium formats: config checks and the pure parts (no services, no Spark)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from schemas.debezium import UNAVAILABLE, after_schema, envelope_reader
from schemas.exceptions import ConfigError
from stream_app.config import StreamJobConfig
from stream_app.realtime import realtime_problems
from stream_app.snapshot.arrow_tables import fill_unavailable
from stream_app.snapshot.data import DELETED, LK
from stream_app.writers import registry_subjects
from threes.config import pipeline_from_dict

NS = "dbserver1.public.customers"
ROW = {"type": "record", "name": "Value", "namespace": NS, "fields": [
    {"name": "id", "type": "int"}, {"name": "bio", "type": ["null", "string"], "default": None}]}
ENVELOPE = {"type": "record", "name": "Envelope", "namespace": NS, "fields": [
    {"name": "before", "type": ["null", ROW], "default": None},
    {"name": "after", "type": ["null", "Value"], "default": None},  # Debezium names the row defined in before
    {"name": "op", "type": "string"},
]}


def _stream(events: dict | None = None, **snapshot) -> dict:
    return {
        "events": {"topic": "orders", "value_schema": "x.avsc", **(events or {})},
        "snapshots": [{"name": "customers", "topics": ["db.customers"], **snapshot}],
        "enriched_topic": "orders.enriched", "dead_letter_topic": "orders.dlq", "checkpoint_location": "/tmp/c",
    }


def _pipeline(stream: dict, registry: bool) -> dict:
    kafka = {"bootstrap_servers": "127.0.0.1:19092"}
    if registry:
        kafka["schema_registry"] = {"url": "mock://unit"}
    return {"kafka": kafka, "stream": stream}


def test_confluent_avro_in_the_stream_needs_a_registry_naming_each_key():
    stream = _stream({"value_format": "confluent_avro"}, key_format="confluent_avro", value_format="confluent_avro")
    with pytest.raises(ConfigError) as info:
        pipeline_from_dict(_pipeline(stream, registry=False))
    text = str(info.value)
    for path in ("stream.events.value_format", "stream.snapshots.0.key_format", "stream.snapshots.0.value_format"):
        assert path in text.replace("[", ".").replace("]", ""), (path, text)
    assert "kafka.schema_registry" in text
    pipe = pipeline_from_dict(_pipeline(stream, registry=True))
    assert registry_subjects(pipe.stream) == ["orders-value", "db.customers-key", "db.customers-value"]


def test_default_formats_are_unchanged_and_follow_no_subject():
    pipe = pipeline_from_dict(_pipeline(_stream(), registry=False))
    snap = pipe.stream.snapshots[0]
    assert (pipe.stream.events.value_format, snap.key_format, snap.value_format, snap.envelope) == (
        "avro", "avro", "avro", "none")
    assert registry_subjects(pipe.stream) == []


def test_connect_json_needs_reader_schemas_and_debezium_no_retention():
    with pytest.raises(ValueError, match="key_format connect_json needs key_schema"):
        StreamJobConfig.model_validate(_stream(key_format="connect_json", value_schema="v.avsc"))
    with pytest.raises(ValueError, match="value_format connect_json needs value_schema"):
        StreamJobConfig.model_validate(_stream(value_format="connect_json"))
    with pytest.raises(ValueError, match="retention"):
        StreamJobConfig.model_validate(_stream(envelope="debezium", retention="1 day"))


def test_realtime_mode_refuses_registry_connect_and_debezium_naming_the_key():
    stream = StreamJobConfig.model_validate({
        **_stream({"value_format": "confluent_avro"}, key_format="confluent_avro", value_format="connect_json",
                  value_schema="v.avsc", envelope="debezium"),
        "mode": "realtime",
    })
    problems = dict(realtime_problems(stream))
    assert set(problems) == {"events.value_format", "snapshots[0].key_format", "snapshots[0].value_format",
                             "snapshots[0].envelope"}
    assert "single-object" in problems["snapshots[0].key_format"]
    assert realtime_problems(stream.model_copy(update={"mode": "microbatch"})) == []


def test_after_schema_resolves_the_row_debezium_names_in_after():
    row = after_schema(ENVELOPE)
    assert row["name"] == "Value" and row["namespace"] == NS and [f["name"] for f in row["fields"]] == ["id", "bio"]
    with pytest.raises(ValueError, match="not a Debezium envelope"):
        after_schema(ROW)


def test_envelope_reader_reads_after_and_op_under_the_writers_names():
    mine = {"type": "record", "name": "Customer", "namespace": "app", "fields": [{"name": "id", "type": "int"}]}
    reader = envelope_reader(mine, [ENVELOPE])
    assert reader["name"] == f"{NS}.Envelope" and [f["name"] for f in reader["fields"]] == ["after", "op"]
    assert reader["fields"][0]["type"][1]["aliases"] == [f"{NS}.Value"]  # the writer's row name resolves to mine


def _log(rows: list[tuple[str, bool, str | None, int]]) -> pa.Table:
    return pa.table({LK: [r[0] for r in rows], DELETED: [r[1] for r in rows], "bio": [r[2] for r in rows],
                     "n": [r[3] for r in rows]})


def test_fill_unavailable_takes_the_previous_value_in_the_log_then_the_snapshot():
    changes = _log([
        ("1", False, "first", 1),
        ("1", False, UNAVAILABLE, 2),  # TOASTed: the row just before in the same log
        ("2", False, UNAVAILABLE, 3),  # TOASTed: the snapshot's current row
        ("3", False, None, 4),
        ("3", True, None, 5),
        ("3", False, UNAVAILABLE, 6),  # after a delete: nothing to keep
        ("4", False, UNAVAILABLE, 7),  # never seen: null
        ("5", False, None, 8),  # a real null is a value
        ("5", False, UNAVAILABLE, 9),
    ])
    asked = []

    def previous(keys):
        asked.append(sorted(keys))
        return {"2": {"bio": "from the snapshot", "n": 0}, "5": {"bio": "older", "n": 0}}

    out = fill_unavailable(changes, previous)
    assert out.column("bio").to_pylist() == ["first", "first", "from the snapshot", None, None, None, None, None, None]
    assert out.column("n").to_pylist() == list(range(1, 10))
    assert asked == [["1", "2", "3", "4", "5"]]


def test_fill_unavailable_leaves_a_log_without_placeholders_alone():
    changes = _log([("1", False, "a", 1)])
    assert fill_unavailable(changes, lambda keys: pytest.fail("no lookup without a placeholder")) is changes


def _connect(payload: dict | None, schema: dict) -> bytes | None:
    import json

    return None if payload is None else json.dumps({"schema": schema, "payload": payload}).encode()


def test_debezium_connect_json_records_decode_to_rows_deletes_and_skipped_truncates(spark):
    """record_decoder on Kafka-shaped rows: after is the value, d and tombstones delete, t is no record."""
    from pyspark.sql import types as T

    from schemas.serde import schema_json
    from stream_app.snapshot.decoding import RecordFormats, record_decoder

    key_type = T.StructType([T.StructField("id", T.IntegerType())])
    row_type = T.StructType([T.StructField("id", T.IntegerType()), T.StructField("bio", T.StringType()),
                             T.StructField("seen", T.TimestampType())])
    key_schema = {"type": "struct", "fields": [{"type": "int32", "optional": False, "field": "id"}]}
    row = {"type": "struct", "optional": True, "fields": [
        {"type": "int32", "optional": False, "field": "id"}, {"type": "string", "optional": True, "field": "bio"},
        {"type": "int64", "optional": True, "name": "org.apache.kafka.connect.data.Timestamp", "field": "seen"}]}
    envelope = {"type": "struct", "fields": [{**row, "field": "before"}, {**row, "field": "after"},
                                             {"type": "string", "optional": False, "field": "op"}]}
    rows = [
        ({"id": 1}, {"before": None, "after": {"id": 1, "bio": "a", "seen": 86_400_000}, "op": "c"}),
        ({"id": 2}, {"before": {"id": 2, "bio": None, "seen": None}, "after": None, "op": "d"}),
        ({"id": 2}, None),
        ({"id": 3}, {"before": None, "after": None, "op": "t"}),
        ({"id": 4}, None),
    ]
    raw = spark.createDataFrame(
        [(_connect(k, key_schema), _connect(v, envelope), "t", 0, i) for i, (k, v) in enumerate(rows)],
        "key binary, value binary, topic string, partition int, offset long",
    )
    key_avro = {"type": "record", "name": "Key", "fields": [{"name": "id", "type": "int"}]}
    row_avro = {"type": "record", "name": "Value", "fields": [
        {"name": "id", "type": "int"}, {"name": "bio", "type": ["null", "string"]},
        {"name": "seen", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]}]}
    formats = RecordFormats(value_format="connect_json", debezium=True, value_type=row_type)
    decoded = record_decoder({}, schema_json(key_avro), schema_json(row_avro), key_type, {"t": 0}, "connect_json",
                             formats=formats)(raw)
    got = {r["__offset"]: r for r in decoded.select("__offset", "__lk", "__deleted", "__error", "__v").collect()}
    assert sorted(got) == [0, 1, 2, 4]  # the truncate is not a record of the snapshot
    assert got[0]["__lk"] == "1" and not got[0]["__deleted"] and got[0]["__error"] is None
    assert got[0]["__v"]["bio"] == "a" and got[0]["__v"]["seen"].timestamp() == 86_400  # Connect's ms
    assert got[1]["__deleted"] and got[2]["__deleted"] and got[4]["__deleted"]
    assert all(got[o]["__error"] is None for o in got)
