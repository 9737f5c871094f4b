"""A write that never returns shows in the log with where its thread waits (logic only: a sink that blocks)."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

import pytest

from kernel.updates import encode_version
from schemas.serde import AvroSerializer
from schemas.store import InMemorySchemaStore
from sync_service.batching import Job, PartitionBuffer
from sync_service.status import STUCK_WRITE_WARN_S
from tests.unit.sync_service.fakes import FakeMessage, FakeProducer, ScriptedSink
from tests.unit.sync_service.test_commit import service
from tests.unit.sync_service.test_writer import SCHEMA, writer


class SilentTarget(ScriptedSink):
    """A sink whose target accepted the connection and never answers, until ``answer`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.answer = threading.Event()
        self.called = threading.Event()

    def write(self, batch):  # type: ignore[no-untyped-def]
        self.called.set()
        target_never_answers(self.answer)
        return super().write(batch)


def target_never_answers(answer: threading.Event) -> None:
    assert answer.wait(30), "the test never answered"


def a_job(store: InMemorySchemaStore) -> Job:
    key, value = AvroSerializer("long", store), AvroSerializer(SCHEMA, store)
    raw = [FakeMessage(i, key(i), value({"a": i}), headers=[("version", encode_version(1))]) for i in range(3)]
    return Job("fake", "t", 0, raw, 100)


def test_a_write_in_flight_for_long_is_logged_with_its_stack_then_again_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = InMemorySchemaStore()
    job, sink = a_job(store), SilentTarget()
    thread = threading.Thread(target=writer(store, sink, FakeProducer()).run, args=(job,), daemon=True)
    thread.start()
    assert sink.called.wait(10)
    assert job.started_at is not None and job.thread_id == thread.ident

    svc, _consumer = service({})
    buf = PartitionBuffer("fake", "t", 0, svc.config.batch)
    buf.inflight = job
    svc.slots = [SimpleNamespace(sink=sink, buffers={("t", 0): buf})]  # type: ignore[list-item]
    start = job.started_at
    with caplog.at_level(logging.WARNING, logger="sync_service.service"):
        assert svc._warn_long_writes(now=start + STUCK_WRITE_WARN_S - 1) == []  # not long yet
        assert svc._warn_long_writes(now=start + STUCK_WRITE_WARN_S + 1) == [job]
        assert svc._warn_long_writes(now=start + STUCK_WRITE_WARN_S + 2) == []  # once per interval
        assert svc._warn_long_writes(now=start + 2 * STUCK_WRITE_WARN_S + 2) == [job]
    [first, second] = [r.getMessage() for r in caplog.records]
    assert first.startswith("sink=fake topic=t partition=0 offsets=0-2 write in flight for 61 s (attempt 1)")
    assert "in target_never_answers" in first and "answer.wait(30)" in first
    assert "write in flight for 122 s" in second
    assert svc._write_in_flight_s(svc.slots[0], start + 5) == 5.0  # type: ignore[arg-type]

    sink.answer.set()
    thread.join(10)
    assert len(sink.batches) == 1
    assert job.started_at is None and job.thread_id is None  # the write returned: nothing in flight
    assert svc._warn_long_writes(now=start + 10 * STUCK_WRITE_WARN_S) == []
    assert svc._write_in_flight_s(svc.slots[0], start + 5) is None  # type: ignore[arg-type]


def test_the_status_document_says_how_long_a_sink_has_been_writing() -> None:
    svc, _consumer = service({})
    sink = ScriptedSink()
    buf = PartitionBuffer("fake", "t", 0, svc.config.batch)
    job = Job("fake", "t", 0, [FakeMessage(0, b"k", b"v")], 10)
    buf.inflight = job
    slot = SimpleNamespace(sink=sink, buffers={("t", 0): buf}, state="running", blocked=False, backoff=None,
                           dead_letters=0, last_error=None, restart_at=0.0)
    svc.slots = [slot]  # type: ignore[list-item]
    svc._update_status()
    assert svc.status()["sinks"][0]["write_in_flight_s"] is None  # cut, not being written yet
    job.started_at = time.monotonic() - 42.0
    svc._update_status()
    assert 42.0 <= svc.status()["sinks"][0]["write_in_flight_s"] < 50.0
