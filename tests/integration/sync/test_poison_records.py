"""4 poison records among 10k: exactly 4 dead letters with their context, the rest applied, lag back to 0."""

from __future__ import annotations

from typing import Any

from sqlalchemy import MetaData, Table, func, select

from connectors.elasticsearch.connection import ElasticsearchConnection
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

N = 10_000
MALFORMED, UNDECODABLE, ES_REJECTS, DB_REFUSES = 1_000, 2_000, 3_000, 4_000


def test_four_poison_records(kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any,
                             es_conn: ElasticsearchConnection, es: Any, unique: str) -> None:
    topic, dlq, table, index = f"updates.poison.{unique}", f"dlq.{unique}", f"poison_{unique}", f"poison-{unique}"
    create_topic(kafka_conf, topic, 2)
    # the index maps qty as a short: 100,000 is out of its range (PostgreSQL's INTEGER takes it)
    es.indices.create(index=index, mappings={"properties": {"qty": {"type": "short"}}})
    producer = UpdateProducer(kafka, topic)
    for key in range(N):
        if key == MALFORMED:  # a valid header and fingerprint, a truncated body
            producer.send(key, 1, raw_value=producer.value_ser(item(key, 1))[:12])
        elif key == UNDECODABLE:  # not Avro at all
            producer.send(key, 1, raw_value=b'{"id": 2000, "json": "not avro"}')
        elif key == ES_REJECTS:
            producer.send(key, 1, {**item(key, 1), "qty": 100_000})
        elif key == DB_REFUSES:  # PostgreSQL text cannot hold a NUL character
            producer.send(key, 1, {**item(key, 1), "name": "nul\x00inside"})
        else:
            producer.send(key, 1)
    producer.flush()

    p = pipeline(kafka, {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()},
                         "es": {"type": "elasticsearch", "hosts": es_conn.hosts}},
                 [{"name": f"poison-{unique}", "dead_letter_topic": dlq,
                   "batch": {"max_records": 2_000, "max_age_ms": 200},
                   "sinks": [
                       {"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic], "table": table,
                        "key": ["id"], "create_table": True},
                       {"name": "search", "type": "elasticsearch_sink", "connection": "es", "topics": [topic],
                        "index": index},
                   ]}])
    service = SyncService(p.kafka, p.sync[0], dict(p.connections))
    thread, stop, errors = run_in_thread(service)
    try:
        group = p.sync[0].consumer_group()
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0 or errors, 120, "lag back to 0")
        assert not errors, errors
        assert service.metrics.value("threes_sync_dead_letters_total", stage="decode") == 2
        assert service.metrics.value("threes_sync_dead_letters_total", stage="write") == 2
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors

    letters = read_topic(kafka_conf, dlq, 4)
    assert len(letters) == 4
    by_key = {producer.key_of(m): (m, DeadLetter.from_headers(m.headers())) for m in letters}
    assert sorted(by_key) == [MALFORMED, UNDECODABLE, ES_REJECTS, DB_REFUSES]
    for key, (_msg, letter) in by_key.items():
        partition, offset = producer.delivered[key]
        assert (letter.topic, letter.partition, letter.offset) == (topic, partition, offset)
        assert f"{topic}[{partition}]@{offset}" in letter.message
    assert by_key[MALFORMED][1].stage == "decode" and by_key[MALFORMED][1].error_class == "SerdeError"
    assert by_key[UNDECODABLE][1].stage == "decode" and by_key[UNDECODABLE][1].error_class == "NotSingleObjectError"
    assert by_key[UNDECODABLE][0].value() == b'{"id": 2000, "json": "not avro"}'  # original bytes kept
    assert by_key[ES_REJECTS][1].stage == "write" and by_key[ES_REJECTS][1].component.endswith("/search")
    assert by_key[DB_REFUSES][1].stage == "write" and by_key[DB_REFUSES][1].component.endswith("/db")
    # psycopg's DataError, or its SQLSTATE 22021 subclass when the record is isolated on the COPY path
    assert by_key[DB_REFUSES][1].error_class in ("DataError", "CharacterNotInRepertoire")

    t = Table(table, MetaData(), autoload_with=pg_engine)
    with pg_engine.connect() as conn:
        db_keys = set(conn.execute(select(t.c.id)).scalars())
        assert conn.execute(select(func.count()).select_from(t)).scalar() == N - 3
    es.indices.refresh(index=index)
    assert es.count(index=index)["count"] == N - 3
    es_missing = {k for k in (MALFORMED, UNDECODABLE, ES_REJECTS, DB_REFUSES)
                  if es.exists(index=index, id=str(k))} ^ {DB_REFUSES}
    assert es_missing == set()
    assert db_keys == set(range(N)) - {MALFORMED, UNDECODABLE, DB_REFUSES}
    applied_everywhere = db_keys - {ES_REJECTS}
    assert len(applied_everywhere) == 9_996
    t.drop(pg_engine)
    es.indices.delete(index=index)
