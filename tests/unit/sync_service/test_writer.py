from __future__ import annotations

import pytest

from kernel.config.policies import RetryPolicy
from kernel.exceptions import FatalError, RetriableError, SinkBackpressureError
from kernel.updates import encode_version
from schemas.serde import AvroDeserializer, AvroSerializer
from schemas.store import InMemorySchemaStore
from sync_service.batching import Job
from sync_service.metrics import SyncMetrics
from sync_service.writer import BatchWriter
from tests.unit.sync_service.fakes import FakeMessage, FakeProducer, ScriptedSink

SCHEMA = {"type": "record", "name": "V", "fields": [{"name": "a", "type": "int"}]}


@pytest.fixture
def store() -> InMemorySchemaStore:
    return InMemorySchemaStore()


def msgs(store: InMemorySchemaStore, n: int, **bad: bytes | None) -> list[FakeMessage]:
    key, value = AvroSerializer("long", store), AvroSerializer(SCHEMA, store)
    out = []
    for i in range(n):
        headers = [("version", encode_version(i + 1))]
        v = value({"a": i})
        if i == 1 and "value" in bad:
            v = bad["value"]
        if i == 2 and "headers" in bad:
            headers = []
        out.append(FakeMessage(i, key(i), v, headers=headers))
    return out


def writer(store: InMemorySchemaStore, sink: ScriptedSink, producer: FakeProducer, **kw) -> BatchWriter:
    retry = RetryPolicy(max_attempts=3, initial_backoff_s=0.001, max_backoff_s=0.002)
    return BatchWriter("svc", sink, AvroDeserializer(store), producer, "dlq", retry, SyncMetrics("svc"), **kw)


def job(raw: list[FakeMessage]) -> Job:
    return Job("fake", "t", 0, raw, 100)


def test_decodes_and_writes_a_batch(store: InMemorySchemaStore) -> None:
    sink, producer = ScriptedSink(), FakeProducer()
    out = writer(store, sink, producer).run(job(msgs(store, 4)))
    assert out.status == "done" and out.applied == 4 and out.dead == 0
    [batch] = sink.batches
    assert [(r.key, r.value, r.version) for r in batch.records] == [(i, {"a": i}, i + 1) for i in range(4)]
    assert batch.records[0].value_schema is not None and len(batch.records[0].value_fingerprint) == 8
    assert producer.produced == []


def test_undecodable_and_versionless_records_are_dead_lettered_with_context(store: InMemorySchemaStore) -> None:
    sink, producer = ScriptedSink(), FakeProducer()
    out = writer(store, sink, producer).run(job(msgs(store, 4, value=b"garbage", headers=None)))
    assert out.status == "done" and out.applied == 2 and out.dead == 2
    assert [r.offset for r in sink.batches[0].records] == [0, 3]
    letters = {int(p["headers"]["dlq.offset"]): p for p in producer.produced}
    assert sorted(letters) == [1, 2]
    h1, h2 = letters[1]["headers"], letters[2]["headers"]
    assert h1["dlq.stage"] == b"decode" and h2["dlq.stage"] == b"decode"
    assert h1["dlq.error.class"] == b"NotSingleObjectError" and h1["dlq.topic"] == b"t"
    assert b"t[0]@1" in h1["dlq.error.message"] and letters[1]["value"] == b"garbage"
    assert h2["dlq.error.class"] == b"SkippableRecordError" and b"no 'version' header" in h2["dlq.error.message"]
    assert h1["dlq.component"] == b"svc/fake"


def test_records_refused_by_the_sink_go_to_the_dlq_at_stage_write(store: InMemorySchemaStore) -> None:
    sink, producer = ScriptedSink([[2]]), FakeProducer()
    out = writer(store, sink, producer).run(job(msgs(store, 4)))
    assert out.status == "done" and out.applied == 3 and out.dead == 1
    [letter] = producer.produced
    assert letter["headers"]["dlq.stage"] == b"write" and letter["headers"]["dlq.offset"] == b"2"
    assert letter["headers"]["dlq.error.class"] == b"ValueError"


def test_transient_errors_are_retried_then_succeed(store: InMemorySchemaStore) -> None:
    sink = ScriptedSink([RetriableError("blip"), RetriableError("blip")])
    j = job(msgs(store, 2))
    out = writer(store, sink, FakeProducer()).run(j)
    assert out.status == "done" and j.attempts == 3 and len(sink.batches) == 1


