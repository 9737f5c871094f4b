"""A stop ends every retry loop: no attempt after it, and a backoff it interrupts never turns into a hot loop.

Issue #40 item 4: the retry sleep was ``stop.wait(s)``, which returns at once once the
stop event is set, and nothing else looked at the event, so a source retrying a wrong
password went from ~0.5 attempts/s to ~20/s on SIGTERM and never stopped. Each test
sets the stop from another thread while the loop retries forever, and requires the loop
to end with a bounded number of attempts (the bound of the stop is the feature).
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from connectors.runtime.worker import TaskRunner
from kernel.config.policies import ErrorPolicy, RetryPolicy
from kernel.exceptions import RetriableError
from kernel.supervision import StopRequested

FOREVER = ErrorPolicy(retry_timeout_s=-1)
BACKOFF = RetryPolicy(initial_backoff_s=0.02, max_backoff_s=0.05)
STOP_BOUND_S = 10.0


def run_until_stopped(target: Any, stop: threading.Event, attempts: list[int], after: int) -> dict[str, Any]:
    """Run ``target`` in a thread, set ``stop`` once ``after`` attempts were made; returns what it returned/raised."""
    result: dict[str, Any] = {}

    def body() -> None:
        try:
            result["value"] = target()
        except BaseException as exc:  # handed to the test
            result["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    while len(attempts) < after and thread.is_alive():
        threading.Event().wait(0.01)
    stop.set()
    at_stop = len(attempts)
    thread.join(STOP_BOUND_S)
    assert not thread.is_alive(), f"the retry loop still runs {STOP_BOUND_S} s after the stop ({len(attempts)} attempts)"
    # the attempt under way when the stop came may finish; none starts after it
    assert len(attempts) <= at_stop + 1, (at_stop, len(attempts))
    result["at_stop"] = at_stop
    return result


def test_source_task_retries_end_on_stop_without_another_attempt() -> None:
    runner = TaskRunner.__new__(TaskRunner)  # only the retry loop: no connector, no Kafka
    runner.retry, runner.config, runner._label = BACKOFF, SimpleNamespace(errors=FOREVER), "src"
    stop, attempts = threading.Event(), []

    def connect() -> None:
        attempts.append(1)
        raise RetriableError("password authentication failed for user threes")

    result = run_until_stopped(lambda: runner._retrying(stop, connect), stop, attempts, after=3)
    assert isinstance(result.get("error"), StopRequested), result


def test_a_stop_before_the_next_attempt_makes_none() -> None:
    runner = TaskRunner.__new__(TaskRunner)
    runner.retry, runner.config, runner._label = BACKOFF, SimpleNamespace(errors=FOREVER), "src"
    stop, attempts = threading.Event(), []

    def connect() -> None:
        attempts.append(1)
        stop.set()  # SIGTERM arrives while this attempt runs
        raise RetriableError("connection refused")

    result = run_until_stopped(lambda: runner._retrying(stop, connect), stop, attempts, after=1)
    assert isinstance(result.get("error"), StopRequested)
    assert len(attempts) == 1


def test_sink_write_retries_end_on_stop_uncommitted_and_not_dead_lettered() -> None:
    from kernel.updates import encode_version
    from schemas.serde import AvroDeserializer, AvroSerializer
    from schemas.store import InMemorySchemaStore
    from sync_service.batching import Job
    from sync_service.metrics import SyncMetrics
    from sync_service.writer import BatchWriter
    from tests.unit.sync_service.fakes import FakeMessage, FakeProducer, ScriptedSink

    store = InMemorySchemaStore()
    key, value = AvroSerializer("long", store), AvroSerializer({"type": "record", "name": "V", "fields": [
        {"name": "a", "type": "int"}]}, store)
    raw = [FakeMessage(i, key(i), value({"a": i}), headers=[("version", encode_version(1))]) for i in range(3)]
    attempts: list[int] = []

    class DownSink(ScriptedSink):
        def write(self, batch: Any) -> Any:
            attempts.append(1)
            raise RetriableError("connection refused")

    sink = DownSink()
    sink.config.errors = ErrorPolicy(retry_timeout_s=-1, tolerance="all")  # even "all" must not dead-letter a stop
    producer, stop = FakeProducer(), threading.Event()
    writer = BatchWriter("svc", sink, AvroDeserializer(store), producer, "dlq", BACKOFF, SyncMetrics("svc-stop"),
                         stop=stop)
    result = run_until_stopped(lambda: writer.run(Job("fake", "t", 0, raw, 100)), stop, attempts, after=3)
    outcome = result["value"]
    assert outcome.status == "failed" and isinstance(outcome.error, StopRequested), outcome
    assert producer.produced == []
