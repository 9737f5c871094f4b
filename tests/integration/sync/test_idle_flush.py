"""A drained input cuts partial batches at once (``batch.flush_when_idle``); without it they wait for ``max_age_ms``."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import MetaData, Table, inspect, select

from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from sync_service.service import SyncService
from tests.integration.sync.helpers import UpdateProducer, create_topic, pipeline, run_in_thread, wait_until

RECORDS = 40


def _rows(engine: Any, table: str) -> dict[int, int]:
    if not inspect(engine).has_table(table):
        return {}
    t = Table(table, MetaData(), autoload_with=engine)
    with engine.connect() as conn:
        return dict(conn.execute(select(t.c.id, t.c._version)).all())


@pytest.mark.parametrize("flush_when_idle", [True, False])
def test_partial_batch_of_a_drained_input(kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection,
                                          pg_engine: Any, unique: str, flush_when_idle: bool) -> None:
    topic, table = f"updates.idle.{unique}", f"idle_{unique}"
    create_topic(kafka_conf, topic, 2)
    # batches far from full (10k records) and an age limit far beyond the test: only the idle rule cuts them
    p = pipeline(kafka, {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
                 [{"name": f"idle-{unique}", "dead_letter_topic": f"dlq.{unique}",
                   "batch": {"max_records": 10_000, "max_age_ms": 600_000, "flush_when_idle": flush_when_idle},
                   "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic],
                              "table": table, "key": ["id"], "create_table": True}]}])
    producer = UpdateProducer(kafka, topic)
    for key in range(RECORDS):
        producer.send(key, 1)
    producer.flush()
    service = SyncService(p.kafka, p.sync[0], dict(p.connections))
    thread, stop, errors = run_in_thread(service)
    try:
        if flush_when_idle:
            wait_until(lambda: len(_rows(pg_engine, table)) == RECORDS, 30, "every record written")
            assert _rows(pg_engine, table) == dict.fromkeys(range(RECORDS), 1)
        else:
            wait_until(lambda: len(service._assigned) == 2, 30, "both partitions assigned")
            time.sleep(8)  # consumed within a turn or two; nothing cuts the batches before their age
            assert _rows(pg_engine, table) == {}
        assert not errors, errors
    finally:
        stop.set()
        thread.join(60)
    # a clean stop flushes what is buffered either way
    assert _rows(pg_engine, table) == dict.fromkeys(range(RECORDS), 1)
    Table(table, MetaData(), autoload_with=pg_engine).drop(pg_engine)
