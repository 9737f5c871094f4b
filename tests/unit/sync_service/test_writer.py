from __future__ import annotations

import pytest

from connectors.config.models import RetryPolicy
from connectors.exceptions import FatalError, RetriableError, SinkBackpressureError
from connectors.updates import encode_version
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
