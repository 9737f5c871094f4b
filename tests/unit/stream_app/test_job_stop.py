"""StreamJob.stop() after a start that failed early (no SparkSession needed)."""

from __future__ import annotations

from typing import Any

from kernel.config.models import KafkaConfig
from stream_app.config import StreamJobConfig
from stream_app.job import StreamJob


class _Closable:
    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _config() -> StreamJobConfig:
    return StreamJobConfig.model_validate({
        "events": {"topic": "orders", "value_schema": "order.avsc"},
        "enriched_topic": "orders.enriched",
        "dead_letter_topic": "orders.dlq",
        "checkpoint_location": "cp",
    })


def test_stop_after_a_start_that_failed_before_the_writer_schemas_closes_what_was_opened() -> None:
    # start() opened the topic watermarks, then failed checking the topics (the events topic missing):
    # stop() in run()'s `finally` must close what exists, not raise AttributeError over the real error
    job = StreamJob(_config(), KafkaConfig(bootstrap_servers="127.0.0.1:1"), spark=None)
    watermarks: Any = _Closable()
    job._watermarks = watermarks
    job.stop()
    assert watermarks.closed and job._watermarks is None


def test_a_stop_during_the_snapshot_load_ends_the_start_up_wait() -> None:
    # a snapshot that loads for minutes (or waits on a Kafka that does not answer): a SIGTERM meanwhile
    # must end start()'s wait at once, open the readiness gate with an error (a micro-batch waiting at it
    # ends) and leave no checkpoint to write
    import threading
    import time

    job = StreamJob(_config(), KafkaConfig(bootstrap_servers="127.0.0.1:1"), spark=None)
    release = threading.Event()
    loading = threading.Thread(target=release.wait, daemon=True)  # a load that never ends by itself
    loading.start()
    threading.Timer(0.3, job.stop_requested.set).start()
    started = time.monotonic()
    try:
        assert job._wait_loaded(loading, poll_s=0.05) is False
        assert time.monotonic() - started < 2.0
        assert job.interrupted and job._ready.is_set() and job._bootstrap_error is not None
    finally:
        release.set()


def test_the_start_up_wait_returns_when_the_snapshots_loaded() -> None:
    import threading

    job = StreamJob(_config(), KafkaConfig(bootstrap_servers="127.0.0.1:1"), spark=None)
    loading = threading.Thread(target=lambda: None)
    loading.start()
    assert job._wait_loaded(loading, poll_s=0.05) is True and not job.interrupted
