"""Every consumer threes builds fetches again soon after its prefetch queue was full, unless the pipeline says otherwise."""

from __future__ import annotations

import confluent_kafka

from kernel.config.models import KafkaConfig
from kernel.kafka import clients


class RecordingConsumer:
    """Stands in for ``confluent_kafka.Consumer``: keeps the configuration it was built with."""

    built: list[dict] = []

    def __init__(self, conf: dict):
        RecordingConsumer.built.append(conf)


def test_consumers_fetch_again_50_ms_after_a_full_queue_and_the_pipeline_may_say_otherwise(monkeypatch):
    monkeypatch.setattr(confluent_kafka, "Consumer", RecordingConsumer)
    RecordingConsumer.built.clear()
    clients.kafka_consumer(KafkaConfig(bootstrap_servers="127.0.0.1:1"), "g")
    # librdkafka's own default (1000 ms) stalled a consumer working through a backlog ~1 s at a time
    assert RecordingConsumer.built[-1]["fetch.queue.backoff.ms"] == 50
    tuned = KafkaConfig(bootstrap_servers="127.0.0.1:1", client_config={"fetch.queue.backoff.ms": 200})
    clients.kafka_consumer(tuned, "g")
    assert RecordingConsumer.built[-1]["fetch.queue.backoff.ms"] == 200
    # an override of the caller still wins over both
    clients.kafka_consumer(tuned, "g", fetch_queue_backoff_ms=5)
    assert RecordingConsumer.built[-1]["fetch.queue.backoff.ms"] == 5
