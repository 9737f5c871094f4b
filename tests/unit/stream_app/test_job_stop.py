"""StreamJob.stop() after a start that failed early (no SparkSession needed)."""

from __future__ import annotations

from typing import Any

from connectors.config.models import KafkaConfig
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
