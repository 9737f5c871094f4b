"""``evolve_table`` adds a column for a new field of the update topic's writer schema (issue #43, part 2).

Before, a new field made every record of the new writer schema block the sink (a value field that is not a
column). Real PostgreSQL and MariaDB; the service test runs two sync replicas of one consumer group that race on
the ``ALTER TABLE``.
"""

from __future__ import annotations

import random
from typing import Any

import fastavro
import pytest
from sqlalchemy import MetaData, Table, select

from connectors.api.sink_records import SinkBatch, SinkRecord
from connectors.rds.config import RdsSinkConfig
from connectors.rds.connection import RdsConnection
from connectors.rds.sink import RdsSink
from connectors.rds.sink_fit import REQUIRED_COMMENT
from kernel.config.policies import RetryPolicy
from kernel.exceptions import SinkBlockedError
from kernel.updates import encode_version
from schemas.serde import AvroDeserializer, AvroSerializer, fingerprint
from schemas.store import InMemorySchemaStore
from sync_service.batching import Job
from sync_service.metrics import SyncMetrics
from sync_service.writer import BatchWriter
from tests.unit.sync_service.fakes import FakeMessage, FakeProducer, ScriptedSink

pytestmark = pytest.mark.integration

BASE = [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}]
NOTE = {"name": "note", "type": ["null", "string"], "default": None}
QTY = {"name": "qty", "type": "int", "default": 7}  # required, with a default: existing rows hold 7
SCORE = {"name": "score", "type": ["null", "double"], "default": None}


def schema(*extra: dict[str, Any]) -> dict[str, Any]:
    return {"type": "record", "name": "Thing", "namespace": "threes.test.evolve", "fields": [*BASE, *extra]}


def value(key: int, version: int, sch: dict[str, Any]) -> dict[str, Any]:
    full = {"id": key, "name": f"t{key}-v{version}", "note": f"n{key}-v{version}", "qty": key * 100 + version,
            "score": key + version / 4, "weight": key}
    return {f["name"]: full[f["name"]] for f in sch["fields"]}


def decoded(sch: dict[str, Any], rows: list[tuple[int, int]]) -> SinkBatch:
    """A batch decoded as the sync service decodes it (values in Arrow columns); ``rows``: (key, version)."""
    store = InMemorySchemaStore()
    key_ser, value_ser = AvroSerializer("long", store), AvroSerializer(sch, store)
    raw = [FakeMessage(v, key_ser(k), value_ser(value(k, v, sch)), headers=[("version", encode_version(v))])
           for k, v in rows]
    writer = BatchWriter("svc", ScriptedSink(), AvroDeserializer(store), FakeProducer(), "dlq", RetryPolicy(),
                         SyncMetrics("svc"))
    batch = writer.decode(Job("fake", "t", 0, raw, 100))
    assert batch.tables, "decoded in columns"
    return batch


def per_record(sch: dict[str, Any], rows: list[tuple[int, int]]) -> SinkBatch:
    """The same records with dict values and no Arrow table (the per-record path)."""
    parsed, fp = fastavro.parse_schema(sch), fingerprint(sch)
    records = [SinkRecord("t", 0, v, k, value(k, v, sch), v, 0, 100, parsed, fp) for k, v in rows]
    return SinkBatch("t", 0, records[0].offset, records[-1].offset, records)


def make_sink(db: RdsConnection, table: str, **extra: Any) -> RdsSink:
    sink = RdsSink(RdsSinkConfig(name=f"s-{table}", type="rds_sink", connection="db", topics=["t"], table=table,
                                 key=["id"], create_table=True, **extra), db)
    sink.open()
    return sink


def rows_of(engine: Any, table: str) -> dict[int, dict[str, Any]]:
    t = Table(table, MetaData(), autoload_with=engine)
    with engine.connect() as conn:
        return {r["id"]: {k: v for k, v in r.items() if k not in ("id", "_version")}
                for r in (row._asdict() for row in conn.execute(select(t)))}


def drop(engine: Any, table: str) -> None:
    for name in (table, f"{table}__deleted"):
        Table(name, MetaData()).drop(engine, checkfirst=True)


