"""Pure parts of the sinks: newest-per-key, object names and encodings, Avro to SQL types."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import JSON, BigInteger, DateTime, Integer, Numeric, Text

from connectors.api.sink_records import SinkBatch, SinkRecord, latest_per_key
from connectors.rds.sink_types import sql_type, table_from_avro
from connectors.s3.config import S3SinkConfig
from connectors.s3.sink import S3Sink, encode_avro, encode_jsonl, encode_parquet
from connectors.s3.sink_objects import object_key
from kernel.exceptions import FatalError

SCHEMA = {
    "type": "record",
    "name": "Item",
    "namespace": "t",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
PARSED = fastavro.parse_schema(SCHEMA)


def rec(key, version, offset, value=None, fp=b"f" * 8) -> SinkRecord:
    return SinkRecord(
        "t",
        0,
        offset,
        key,
        value,
        version,
        timestamp_ms=1_714_564_800_000,
        value_schema=PARSED if value is not None else None,
        value_fingerprint=fp if value is not None else None,
    )


def test_latest_per_key_keeps_highest_version_then_last_offset() -> None:
    records = [
        rec(1, 5, 0, {}),
        rec(2, 1, 1, {}),
        rec(1, 3, 2, {}),
        rec(2, 1, 3),
        rec({"a": 1, "b": 2}, 1, 4, {}),
        rec({"b": 2, "a": 1}, 2, 5, {}),
    ]
    out = latest_per_key(records)
    assert [(r.offset, r.version) for r in out] == [(0, 5), (3, 1), (5, 2)]


def test_latest_per_key_record_keys_with_arrays_and_scalar_lookalikes() -> None:
    records = [
        rec({"id": 1, "tags": ["a", "b"]}, 1, 0, {}),  # unhashable field: identified by canonical JSON
        rec({"tags": ["a", "b"], "id": 1}, 2, 1, {}),
        rec({"id": 1, "tags": ["b"]}, 1, 2, {}),
        rec({"id": 7}, 1, 3, {}),  # a record key is never the same key as a scalar of its value
        rec(7, 1, 4, {}),
        rec({"id": 7}, 3, 5, {}),
        rec({"id": 7}, 2, 6, {}),  # an older version arriving later loses
    ]
    out = latest_per_key(records)
    assert [(r.offset, r.version) for r in out] == [(1, 2), (2, 1), (4, 1), (5, 3)]


def test_object_key_is_deterministic_and_sorts_by_offset() -> None:
    assert (
        object_key("p/", "updates.x", 2, 17, "parquet")
        == "p/updates.x/partition=2/updates.x+2+00000000000000000017.parquet"
    )
    assert (
        object_key("", "u", 0, 5, "jsonl", "2024-05-01") == "u/partition=0/dt=2024-05-01/u+0+00000000000000000005.jsonl"
    )
    assert object_key("", "u", 0, 9, "avro") < object_key("", "u", 0, 10, "avro")


def value(i: int) -> dict:
    from decimal import Decimal

    return {"id": i, "at": datetime(2024, 5, i + 1, tzinfo=UTC), "price": Decimal("1.25"), "tags": ["a"], "note": None}


def test_encodings_round_trip() -> None:
    records = [rec(0, 1, 10, value(0)), rec(1, 2, 11)]  # an upsert and a tombstone
    lines = [json.loads(line) for line in encode_jsonl(records).splitlines()]
    assert lines[0]["value"]["price"] == "1.25" and lines[0]["value"]["at"].startswith("2024-05-01")
    assert lines[1] == {
        "topic": "t",
        "partition": 0,
        "offset": 11,
        "timestamp_ms": 1_714_564_800_000,
        "key": "1",
        "version": 2,
        "deleted": True,
        "value": None,
    }
    rows = pq.read_table(io.BytesIO(encode_parquet(records))).to_pylist()
    assert rows[0]["value"]["id"] == 0 and rows[1]["deleted"] and rows[1]["value"] is None
    avro_rows = list(fastavro.reader(io.BytesIO(encode_avro(records, PARSED))))
    assert avro_rows[0]["value"] == value(0) and avro_rows[1]["value"] is None


def test_objects_split_by_date_and_by_writer_schema() -> None:
    cfg = S3SinkConfig(
        name="s", type="s3_sink", connection="c", topics=["t"], bucket="b", format="avro", partition_by="at"
    )
    sink = S3Sink(cfg, None)
    records = [
        rec(0, 1, 100, value(0)),
        rec(1, 1, 101, value(1)),
        rec(2, 1, 102, value(0), fp=b"g" * 8),
        rec(3, 1, 103),
    ]
    objects = sink.objects(SinkBatch("t", 0, 100, 103, records))
    assert [(o.key.split("/", 2)[2], [r.offset for r in o.records]) for o in objects] == [
        ("dt=2024-05-01/t+0+00000000000000000100.avro", [100]),
        ("dt=2024-05-02/t+0+00000000000000000101.avro", [101]),
        # the tombstone has no date field: its Kafka timestamp's date, and the writer schema before it
        ("dt=2024-05-01/t+0+00000000000000000102.avro", [102, 103]),
    ]
    names = [o.key for o in objects]
    assert len(names) == len(set(names))
    policy = sink.batch_policy(None)
    assert policy.max_records == cfg.rotate_records and policy.max_age_ms == cfg.rotate_interval_s * 1000
    assert policy.flush_when_idle is False  # objects rotate on records, bytes and age, not on a pause of the input


def test_avro_to_sql_types() -> None:
    assert isinstance(sql_type("long")[0], BigInteger) and isinstance(sql_type("int")[0], Integer)
    assert sql_type(["null", "string"])[1] is True and isinstance(sql_type(["null", "string"])[0], Text)
    ts = sql_type({"type": "long", "logicalType": "timestamp-micros"})[0]
    assert isinstance(ts, DateTime) and ts.timezone
    dec = sql_type({"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2})[0]
    assert isinstance(dec, Numeric) and (dec.precision, dec.scale) == (9, 2)
    assert isinstance(sql_type({"type": "array", "items": "int"})[0], JSON)
    with pytest.raises(FatalError, match="several non-null"):
        sql_type(["null", "int", "string"])


def test_table_from_avro_has_key_and_version_columns() -> None:
    t = table_from_avro("items", SCHEMA, ["id"], "_version")
    assert [c.name for c in t.primary_key.columns] == ["id"]
    assert t.c._version.nullable is False and isinstance(t.c.tags.type, JSON)
    composite = table_from_avro("x", SCHEMA, ["id", "region"], "_version", key_sample={"region": "eu"})
    assert [c.name for c in composite.primary_key.columns] == ["id", "region"]
    with pytest.raises(FatalError, match="key column 'nope'"):
        table_from_avro("x", SCHEMA, ["nope"], "_version")


def test_parquet_objects_of_one_writer_schema_share_their_parquet_schema() -> None:
    # type inference typed a column that is all null in a small object as `null` there: objects disagreed
    with_note = rec(0, 1, 0, {**value(0), "note": "n"})
    without = [rec(1, 1, 1, value(1)), rec(2, 1, 2)]  # `note` all null, and a tombstone
    first = pq.read_table(io.BytesIO(encode_parquet([with_note], PARSED, b"f" * 8)))
    second = pq.read_table(io.BytesIO(encode_parquet(without, PARSED, b"f" * 8)))
    assert first.schema == second.schema
    value_type = second.schema.field("value").type
    assert value_type.field("note").type == pa.string() and value_type.field("at").type == pa.timestamp("us", "UTC")
    assert value_type.field("price").type == pa.decimal128(9, 2)
    rows = second.to_pylist()
    assert rows[0]["value"] == value(1) and rows[1]["value"] is None and rows[1]["deleted"]


def test_parquet_falls_back_to_inference_without_a_faithful_arrow_type() -> None:
    import uuid

    schema = fastavro.parse_schema(
        {
            "type": "record",
            "name": "U",
            "fields": [
                {"name": "v", "type": ["null", "int", "string"]},
                {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
            ],
        }
    )
    u = uuid.UUID(int=7)
    records = [SinkRecord("t", 0, 0, 1, {"v": 1, "id": u}, 1, value_schema=schema, value_fingerprint=b"u" * 8)]
    rows = pq.read_table(io.BytesIO(encode_parquet(records, schema, b"u" * 8))).to_pylist()
    assert rows[0]["value"] == {"v": 1, "id": str(u)}
    # tombstones only: no writer schema, inferred (the value column is typed null)
    table = pq.read_table(io.BytesIO(encode_parquet([rec(1, 2, 3)])))
    assert table.column("value").to_pylist() == [None] and table.column("deleted").to_pylist() == [True]


def test_parquet_uuid_values_become_strings_with_the_explicit_schema() -> None:
    import uuid

    schema = fastavro.parse_schema(
        {"type": "record", "name": "U2", "fields": [{"name": "id", "type": {"type": "string", "logicalType": "uuid"}}]}
    )
    u = uuid.UUID(int=9)
    records = [SinkRecord("t", 0, 0, 1, {"id": u}, 1, value_schema=schema, value_fingerprint=b"v" * 8)]
    table = pq.read_table(io.BytesIO(encode_parquet(records, schema, b"v" * 8)))
    assert table.schema.field("value").type == pa.struct([pa.field("id", pa.string(), nullable=False)])
    assert table.column("value").to_pylist() == [{"id": str(u)}]


def test_parquet_objects_split_by_writer_schema() -> None:
    cfg = S3SinkConfig(name="s", type="s3_sink", connection="c", topics=["t"], bucket="b", format="parquet")
    records = [rec(0, 1, 7), rec(1, 1, 8, value(1)), rec(2, 1, 9, value(2), fp=b"g" * 8), rec(3, 1, 10)]
    objects = S3Sink(cfg, None).objects(SinkBatch("t", 0, 7, 10, records))
    # the leading tombstone joins the batch's first writer schema, the last one the schema before it
    assert [([r.offset for r in o.records], o.fingerprint) for o in objects] == [
        ([7, 8], b"f" * 8),
        ([9, 10], b"g" * 8),
    ]
    assert objects[0].value_schema is PARSED and objects[0].key.endswith("t+0+00000000000000000007.parquet")


def _client_error(code: str) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": code}}, "PutObject")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (_client_error("SlowDown"), "SinkBackpressureError"),
        (_client_error("503"), "SinkBackpressureError"),
        (_client_error("NoSuchBucket"), "SinkBlockedError"),
        (_client_error("AccessDenied"), "SinkBlockedError"),
        (_client_error("InternalError"), "RetriableError"),
    ],
)
def test_upload_errors_map_to_what_the_runtime_does(exc: Exception, expected: str) -> None:
    cfg = S3SinkConfig(name="s", type="s3_sink", connection="c", topics=["t"], bucket="b")
    assert type(S3Sink(cfg, None)._upload_error("k", exc)).__name__ == expected


def test_parquet_from_columns_equals_parquet_from_dicts_with_dates_and_tombstones() -> None:
    """The sync service's columnar values give the same objects, folders and rows as the per-record dicts."""
    from kernel.config.policies import RetryPolicy
    from kernel.updates import encode_version
    from schemas.serde import AvroSerializer
    from schemas.store import InMemorySchemaStore
    from sync_service.batching import Job
    from sync_service.metrics import SyncMetrics
    from sync_service.writer import BatchWriter
    from tests.unit.sync_service.fakes import FakeMessage, FakeProducer, ScriptedSink
    from tests.unit.test_columnar import EVERY_TYPE, every_value

    store = InMemorySchemaStore()
    key_ser, value_ser = AvroSerializer("long", store), AvroSerializer(EVERY_TYPE, store)
    raw = []
    for i in range(40):
        value = None if i % 7 == 3 else value_ser(every_value(i))
        raw.append(FakeMessage(i, key_ser(i % 30), value, headers=[("version", encode_version(i + 1))]))
    writer = BatchWriter("svc", ScriptedSink(), __import__("schemas.serde").serde.AvroDeserializer(store),
                         FakeProducer(), "dlq", RetryPolicy(), SyncMetrics("svc"))
    batch = writer.decode(Job("fake", "t", 0, raw, 100))
    assert batch.tables, "the values were decoded in columns"
    cfg = S3SinkConfig(name="s", type="s3_sink", connection="c", topics=["t"], bucket="b", format="parquet",
                       partition_by="day")
    sink = S3Sink(cfg, None)
    columnar = sink.objects(batch)
    per_record = sink.objects(SinkBatch("t", 0, 0, 39, batch.records))  # no tables: the dict path
    assert all(o.table is not None for o in columnar if not all(r.is_delete for r in o.records))
    assert all(o.table is None for o in per_record)
    assert [(o.key, [r.offset for r in o.records]) for o in columnar] == [
        (o.key, [r.offset for r in o.records]) for o in per_record
    ]
    assert len({o.key.split("dt=")[1][:10] for o in columnar}) > 10  # one folder per day of the "day" field
    for a, b in zip(columnar, per_record, strict=True):
        ta, tb = pq.read_table(io.BytesIO(sink.encode(a))), pq.read_table(io.BytesIO(sink.encode(b)))
        assert ta.schema == tb.schema
        assert ta.to_pylist() == tb.to_pylist()


