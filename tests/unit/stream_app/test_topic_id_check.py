"""The running job's topic-id check waits out a Kafka that does not answer (a controller moving)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from kernel.exceptions import SetupError
from stream_app.kafka_io import TopicWatermarks


class Admin:
    def __init__(self, error: KafkaError) -> None:
        self.error = error

    def describe_topics(self, topics: Any, request_timeout: float) -> dict[str, Future[Any]]:
        future: Future[Any] = Future()
        future.set_exception(KafkaException(self.error))
        return {name: future for name in topics.topic_names}


def _marks(error: KafkaError) -> TopicWatermarks:
    marks = object.__new__(TopicWatermarks)
    marks.timeout_s, marks._admin = 1.0, Admin(error)
    return marks


def test_a_timed_out_describe_during_the_run_skips_the_check_at_start_up_it_is_an_error() -> None:
    marks = _marks(KafkaError(KafkaError._TIMED_OUT, "Timed out waiting for controller"))
    assert marks._topic_id("state.airports", during_run=True) is None
    with pytest.raises(SetupError, match="did not describe"):
        marks._topic_id("state.airports")


def test_a_deleted_topic_is_an_error_even_during_the_run() -> None:
    marks = _marks(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART, "unknown"))
    with pytest.raises(SetupError, match="does not exist"):
        marks._topic_id("state.airports", during_run=True)