def test_transient_errors_past_the_bound_fail_the_job(store: InMemorySchemaStore) -> None:
    sink = ScriptedSink([RetriableError("down")] * 5)
    j = job(msgs(store, 2))
    out = writer(store, sink, FakeProducer()).run(j)
    assert out.status == "failed" and isinstance(out.error, RetriableError) and j.attempts == 3


def test_backpressure_is_handed_back_without_retrying(store: InMemorySchemaStore) -> None:
    sink = ScriptedSink([SinkBackpressureError(1.5, "busy")])
    j = job(msgs(store, 2))
    out = writer(store, sink, FakeProducer()).run(j)
    assert out.status == "backpressure" and out.retry_after == 1.5 and j.attempts == 1
    # written again later: the decoded batch is kept, nothing dead-lettered twice
    again = writer(store, sink, FakeProducer()).run(j)
    assert again.status == "done" and j.attempts == 2


def test_fatal_error_fails_at_once(store: InMemorySchemaStore) -> None:
    out = writer(store, ScriptedSink([FatalError("gone")]), FakeProducer()).run(job(msgs(store, 2)))
    assert out.status == "failed" and isinstance(out.error, FatalError)


def test_stop_on_error_fails_instead_of_dead_lettering(store: InMemorySchemaStore) -> None:
    producer = FakeProducer()
    out = writer(store, ScriptedSink(), producer, stop_on_error=True).run(job(msgs(store, 3, value=b"x")))
    assert out.status == "failed" and "t[0]@1" in str(out.error) and producer.produced == []


def test_values_are_decoded_in_columns_and_a_bad_body_in_the_block_is_dead_lettered(
    store: InMemorySchemaStore,
) -> None:
    raw = msgs(store, 6)
    header = raw[0].value()[:10]  # a registered writer schema, and no body
    raw[3] = FakeMessage(3, raw[3].key(), header,  # no body at all
                         headers=raw[3].headers())
    sink, producer = ScriptedSink(), FakeProducer()
    out = writer(store, sink, producer).run(job(raw))
    assert out.status == "done" and out.applied == 5 and out.dead == 1
    [batch] = sink.batches
    assert [r.offset for r in batch.records] == [0, 1, 2, 4, 5]
    table = batch.value_table(batch.records)
    assert table is not None and table.column("a").to_pylist() == [0, 1, 2, 4, 5]
    assert batch.value_table(batch.records[1:3]).column("a").to_pylist() == [1, 2]
    assert [r.value for r in batch.records] == [{"a": i} for i in (0, 1, 2, 4, 5)]  # the dict path agrees
    [letter] = producer.produced
    assert letter["headers"]["dlq.offset"] == b"3" and letter["headers"]["dlq.stage"] == b"decode"
    assert letter["headers"]["dlq.error.class"] == b"SerdeError"


def test_record_keys_decoded_in_columns_equal_fastavro(store: InMemorySchemaStore) -> None:
    from decimal import Decimal

    key_schema = {"type": "record", "name": "K", "fields": [
        {"name": "region", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}}]}
    import datetime as dt

    key_ser, value_ser = AvroSerializer(key_schema, store), AvroSerializer(SCHEMA, store)
    keys = [{"region": f"r{i}", "amount": Decimal(i) / 4, "day": dt.date(2024, 1, 1 + i)} for i in range(5)]
    raw = [FakeMessage(i, key_ser(k), value_ser({"a": i}), headers=[("version", encode_version(1))])
           for i, k in enumerate(keys)]
    w = writer(store, ScriptedSink(), FakeProducer())
    assert w.columnar.decode_objects(raw[0].key()[2:10], [raw[0].key()[10:]]) == [keys[0]]  # the columnar path ran
    batch = w.decode(job(raw))
    assert [r.key for r in batch.records] == keys == [AvroDeserializer(store)(m.key()) for m in raw]


