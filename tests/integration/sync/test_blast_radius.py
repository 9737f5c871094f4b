"""Issue #40: sink errors are judged by blast radius, and one record the target never takes goes alone.

* privileges revoked on the sink's table for a while, then granted again: the sink
  blocks (status ``blocked: permission denied ...``), no record is dead-lettered, no
  offset is committed past a record that is not in the table, every row lands after the GRANT;
* a column dropped and added again (a migration): the same;
* among ~2,000 small documents, one over ``max_record_bytes`` and one Elasticsearch
  refuses on its own (an immense keyword term): those two alone are dead letters, with
  their topic, partition, offset and reason; the rest is indexed, lag 0.

``THREES_BLOCKED_TARGET_S`` sets how long the privilege or the column is gone (CI default
3 s; the issue's drill: 20 s), ``THREES_BLAST_RECORDS`` how many records flow (CI default
1,000; the issue's drill: 3,000).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from sqlalchemy import text
from sqlalchemy.engine import make_url

from connectors.elasticsearch.connection import ElasticsearchConnection
from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from kernel.dlq import DeadLetter
from kernel.kafka.topics import watermark_offsets
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

HOLD_S = float(os.environ.get("THREES_BLOCKED_TARGET_S", "3"))
RECORDS = int(os.environ.get("THREES_BLAST_RECORDS", "1000"))
FAST_RESTARTS = {"restart_backoff_s": 0.2, "restart_max_backoff_s": 1.0}


def _committed(kafka_conf: dict[str, Any], group: str, topic: str) -> dict[int, int]:
    consumer = Consumer({**kafka_conf, "group.id": group, "enable.auto.commit": False})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        got = consumer.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        return {tp.partition: max(0, tp.offset) for tp in got}
    finally:
        consumer.close()


def _records_in(kafka_conf: dict[str, Any], topic: str) -> int:
    consumer = Consumer({**kafka_conf, "group.id": "blast-radius-watermarks"})
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(watermark_offsets(consumer, topic, p)[1] for p in parts)
    finally:
        consumer.close()


def _ids(pg_engine: Any, table: str) -> set[int]:
    with pg_engine.connect() as conn:
        return set(conn.execute(text(f"SELECT id FROM {table}")).scalars())


def _drill(kafka: KafkaConfig, kafka_conf: dict[str, Any], pg_engine: Any, connection: dict[str, Any],
           unique: str, table: str, break_target: Callable[[], None], mend_target: Callable[[], None],
           blocked_by: str) -> None:
    """Half the records land, the target breaks, the other half arrives, the target mends: all land, none dead."""
    topic, dlq = f"updates.blast.{unique}", f"dlq.blast.{unique}"
    create_topic(kafka_conf, topic, 2)
    p = pipeline(kafka, {"pg": connection},
                 [{"name": f"blast-{unique}", "dead_letter_topic": dlq, "batch": {"max_records": 100, "max_age_ms": 100},
                   "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic],
                              "table": table, "key": ["id"], "errors": FAST_RESTARTS}]}])
    producer = UpdateProducer(kafka, topic)
    half = RECORDS // 2
    for key in range(half):
        producer.send(key, 1)
    producer.flush()
    service = SyncService(p.kafka, p.sync[0], dict(p.connections))
    thread, stop, errors = run_in_thread(service)
    group = p.sync[0].consumer_group()
    try:
        wait_until(lambda: len(_ids(pg_engine, table)) == half or errors, 60, "the first half of the rows")
        assert not errors, errors
        break_target()
        try:
            for key in range(half, RECORDS):
                producer.send(key, 1)
            producer.flush()

            def blocked() -> bool:
                sink = service.status()["sinks"][0]
                return sink["state"] == "blocked" and blocked_by in (sink["last_error"] or "")

            wait_until(lambda: blocked() or errors, 30, f"the sink blocked by {blocked_by!r}")
            status = service.status()
            assert status["last_error"].startswith("blocked: ") and blocked_by in status["last_error"]
            time.sleep(HOLD_S)
            # offsets are committed only past records that are in the table
            committed = _committed(kafka_conf, group, topic)
            present = _ids(pg_engine, table)
            behind = {key for key, (part, offset) in producer.delivered.items() if offset < committed[part]}
            assert behind <= present, sorted(behind - present)[:10]
            assert len(present) < RECORDS and group_lag(kafka_conf, group, topic) > 0
            assert service.status()["sinks"][0]["state"] == "blocked"
        finally:
            mend_target()
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0 or errors, 60, "lag back to 0 after the mend")
        assert not errors, errors
        # the status document is refreshed every second
        wait_until(lambda: service.status()["sinks"][0]["state"] == "running", 10, "the sink running again")
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors
    assert _ids(pg_engine, table) == set(range(RECORDS))
    assert service.metrics.value("threes_sync_dead_letters_total", stage="write") == 0
    assert _records_in(kafka_conf, dlq) == 0


def _create_table(pg_engine: Any, table: str) -> None:
    with pg_engine.begin() as conn:
        for name in (table, f"{table}__deleted"):
            conn.execute(text(f"DROP TABLE IF EXISTS {name}"))
        conn.execute(text(f"CREATE TABLE {table} (id BIGINT PRIMARY KEY, name TEXT NOT NULL, qty INTEGER, "
                          "updated_at TIMESTAMPTZ, note TEXT, _version BIGINT NOT NULL)"))
        conn.execute(text(f"CREATE TABLE {table}__deleted (id BIGINT PRIMARY KEY, _version BIGINT NOT NULL)"))


def test_revoked_privileges_block_the_sink_until_granted_again(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any, unique: str
) -> None:
    table, role, password = f"revoked_{unique}", f"sink_{unique}", secrets.token_hex(12)
    _create_table(pg_engine, table)
    with pg_engine.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'"))
        conn.execute(text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table}, {table}__deleted TO {role}"))
    url = make_url(pg.url).set(username=role, password=None)
    connection = {"type": "rds", "url": url.render_as_string(hide_password=False), "password": password}

    def revoke() -> None:
        with pg_engine.begin() as conn:
            conn.execute(text(f"REVOKE INSERT, UPDATE ON {table} FROM {role}"))

    def grant() -> None:
        with pg_engine.begin() as conn:
            conn.execute(text(f"GRANT INSERT, UPDATE ON {table} TO {role}"))

    try:
        _drill(kafka, kafka_conf, pg_engine, connection, unique, table, revoke, grant,
               f"permission denied for table {table}")
    finally:
        with pg_engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}, {table}__deleted"))
            # a sink session that has not ended yet still owns its temporary staging table, which a
            # DROP ROLE refuses: end the role's sessions first (their temp tables go with them)
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = :role"),
                         {"role": role})
        for _ in range(50):
            with pg_engine.connect() as conn:
                left = conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE usename = :role"),
                                    {"role": role}).scalar()
            if not left:
                break
            time.sleep(0.1)
        with pg_engine.begin() as conn:
            conn.execute(text(f"DROP ROLE IF EXISTS {role}"))


def test_a_column_dropped_and_added_again_blocks_the_sink_until_it_is_back(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any, unique: str
) -> None:
    table = f"migrated_{unique}"
    _create_table(pg_engine, table)
    connection = {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}

    def drop() -> None:
        with pg_engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {table} DROP COLUMN note"))

    def add() -> None:
        with pg_engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {table} ADD COLUMN note TEXT"))

    try:
        _drill(kafka, kafka_conf, pg_engine, connection, unique, table, drop, add, "note")
        with pg_engine.connect() as conn:  # the rows written after the column came back carry it
            notes = dict(conn.execute(text(f"SELECT id, note FROM {table} WHERE id >= {RECORDS // 2}")).all())
        assert notes == {k: item(k, 1)["note"] for k in range(RECORDS // 2, RECORDS)}
    finally:
        with pg_engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {table}, {table}__deleted"))


def test_one_document_over_the_limit_and_one_refused_alone_are_the_only_dead_letters(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], es_conn: ElasticsearchConnection, es: Any, unique: str
) -> None:
    n, limit = 2 * RECORDS, 256 * 1024
    too_big, immense = n // 3, 2 * n // 3
    topic, dlq, index = f"updates.limits.{unique}", f"dlq.limits.{unique}", f"limits-{unique}"
    create_topic(kafka_conf, topic, 1)
    producer = UpdateProducer(kafka, topic)
    for key in range(n):
        if key == too_big:  # over max_record_bytes: never sent
            producer.send(key, 1, {**item(key, 1), "note": "x" * (2 * limit)})
        elif key == immense:  # under the limit, but a keyword term over Lucene's 32,766 bytes: refused alone (400)
            producer.send(key, 1, {**item(key, 1), "name": "y" * 40_000})
        else:
            producer.send(key, 1)
    producer.flush()
    p = pipeline(kafka, {"es": {"type": "elasticsearch", "hosts": es_conn.hosts}},
                 [{"name": f"limits-{unique}", "dead_letter_topic": dlq,
                   "batch": {"max_records": 500, "max_age_ms": 200},
                   "sinks": [{"name": "search", "type": "elasticsearch_sink", "connection": "es", "topics": [topic],
                              "index": index, "max_record_bytes": limit}]}])
    service = SyncService(p.kafka, p.sync[0], dict(p.connections))
    thread, stop, errors = run_in_thread(service)
    try:
        group = p.sync[0].consumer_group()
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0 or errors, 120, "lag back to 0")
        assert not errors, errors
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors

    letters = read_topic(kafka_conf, dlq, 2)
    by_key = {producer.key_of(m): DeadLetter.from_headers(m.headers()) for m in letters}
    assert sorted(by_key) == [too_big, immense]
    for key, letter in by_key.items():
        partition, offset = producer.delivered[key]
        assert (letter.topic, letter.partition, letter.offset, letter.stage) == (topic, partition, offset, "write")
    assert f"is over max_record_bytes ({limit} bytes)" in by_key[too_big].message
    assert "refused _id" in by_key[immense].message and "(400 document_parsing_exception)" in by_key[immense].message
    es.indices.refresh(index=index)
    assert es.count(index=index)["count"] == n - 2
    assert not es.exists(index=index, id=str(too_big)) and not es.exists(index=index, id=str(immense))
    es.indices.delete(index=index)
