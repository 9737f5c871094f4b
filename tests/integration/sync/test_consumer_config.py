"""The sync service's consumer is built with threes' consumer defaults, under the pipeline's own Kafka settings."""

from __future__ import annotations

import threading
from typing import Any

import confluent_kafka

from kernel.config.models import KafkaConfig
from sync_service.service import SyncService
from tests.integration.sync.helpers import create_topic
from threes.config import pipeline_from_dict


def test_the_consumer_fetches_again_soon_after_a_full_queue(kafka: KafkaConfig, kafka_conf: dict[str, Any],
                                                             unique: str, monkeypatch) -> None:
    built: list[dict[str, Any]] = []

    class Recording(confluent_kafka.Consumer):  # the real consumer, its configuration kept
        def __init__(self, conf: dict[str, Any]):
            built.append(dict(conf))
            super().__init__(conf)

    monkeypatch.setattr(confluent_kafka, "Consumer", Recording)
    topic = f"updates.fetch.{unique}"
    create_topic(kafka_conf, topic, 1)
    for client_config, expected in (({}, 50), ({"fetch.queue.backoff.ms": 300}, 300)):
        p = pipeline_from_dict({
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "client_config": client_config},
            "connections": {"pg": {"type": "rds", "url": "sqlite://"}},
            "sync": [{"name": f"fetch-{unique}", "dead_letter_topic": f"dlq.{unique}",
                      "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic],
                                 "table": "t", "key": ["id"], "create_table": True}]}],
        })
        service = SyncService(p.kafka, p.sync[0], dict(p.connections))
        service.open()
        stopped = threading.Event()
        stopped.set()
        try:
            # librdkafka's own 1000 ms left a consumer working through a backlog idle ~1 s whenever its queue filled
            assert built[-1]["fetch.queue.backoff.ms"] == expected
        finally:
            service.run(stopped)  # shuts down at once: flush, commit, close