@pytest.mark.parametrize("partition_by", [None, "day"])
@pytest.mark.parametrize("key_schema", ["long", "string", "record"])
@pytest.mark.parametrize("nested", [False, True])
def test_jsonl_from_columns_is_byte_identical_to_jsonl_from_dicts(nested: bool, key_schema: str,
                                                                  partition_by: str | None) -> None:
    """Decimals as text, bytes base64, timestamps RFC 3339: the columnar objects equal orjson's per envelope.

    With ``partition_by``, a batch's rows spread over many ``dt=`` objects: each object takes its own
    rows (and tombstones) out of the batch's columns.
    """
    import copy
    from decimal import Decimal

    from kernel.config.policies import RetryPolicy
    from kernel.updates import encode_version
    from schemas.serde import AvroDeserializer, AvroSerializer
    from schemas.store import InMemorySchemaStore
    from sync_service.batching import Job
    from sync_service.metrics import SyncMetrics
    from sync_service.writer import BatchWriter
    from tests.unit.sync_service.fakes import FakeMessage, FakeProducer, ScriptedSink
    from tests.unit.test_columnar import EVERY_TYPE, every_value

    schema = copy.deepcopy(EVERY_TYPE)
    if not nested:  # r nests a decimal and a fixed: its documents go per record (checked too)
        schema["fields"] = [f for f in schema["fields"] if f["name"] != "r"]
    names = {f["name"] for f in schema["fields"]}
    store = InMemorySchemaStore()
    key_schemas = {
        "long": ("long", lambda i: i),
        "string": ("string", lambda i: f'k"é\\{i}'),  # quotes, backslash and non-ASCII in the key's JSON
        "record": ({"type": "record", "name": "K", "fields": [{"name": "b", "type": "string"},
                                                                 {"name": "a", "type": "long"}]},
                   lambda i: {"b": f"x{i}", "a": -i}),
    }
    key_avro, key_of = key_schemas[key_schema]
    key_ser, value_ser = AvroSerializer(key_avro, store), AvroSerializer(schema, store)
    raw = []
    for i in range(30):
        value = {k: v for k, v in every_value(i).items() if k in names}
        value["dec"] = Decimal("-0.0000001") if i == 4 else value["dec"]  # str() writes 1E-7 style here
        raw.append(FakeMessage(i, key_ser(key_of(i)), None if i % 9 == 4 else value_ser(value),
                               headers=[("version", encode_version(i + 1))]))
    writer = BatchWriter("svc", ScriptedSink(), AvroDeserializer(store), FakeProducer(), "dlq", RetryPolicy(),
                         SyncMetrics("svc"))
    batch = writer.decode(Job("fake", "t", 0, raw, 100))
    cfg = S3SinkConfig(name="s", type="s3_sink", connection="c", topics=["t"], bucket="b", format="jsonl",
                       partition_by=partition_by)
    sink = S3Sink(cfg, None)
    columnar = sink.objects(batch)
    per_record = sink.objects(SinkBatch("t", 0, 0, 29, batch.records))
    assert len(columnar) == len(per_record)
    assert len(columnar) == 1 if partition_by is None else len(columnar) > 5
    for a, b in zip(columnar, per_record, strict=True):
        assert a.key == b.key and b.table is None
        assert (a.table is None) == (nested or all(r.is_delete for r in a.records))
        assert sink.encode(a) == sink.encode(b)
