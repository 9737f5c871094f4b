"""The service's real consumer reports every commit's result to ``_on_commit`` (which makes refused ones again)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from sync_service.service import SyncService
from tests.integration.sync.helpers import UpdateProducer, create_topic, pipeline, run_in_thread, wait_until


def test_commit_results_reach_the_service(kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection,
                                          unique: str) -> None:
    topic, table = f"updates.commits.{unique}", f"commits_{unique}"
    create_topic(kafka_conf, topic, 1)
    p = pipeline(kafka, {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
                 [{"name": f"commits-{unique}", "dead_letter_topic": f"dlq.{unique}",
                   "batch": {"max_records": 50, "max_age_ms": 100},
                   "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic],
                              "table": table, "key": ["id"], "create_table": True}]}])
    service = SyncService(p.kafka, p.sync[0], dict(p.connections))
    results: list[tuple[Any, list[tuple[int, int]]]] = []
    handle = service._on_commit

    def recording(err: Any, partitions: list[TopicPartition]) -> None:
        results.append((err, [(tp.partition, tp.offset) for tp in partitions]))
        handle(err, partitions)

    service._on_commit = recording  # type: ignore[method-assign]  # before open(): the consumer takes this one
    producer = UpdateProducer(kafka, topic)
    for version in range(1, 101):
        producer.send(version, version)
    producer.flush()
    thread, stop, errors = run_in_thread(service)
    try:
        wait_until(lambda: any(err is None and (0, 100) in parts for err, parts in results), 60,
                   "the commit of offset 100 reported by librdkafka")
        # a refusal reported for the committed offset is made again by the loop, against the real broker
        service._on_commit(KafkaError(KafkaError.REBALANCE_IN_PROGRESS), [TopicPartition(topic, 0, 100)])
        wait_until(lambda: sum(1 for err, parts in results if err is None and (0, 100) in parts) >= 2, 30,
                   "offset 100 committed again")
        assert not errors, errors
    finally:
        stop.set()
        thread.join(60)
