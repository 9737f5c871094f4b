"""RdsSink never rounds: a value the column cannot hold exactly is a record error, or a widened column (evolve_table).

Issue #40 item 3: a table created from ``decimal(12,2)`` values, then fed ``decimal(12,4)`` ones (a schema
change allowed with ``compatibility: NONE``), stored 1.2345 as 1.23. Real PostgreSQL and MariaDB.
"""

from __future__ import annotations

import logging
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from sqlalchemy import MetaData, Table, select

from connectors.api.sink_records import SinkBatch, SinkRecord
from connectors.rds.config import RdsSinkConfig
from connectors.rds.connection import RdsConnection
from connectors.rds.sink import RdsSink
from kernel.config.policies import RetryPolicy
from kernel.exceptions import SkippableRecordError
from kernel.updates import encode_version
from schemas.serde import AvroDeserializer, AvroSerializer, fingerprint
from schemas.store import InMemorySchemaStore
from sync_service.batching import Job
from sync_service.metrics import SyncMetrics
from sync_service.writer import BatchWriter
from tests.unit.sync_service.fakes import FakeMessage, FakeProducer, ScriptedSink

pytestmark = pytest.mark.integration


def schema(scale: int, *, qty: bool = True) -> dict[str, Any]:
    fields = [
        {"name": "id", "type": "long"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": scale}},
    ]
    if qty:
        fields.append({"name": "qty", "type": "int"})
    return {"type": "record", "name": "Payment", "namespace": "threes.test", "fields": fields}


def value(key: int, amount: str, sch: dict[str, Any]) -> dict[str, Any]:
    names = {f["name"] for f in sch["fields"]}
    return {k: v for k, v in {"id": key, "amount": Decimal(amount), "qty": key}.items() if k in names}


def decoded(sch: dict[str, Any], values: list[tuple[int, str]], first_offset: int) -> SinkBatch:
    """A batch decoded as the sync service decodes it: values in Arrow columns (the columnar path)."""
    store = InMemorySchemaStore()
    key_ser, value_ser = AvroSerializer("long", store), AvroSerializer(sch, store)
    raw = [FakeMessage(first_offset + i, key_ser(k), value_ser(value(k, a, sch)),
                       headers=[("version", encode_version(first_offset + i + 1))]) for i, (k, a) in enumerate(values)]
    writer = BatchWriter("svc", ScriptedSink(), AvroDeserializer(store), FakeProducer(), "dlq", RetryPolicy(),
                         SyncMetrics("svc"))
    batch = writer.decode(Job("fake", "t", 0, raw, 100))
    assert batch.tables, "decoded in columns"
    return batch


def per_record(sch: dict[str, Any], values: list[tuple[int, str]], first_offset: int) -> SinkBatch:
    """The same records with dict values and no Arrow table (the per-record path)."""
    parsed, fp = fastavro.parse_schema(sch), fingerprint(sch)
    records = [SinkRecord("t", 0, first_offset + i, k, value(k, a, sch), first_offset + i + 1, 0, 100, parsed, fp)
               for i, (k, a) in enumerate(values)]
    return SinkBatch("t", 0, records[0].offset, records[-1].offset, records)


def make_sink(db: RdsConnection, table: str, **extra: Any) -> RdsSink:
    sink = RdsSink(RdsSinkConfig(name=f"s-{table}", type="rds_sink", connection="db", topics=["t"], table=table,
                                 key=["id"], create_table=True, **extra), db)
    sink.open()
    return sink


def stored(sink: RdsSink) -> dict[int, Decimal]:
    table = Table(sink.config.table, MetaData(), autoload_with=sink.engine)
    with sink.engine.connect() as conn:
        return {r.id: r.amount for r in conn.execute(select(table.c.id, table.c.amount))}


def column_type(sink: RdsSink, name: str) -> tuple[int, int]:
    col = Table(sink.config.table, MetaData(), autoload_with=sink.engine).c[name]
    return col.type.precision, col.type.scale


def drop(sink: RdsSink) -> None:
    for name in (sink.config.table, f"{sink.config.table}__deleted"):
        Table(name, MetaData()).drop(sink.engine, checkfirst=True)
    sink.close()


@pytest.fixture(params=["postgres", "mariadb"])
def db(request: pytest.FixtureRequest) -> RdsConnection:
    return request.getfixturevalue("pg" if request.param == "postgres" else "mysql")


@pytest.mark.parametrize("make_batch", [decoded, per_record], ids=["columnar", "per-record"])
def test_a_wider_scale_goes_to_the_dead_letter_queue_never_rounded(db: RdsConnection, unique: str,
                                                                    make_batch: Any) -> None:
    sink = make_sink(db, f"prec_{unique}")
    try:
        assert sink.write(make_batch(schema(2), [(1, "1.23")], 0)) == []
        assert column_type(sink, "amount") == (12, 2)
        failures = sink.write(make_batch(schema(4), [(2, "1.2345"), (3, "0.0001"), (4, "5.5000"), (5, "-7.1200")], 1))
        assert sorted(f.record.key for f in failures) == [2, 3]
        for f in failures:
            assert isinstance(f.error, SkippableRecordError)
            message = str(f.error)
            assert "'amount'" in message and "decimal(12,4)" in message
            assert "(12, 2)" in message or "(12,2)" in message, message  # NUMERIC(12, 2) / DECIMAL(12,2)
        # values the column holds exactly are written; nothing is rounded
        assert stored(sink) == {1: Decimal("1.23"), 4: Decimal("5.50"), 5: Decimal("-7.12")}
        assert column_type(sink, "amount") == (12, 2)
    finally:
        drop(sink)


@pytest.mark.parametrize("make_batch", [decoded, per_record], ids=["columnar", "per-record"])
def test_evolve_table_widens_the_column_and_stores_the_exact_value(db: RdsConnection, unique: str,
                                                                   make_batch: Any) -> None:
    sink = make_sink(db, f"evol_{unique}", evolve_table=True)
    try:
        assert sink.write(make_batch(schema(2), [(1, "1.23"), (9, "9999999999.99")], 0)) == []
        assert sink.write(make_batch(schema(4), [(2, "1.2345"), (3, "0.0001")], 2)) == []
        # 10 integer digits (the column's) and 4 fractional ones (the new schema's)
        assert column_type(sink, "amount") == (14, 4)
        assert stored(sink) == {1: Decimal("1.23"), 9: Decimal("9999999999.99"), 2: Decimal("1.2345"),
                                3: Decimal("0.0001")}
        # a second sink on the widened table (a restart) writes as exactly, with no further change
        again = make_sink(db, f"evol_{unique}", evolve_table=True)
        try:
            assert again.write(make_batch(schema(4), [(2, "2.2345")], 4)) == []
            assert stored(again)[2] == Decimal("2.2345") and column_type(again, "amount") == (14, 4)
        finally:
            again.close()
    finally:
        drop(sink)


def test_a_dropped_required_field_is_a_warning_naming_table_and_column(pg: RdsConnection, unique: str,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    sink = make_sink(pg, f"req_{unique}")
    try:
        with caplog.at_level(logging.WARNING, logger="connectors.rds.sink"):
            assert sink.write(decoded(schema(2), [(1, "1.00")], 0)) == []
            assert not [r for r in caplog.records if "qty" in r.getMessage()]
            assert sink.write(decoded(schema(2, qty=False), [(2, "2.00")], 1)) == []
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(f"table=req_{unique}" in m and "column=qty" in m and "writes NULL" in m for m in warned), warned
        # a restarted sink knows the column was created from a required field (its comment)
        caplog.clear()
        restarted = make_sink(pg, f"req_{unique}")
        try:
            with caplog.at_level(logging.WARNING, logger="connectors.rds.sink"):
                assert restarted.write(decoded(schema(2, qty=False), [(3, "3.00")], 2)) == []
            warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
            assert any(f"table=req_{unique}" in m and "column=qty" in m for m in warned), warned
        finally:
            restarted.close()
        table = Table(sink.config.table, MetaData(), autoload_with=sink.engine)
        with sink.engine.connect() as conn:
            assert dict(conn.execute(select(table.c.id, table.c.qty)).all()) == {1: 1, 2: None, 3: None}
    finally:
        drop(sink)


def test_through_the_sync_service_the_reason_reaches_the_dead_letter_topic(
    kafka: Any, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any, unique: str
) -> None:
    from kernel.kafka import clients
    from schemas.store import SchemaStore
    from sync_service.service import SyncService
    from tests.integration.sync.helpers import create_topic, pipeline, read_topic, run_in_thread, wait_until

    topic, table, dlq = f"updates.prec.{unique}", f"precsvc_{unique}", f"dlq.{unique}"
    create_topic(kafka_conf, topic, 1)
    store = SchemaStore(kafka.librdkafka_config(), kafka.schema_topic)
    key_ser = AvroSerializer("long", store)
    producer = clients.kafka_producer(kafka, linger_ms=5)
    version = 0
    for sch, rows in [(schema(2), [(1, "1.23")]), (schema(4), [(2, "1.2345"), (3, "0.0001"), (4, "5.5000")])]:
        value_ser = AvroSerializer(sch, store)
        for key, amount in rows:
            version += 1
            producer.produce(topic, key=key_ser(key), value=value_ser(value(key, amount, sch)),
                             headers=[("version", encode_version(version))])
    assert producer.flush(30) == 0
    p = pipeline(kafka, {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
                 [{"name": f"prec-{unique}", "dead_letter_topic": dlq,
                   "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic],
                              "table": table, "key": ["id"], "create_table": True}]}])
    service = SyncService(p.kafka, p.sync[0], dict(p.connections))
    thread, stop, errors = run_in_thread(service)
    try:
        letters = read_topic(kafka_conf, dlq, 2, timeout_s=60)
        assert sorted(m.offset() for m in letters) == [0, 1]
        headers = [{k: v.decode() for k, v in m.headers()} for m in letters]
        assert sorted(int(h["dlq.offset"]) for h in headers) == [1, 2]
        for h in headers:
            assert h["dlq.error.class"] == "SkippableRecordError"
            message = h["dlq.error.message"]
            assert "'amount'" in message and "NUMERIC(12, 2)" in message and "decimal(12,4)" in message, message

        def written() -> dict[int, Decimal]:
            table_ = Table(table, MetaData(), autoload_with=pg_engine)
            with pg_engine.connect() as conn:
                return {r.id: r.amount for r in conn.execute(select(table_.c.id, table_.c.amount))}

        wait_until(lambda: len(written()) == 2, 30, "the fitting records written")
        assert written() == {1: Decimal("1.23"), 4: Decimal("5.50")}
        assert not errors, errors
    finally:
        stop.set()
        thread.join(60)
        for name in (table, f"{table}__deleted"):
            Table(name, MetaData()).drop(pg_engine, checkfirst=True)