@pytest.fixture(params=["postgres", "mariadb"])
def db(request: pytest.FixtureRequest) -> RdsConnection:
    return request.getfixturevalue("pg" if request.param == "postgres" else "mysql")


@pytest.mark.parametrize("make_batch", [decoded, per_record], ids=["columnar", "per-record"])
def test_new_fields_add_columns_and_existing_rows_hold_their_defaults(db: RdsConnection, unique: str,
                                                                      make_batch: Any) -> None:
    sink = make_sink(db, f"evadd_{unique}", evolve_table=True)
    try:
        assert sink.write(make_batch(schema(), [(1, 1), (2, 2)])) == []
        assert sink.write(make_batch(schema(NOTE, QTY), [(2, 3), (3, 4)])) == []
        columns = Table(sink.config.table, MetaData(), autoload_with=sink.engine).c
        assert [c.name for c in columns] == ["id", "name", "_version", "note", "qty"]
        assert columns["qty"].comment == REQUIRED_COMMENT and columns["note"].comment is None
        assert rows_of(sink.engine, sink.config.table) == {
            1: {"name": "t1-v1", "note": None, "qty": 7},  # written before the column: the Avro default
            2: {"name": "t2-v3", "note": "n2-v3", "qty": 203},
            3: {"name": "t3-v4", "note": "n3-v4", "qty": 304},
        }
        # a restarted sink (or another replica) on the evolved table writes the new schema with no ALTER
        again = make_sink(db, f"evadd_{unique}", evolve_table=True)
        try:
            assert again.write(make_batch(schema(NOTE, QTY), [(1, 5)])) == []
            assert rows_of(again.engine, again.config.table)[1] == {"name": "t1-v5", "note": "n1-v5", "qty": 105}
        finally:
            again.close()
    finally:
        drop(sink.engine, sink.config.table)
        sink.close()


def test_a_new_required_field_without_default_blocks_naming_the_field(db: RdsConnection, unique: str) -> None:
    sink = make_sink(db, f"evreq_{unique}", evolve_table=True)
    try:
        assert sink.write(decoded(schema(), [(1, 1)])) == []
        required = {"name": "weight", "type": "long"}
        with pytest.raises(SinkBlockedError) as info:
            sink.write(decoded(schema(NOTE, required), [(2, 2)]))
        message = str(info.value)
        assert "'weight'" in message and "without a default" in message and "threes.test.evolve.Thing" in message
        assert "'note'" not in message
        # nothing was altered, nothing written: the sink waits for a person
        assert [c.name for c in Table(sink.config.table, MetaData(), autoload_with=sink.engine).c] == [
            "id", "name", "_version"]
        assert set(rows_of(sink.engine, sink.config.table)) == {1}
    finally:
        drop(sink.engine, sink.config.table)
        sink.close()


def test_without_evolve_table_a_new_field_blocks_and_says_how_to_add_it(pg: RdsConnection, unique: str) -> None:
    sink = make_sink(pg, f"evoff_{unique}")
    try:
        assert sink.write(decoded(schema(), [(1, 1)])) == []
        with pytest.raises(SinkBlockedError, match=r"\['note'\].*evolve_table: true"):
            sink.write(per_record(schema(NOTE), [(2, 2)]))
        assert [c.name for c in Table(sink.config.table, MetaData(), autoload_with=sink.engine).c] == [
            "id", "name", "_version"]
    finally:
        drop(sink.engine, sink.config.table)
        sink.close()


KEYS = 200