def _mixed_job(store: InMemorySchemaStore) -> Job:
    """Two value writer schemas, tombstones, source timestamps on some records, an extra header."""
    from kernel.updates import SOURCE_TS_HEADER

    other = {"type": "record", "name": "V", "fields": [{"name": "a", "type": "int"},
                                                       {"name": "b", "type": ["null", "string"], "default": None}]}
    key, v1, v2 = AvroSerializer("long", store), AvroSerializer(SCHEMA, store), AvroSerializer(other, store)
    raw = []
    for i in range(40):
        headers = [("version", encode_version(1000 - i))]
        if i % 3 == 0:
            headers.append((SOURCE_TS_HEADER, encode_version(1_700_000_000_000 + (i * 7919) % 97)))
        if i % 5 == 0:
            headers.append(("trace", b"x" * i))
        value = None if i % 4 == 1 else (v1({"a": i}) if i % 2 else v2({"a": i, "b": f"s{i}"}))
        raw.append(FakeMessage(i, key(i % 13), value, headers=headers, timestamp_ms=5_000 + i))
    return job(raw)


def test_column_wise_heads_equal_the_per_message_heads(store: InMemorySchemaStore) -> None:
    w = writer(store, ScriptedSink(), FakeProducer())
    columns_job, each_job = _mixed_job(store), _mixed_job(store)
    heads = w.decoder._decode_heads_columns(columns_job)
    assert heads is not None  # the job is well formed: the column-wise path took it
    records, groups = heads
    expected = w.decoder._decode_heads_each(each_job)
    assert records == expected and len(records) == 40
    assert [r.encoded for r in records] == [r.encoded for r in expected]
    assert [r.value_schema for r in records] == [r.value_schema for r in expected]
    assert columns_job.oldest_source_ts_ms == each_job.oldest_source_ts_ms == 1_700_000_000_000
    assert sorted(len(g) for g in groups.values()) == [10, 20]  # tombstones belong to no writer schema
    assert all(r.value_fingerprint == fp for fp, g in groups.items() for r in g)


def test_column_wise_heads_of_version_only_headers_equal_the_per_message_heads(store: InMemorySchemaStore) -> None:
    """The common shape (one ``version`` header per message, read without a dict per message)."""
    w = writer(store, ScriptedSink(), FakeProducer())
    raw = msgs(store, 12)
    for i, m in enumerate(raw):
        if i % 5 == 3:
            m._value = None  # tombstones
    columns_job, each_job = job(raw), job(list(raw))
    heads = w.decoder._decode_heads_columns(columns_job)
    assert heads is not None
    records, _groups = heads
    expected = w.decoder._decode_heads_each(each_job)
    assert records == expected and [r.version for r in records] == list(range(1, 13))
    assert [r.is_delete for r in records] == [i % 5 == 3 for i in range(12)]
    assert columns_job.oldest_source_ts_ms is None and each_job.oldest_source_ts_ms is None


@pytest.mark.parametrize(
    "change",
    ["no version", "short version", "two version headers", "no key", "key not single-object", "unknown value schema",
     "two key schemas"],
)
def test_a_message_off_the_common_shape_takes_the_per_message_path(store: InMemorySchemaStore, change: str) -> None:
    raw = msgs(store, 4)
    m = raw[2]
    if change == "no version":
        m._headers = [("other", b"1")]
    elif change == "short version":
        m._headers = [("version", b"\x00\x01")]
    elif change == "two version headers":
        m._headers = [("version", encode_version(7)), ("version", encode_version(3))]
    elif change == "no key":
        m._key = None
    elif change == "key not single-object":
        m._key = b"plain key bytes"
    elif change == "unknown value schema":
        m._value = b"\xc3\x01" + b"\x00" * 8 + b"\x02"
    else:
        m._key = AvroSerializer("string", store)("two")
    sink, producer = ScriptedSink(), FakeProducer()
    w = writer(store, sink, producer)
    assert w.decoder._decode_heads_columns(job(list(raw))) is None
    out = w.run(job(raw))
    assert out.status == "done"
    if change == "two version headers":  # valid: the first version header counts, as version_of reads it
        assert out.dead == 0 and sink.batches[0].records[2].version == 7
    elif change == "two key schemas":
        assert out.dead == 0 and [r.key for r in sink.batches[0].records] == [0, 1, "two", 3]
    else:
        assert out.dead == 1 and [r.offset for r in sink.batches[0].records] == [0, 1, 3]
        assert [int(p["headers"]["dlq.offset"]) for p in producer.produced] == [2]
