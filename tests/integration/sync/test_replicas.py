"""Two replicas of one sync service share the partitions (cooperative-sticky); a rebalance loses nothing."""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
from sqlalchemy import MetaData, Table, inspect, select

from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from sync_service.service import SyncService
from tests.integration.sync.helpers import UpdateProducer, create_topic, group_lag, pipeline, run_in_thread, wait_until

KEYS, UPDATES = 500, 6_000


def test_second_replica_takes_half_the_partitions(kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection,
                                                  pg_engine: Any, unique: str,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sync_service.service")
    topic, table = f"updates.replicas.{unique}", f"replicas_{unique}"
    create_topic(kafka_conf, topic, 4)
    p = pipeline(kafka, {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
                 [{"name": f"replicas-{unique}", "dead_letter_topic": f"dlq.{unique}", "session_timeout_ms": 6_000,
                   "batch": {"max_records": 300, "max_age_ms": 200},
                   "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic],
                              "table": table, "key": ["id"], "create_table": True}]}])
    producer = UpdateProducer(kafka, topic)
    latest: dict[int, int] = {}

    def send(first: int, last: int) -> None:
        for version in range(first, last + 1):
            key = version - 1 if version <= KEYS else random.randrange(KEYS)
            producer.send(key, version)
            latest[key] = version
        producer.flush()

    first = SyncService(p.kafka, p.sync[0], dict(p.connections))
    second = SyncService(p.kafka, p.sync[0], dict(p.connections))
    t1, stop1, errors1 = run_in_thread(first)
    send(1, UPDATES // 2)
    wait_until(lambda: len(first._assigned) == 4, 30, "the first replica to own every partition")
    t2, stop2, errors2 = run_in_thread(second)
    send(UPDATES // 2 + 1, UPDATES)
    try:
        wait_until(lambda: first._assigned and second._assigned and len(first._assigned | second._assigned) == 4,
                   60, "both replicas to own partitions")
        assert not first._assigned & second._assigned
        wait_until(lambda: group_lag(kafka_conf, p.sync[0].consumer_group(), topic) == 0, 120, "lag 0")
        assert not errors1 and not errors2, errors1 + errors2
        revoked = [r.getMessage() for r in caplog.records if r.getMessage().startswith("revoked partitions")]
        assert revoked, "the first replica handed partitions over through a revoke (flush, then commit)"
    finally:
        stop1.set()
        stop2.set()
        t1.join(60)
        t2.join(60)
    assert inspect(pg_engine).has_table(table)
    t = Table(table, MetaData(), autoload_with=pg_engine)
    with pg_engine.connect() as conn:
        assert dict(conn.execute(select(t.c.id, t.c._version)).all()) == latest
    t.drop(pg_engine)
