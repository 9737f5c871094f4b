"""Rows PostgreSQL refuses for good go to the dead letter topic by SQLSTATE, and the rest of the batch lands.

An index row over the btree limit is SQLSTATE 54000, which psycopg raises as an
``OperationalError`` (the class of a lost connection): classified by the
driver's class it was retried until the service died. A check constraint is
SQLSTATE 23514.
"""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import MetaData, Table, select, text

from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from kernel.dlq import DeadLetter
from sync_service.service import SyncService
from tests.integration.sync.helpers import (
    UpdateProducer,
    create_topic,
    group_lag,
    pipeline,
    read_topic,
    run_in_thread,
    wait_until,
)
from threes.testing.sink import item

N = 600
TOO_BIG, CHECK_FAILS = 100, 400


def test_rows_refused_for_good_are_dead_letters(kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection,
                                                pg_engine: Any, unique: str) -> None:
    topic, dlq, table = f"updates.refused.{unique}", f"dlq.refused.{unique}", f"refused_{unique}"
    create_topic(kafka_conf, topic, 1)
    with pg_engine.begin() as conn:
        conn.execute(text(
            f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, name TEXT NOT NULL, qty INTEGER CHECK (qty >= 0), "
            f"updated_at TIMESTAMPTZ, note TEXT, _version BIGINT NOT NULL)"
        ))
        conn.execute(text(f"CREATE INDEX {table}_name ON {table} (name)"))
    producer = UpdateProducer(kafka, topic)
    for key in range(N):
        if key == TOO_BIG:  # incompressible 8 kB: "index row size ... exceeds btree version 4 maximum 2704"
            producer.send(key, 1, {**item(key, 1), "name": os.urandom(4_000).hex()})
        elif key == CHECK_FAILS:
            producer.send(key, 1, {**item(key, 1), "qty": -5})
        else:
            producer.send(key, 1)
    producer.flush()

    p = pipeline(kafka, {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
                 [{"name": f"refused-{unique}", "dead_letter_topic": dlq,
                   "batch": {"max_records": N, "max_age_ms": 500},
                   "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic],
                              "table": table, "key": ["id"]}]}])
    service = SyncService(p.kafka, p.sync[0], dict(p.connections))
    thread, stop, errors = run_in_thread(service)
    try:
        group = p.sync[0].consumer_group()
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0 or errors, 60, "lag back to 0")
        assert not errors, errors
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors

    letters = read_topic(kafka_conf, dlq, 2)
    assert len(letters) == 2
    by_key = {producer.key_of(m): DeadLetter.from_headers(m.headers()) for m in letters}
    assert sorted(by_key) == [TOO_BIG, CHECK_FAILS]
    assert by_key[TOO_BIG].stage == "write" and "54000" in by_key[TOO_BIG].message
    assert by_key[CHECK_FAILS].stage == "write" and "23514" in by_key[CHECK_FAILS].message
    for key, letter in by_key.items():
        partition, offset = producer.delivered[key]
        assert (letter.topic, letter.partition, letter.offset) == (topic, partition, offset)

    t = Table(table, MetaData(), autoload_with=pg_engine)
    with pg_engine.connect() as conn:
        assert set(conn.execute(select(t.c.id)).scalars()) == set(range(N)) - {TOO_BIG, CHECK_FAILS}
    t.drop(pg_engine)