def test_two_replicas_add_two_columns_mid_stream_nothing_dead_lettered(
    kafka: Any, kafka_conf: dict[str, Any], db: RdsConnection, unique: str
) -> None:
    from connectors.rds.connection import sql_engine
    from kernel.kafka import clients
    from schemas.store import SchemaStore
    from sync_service.service import SyncService
    from tests.integration.sync.helpers import create_topic, group_lag, pipeline, run_in_thread, wait_until

    topic, table, dlq = f"updates.evolve.{unique}", f"evsvc_{unique}", f"dlq.evolve.{unique}"
    create_topic(kafka_conf, topic, 4)
    create_topic(kafka_conf, dlq, 1)
    store = SchemaStore(kafka.librdkafka_config(), kafka.schema_topic)
    key_ser = AvroSerializer("long", store)
    producer = clients.kafka_producer(kafka, linger_ms=5)
    oracle: dict[int, dict[str, Any]] = {}
    version = 0
    rng = random.Random(43)

    def send(sch: dict[str, Any], n: int) -> None:
        nonlocal version
        value_ser = AvroSerializer(sch, store)
        for i in range(n):
            version += 1
            key = i if i < KEYS else rng.randrange(KEYS)
            v = value(key, version, sch)
            producer.produce(topic, key=key_ser(key), value=value_ser(v), headers=[("version", encode_version(version))])
            # the sink writes whole rows: a field the record's schema lacks is NULL
            oracle[key] = {"name": v["name"], "note": v.get("note"), "score": v.get("score")}
            producer.poll(0)
        assert producer.flush(30) == 0

    connection = {"type": "rds", "url": db.url}
    if db.password is not None:
        connection["password"] = db.password.get_secret_value()
    p = pipeline(kafka, {"db": connection},
                 [{"name": f"evolve-{unique}", "dead_letter_topic": dlq, "session_timeout_ms": 6_000,
                   "batch": {"max_records": 100, "max_age_ms": 100},
                   "sinks": [{"name": "db", "type": "rds_sink", "connection": "db", "topics": [topic],
                              "table": table, "key": ["id"], "create_table": True, "evolve_table": True}]}])
    engine = sql_engine(db)
    first = SyncService(p.kafka, p.sync[0], dict(p.connections))
    second = SyncService(p.kafka, p.sync[0], dict(p.connections))
    t1, stop1, errors1 = run_in_thread(first)
    t2, stop2, errors2 = run_in_thread(second)
    try:
        wait_until(lambda: first._assigned and second._assigned and len(first._assigned | second._assigned) == 4,
                   60, "both replicas to own partitions")
        send(schema(), KEYS)
        wait_until(lambda: group_lag(kafka_conf, p.sync[0].consumer_group(), topic) == 0, 60, "the first records")
        # mid-stream, on every partition (both replicas see the new writer schemas): two new columns
        send(schema(NOTE), KEYS + 300)
        send(schema(NOTE, SCORE), KEYS + 300)
        wait_until(lambda: group_lag(kafka_conf, p.sync[0].consumer_group(), topic) == 0, 120, "lag 0")
        assert not errors1 and not errors2, errors1 + errors2
        assert first._assigned and second._assigned, "both replicas still run"
    finally:
        stop1.set()
        stop2.set()
        t1.join(60)
        t2.join(60)
    try:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({**kafka_conf, "group.id": f"evolve-check-{unique}"})
        try:
            low, high = consumer.get_watermark_offsets(TopicPartition(dlq, 0), timeout=10)
        finally:
            consumer.close()
        assert high - low == 0, "nothing dead-lettered"
        assert [c.name for c in Table(table, MetaData(), autoload_with=engine).c] == [
            "id", "name", "_version", "note", "score"]
        assert rows_of(engine, table) == oracle
    finally:
        drop(engine, table)
        engine.dispose()


def test_a_type_change_or_a_dropped_required_field_blocks_naming_column_and_schemas(db: RdsConnection,
                                                                                    unique: str) -> None:
    sink = make_sink(db, f"evchg_{unique}", evolve_table=True)
    try:
        weight = {"name": "weight", "type": "long"}
        assert sink.write(per_record(schema(weight), [(1, 1)])) == []
        as_text = {**schema(), "fields": [*BASE, {"name": "weight", "type": "string"}]}
        with pytest.raises(SinkBlockedError) as info:
            sink.write(per_record(as_text, [(2, 2)]))
        message = str(info.value)
        assert "column 'weight' is BIGINT" in message and "Avro type is now string" in message, message
        assert f"fingerprint {fingerprint(as_text).hex()}" in message
        # the field dropped: the column was created from a required field
        with pytest.raises(SinkBlockedError) as info:
            sink.write(per_record(schema(), [(3, 3)]))
        message = str(info.value)
        assert "required column 'weight' has no field" in message and "required by" in message, message
        assert f"fingerprint {fingerprint(schema()).hex()}" in message
        assert set(rows_of(sink.engine, sink.config.table)) == {1}
    finally:
        drop(sink.engine, sink.config.table)
        sink.close()
