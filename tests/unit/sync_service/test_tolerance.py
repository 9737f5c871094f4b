"""``errors.tolerance`` and restarts in the batch writer (fake sink, in-memory schemas)."""

from __future__ import annotations

from kernel.config.policies import ErrorPolicy, RetryPolicy
from kernel.exceptions import FatalError, RetriableError
from schemas.serde import AvroDeserializer
from schemas.store import InMemorySchemaStore
from sync_service.metrics import SyncMetrics
from sync_service.writer import BatchWriter
from tests.unit.sync_service.fakes import FakeProducer, ScriptedSink
from tests.unit.sync_service.test_writer import job, msgs


def _writer(store: InMemorySchemaStore, sink: ScriptedSink, producer: FakeProducer, tolerance: str) -> BatchWriter:
    sink.config = sink.config.model_copy(update={"errors": ErrorPolicy(retry_timeout_s=0.05, tolerance=tolerance)})
    retry = RetryPolicy(initial_backoff_s=0.001, max_backoff_s=0.002)
    return BatchWriter("svc", sink, AvroDeserializer(store), producer, "dlq", retry, SyncMetrics("svc"))


def test_tolerance_all_sends_the_whole_failed_batch_to_the_dead_letter_topic() -> None:
    store = InMemorySchemaStore()
    sink, producer = ScriptedSink([RetriableError("target down")] * 1000), FakeProducer()
    out = _writer(store, sink, producer, "all").run(job(msgs(store, 4)))
    assert out.status == "done" and out.applied == 0 and out.dead == 4
    assert isinstance(out.tolerated, RetriableError)
    assert [p["headers"]["dlq.offset"] for p in producer.produced] == [b"0", b"1", b"2", b"3"]
    assert {p["headers"]["dlq.stage"] for p in producer.produced} == {b"write"}
    assert all(b"target down" in p["headers"]["dlq.error.message"] for p in producer.produced)


def test_tolerance_none_fails_the_batch_and_the_restart_reopens_the_sink_first() -> None:
    store = InMemorySchemaStore()
    sink, producer = ScriptedSink([FatalError("refused")]), FakeProducer()
    opened: list[str] = []
    sink.open = lambda: opened.append("open")  # type: ignore[method-assign]
    sink.close = lambda: opened.append("close")  # type: ignore[method-assign]
    writer = _writer(store, sink, producer, "none")
    j = job(msgs(store, 3))
    out = writer.run(j)
    assert out.status == "failed" and producer.produced == [] and sink.batches == []
    writer.needs_open = True  # what the service does when it restarts the sink
    j.decoded, j.dead = None, []
    out = writer.run(j)
    assert out.status == "done" and out.applied == 3 and opened == ["close", "open"] and not writer.needs_open


def test_a_sink_that_cannot_open_again_is_not_tolerated() -> None:
    store = InMemorySchemaStore()
    sink, producer = ScriptedSink(), FakeProducer()

    def refuse() -> None:
        raise RetriableError("still down")

    sink.open = refuse  # type: ignore[method-assign]
    writer = _writer(store, sink, producer, "all")
    writer.needs_open = True
    out = writer.run(job(msgs(store, 2)))
    assert out.status == "failed" and producer.produced == [] and writer.needs_open


def test_the_oldest_source_timestamp_of_a_batch_is_read_with_its_heads() -> None:
    from kernel.updates import with_source_ts

    store = InMemorySchemaStore()
    raw = msgs(store, 3)
    for m, ts in zip(raw, (5_000, 3_000, 9_000), strict=True):
        m._headers = with_source_ts(m._headers, ts)
    sink, producer = ScriptedSink(), FakeProducer()
    j = job(raw)
    assert _writer(store, sink, producer, "none").run(j).status == "done"
    assert j.oldest_source_ts_ms == 3_000
