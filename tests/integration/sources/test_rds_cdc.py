"""``rds_source`` ``mode: cdc`` against the stack's PostgreSQL (wal_level = logical) and Kafka.

Interleaved transactions (one long) arrive in commit order with their commit
LSN as the version, deletes as tombstones at once (reconciliation is off); the
slot moves only once Kafka holds the changes; a server or role that cannot
serve logical replication is refused in one line.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from sqlalchemy import text

from connectors.rds.cdc_setup import default_name
from connectors.rds.pgoutput import lsn_int
from connectors.runtime.offsets import OffsetStore
from kernel.exceptions import SetupError
from kernel.kafka.topics import end_offsets
from kernel.updates import VERSION_HEADER, decode_version
from schemas.serde import AvroDeserializer
from schemas.store import SchemaStore
from tests.integration.sources.rds import source_pipeline
from threes.testing.source import run_once


def changes(kafka_conf: dict[str, Any], topic: str, isolation: str = "read_uncommitted") -> list[tuple[Any, ...]]:
    """Every record of ``topic`` in offset order: ``(partition, id, value or None, version)``."""
    ends = end_offsets(kafka_conf, topic)
    consumer = Consumer({**kafka_conf, "group.id": f"cdc-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "isolation.level": isolation})
    de = AvroDeserializer(SchemaStore(kafka_conf))
    out: list[tuple[Any, ...]] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        pending = {p for p, end in ends.items() if end > 0}
        while pending:
            msgs = consumer.consume(10_000, timeout=1.0)
            if not msgs and isolation == "read_committed":
                break  # transaction markers leave the last offsets unreadable
            for msg in msgs:
                assert msg.error() is None, msg.error()
                headers = dict(msg.headers() or [])
                value = None if msg.value() is None else de(msg.value())
                version = decode_version(headers[VERSION_HEADER]) if VERSION_HEADER in headers else None
                out.append((msg.partition(), de(msg.key())["id"], value, version))
                if msg.offset() + 1 >= ends[msg.partition()]:
                    pending.discard(msg.partition())
    finally:
        consumer.close()
    return out


def wal_lsn(engine: Any) -> int:
    with engine.connect() as c:
        return lsn_int(c.execute(text("SELECT pg_current_wal_lsn()::text")).scalar_one())


def drop_slot(engine: Any, connector: str) -> None:
    """Drop the connector's slot (it retains WAL) once its WAL sender is gone, and its publication."""
    slot = default_name(connector)
    with engine.connect() as c:
        for _ in range(50):
            if not c.execute(text("SELECT active FROM pg_replication_slots WHERE slot_name = :s"),
                             {"s": slot}).scalar():
                break
            time.sleep(0.2)
        c.execute(text("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                       "WHERE slot_name = :s"), {"s": slot})
        c.execute(text(f'DROP PUBLICATION IF EXISTS "{slot}"'))
        c.commit()


@pytest.fixture
def cdc_names(pg_engine: Any, unique: str) -> Iterator[dict[str, str]]:
    """Table, connector, topic names; the slot and publication are dropped afterwards (a slot retains WAL)."""
    name = f"cdc-{unique}"
    yield {"table": f"cdc_{unique}", "name": name, "topic": f"state.cdc.{unique}"}
    drop_slot(pg_engine, name)


def _pipeline(kafka: Any, pg: Any, names: dict[str, str], **extra: Any) -> Any:
    return source_pipeline(kafka, pg, name=names["name"], topic=names["topic"], table=names["table"],
                           mode="cdc", topic_spec={"partitions": 1}, **extra)


def test_interleaved_transactions_arrive_in_commit_order_with_lsn_versions(
    pg: Any, pg_engine: Any, kafka: Any, kafka_conf: Any, cdc_names: dict[str, str]
) -> None:
    t = cdc_names["table"]
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, v text NOT NULL, n int)"))
        c.execute(text(f"INSERT INTO {t} SELECT g, 'v' || g, g FROM generate_series(1, 5) g"))
    pipeline = _pipeline(kafka, pg, cdc_names)
    run_once(pipeline)
    snap = changes(kafka_conf, cdc_names["topic"])
    assert sorted(r[1] for r in snap) == [1, 2, 3, 4, 5]
    snap_versions = {r[3] for r in snap}
    assert len(snap_versions) == 1 and None not in snap_versions  # the slot's consistent point

    # a long transaction L opens first and commits third; A and B commit inside it; C after it
    long_tx = pg_engine.connect()
    long_tx.execute(text(f"UPDATE {t} SET v = 'L1' WHERE id = 1"))
    long_tx.execute(text(f"INSERT INTO {t} VALUES (100, 'L-new', 0)"))
    bounds: dict[str, tuple[int, int]] = {}

    def commit(label: str, statements: list[str]) -> None:
        with pg_engine.connect() as c:
            for s in statements:
                c.execute(text(s))
            before = wal_lsn(pg_engine)
            c.commit()
        bounds[label] = (before, wal_lsn(pg_engine))

    commit("A", [f"INSERT INTO {t} VALUES (6, 'A', 6)"])
    commit("B", [f"UPDATE {t} SET v = 'B', n = NULL WHERE id = 2", f"DELETE FROM {t} WHERE id = 3"])
    long_tx.execute(text(f"DELETE FROM {t} WHERE id = 4"))
    long_tx.execute(text(f"UPDATE {t} SET v = 'L2' WHERE id = 100"))
    before = wal_lsn(pg_engine)
    long_tx.commit()
    long_tx.close()
    bounds["L"] = (before, wal_lsn(pg_engine))
    commit("C", [f"UPDATE {t} SET v = 'C' WHERE id = 1"])

    run_once(pipeline)
    got = changes(kafka_conf, cdc_names["topic"])[len(snap):]
    shape = [(i, None if v is None else v["v"]) for _p, i, v, _ver in got]
    assert shape == [
        (6, "A"),
        (2, "B"), (3, None),
        (1, "L1"), (100, "L-new"), (4, None), (100, "L2"),
        (1, "C"),
    ]
    assert got[1][2]["n"] is None
    labels = ["A", "B", "B", "L", "L", "L", "L", "C"]
    for (_p, _i, _v, version), label in zip(got, labels, strict=True):
        lo, hi = bounds[label]
        assert lo <= version < hi, (label, version, bounds[label])  # the transaction's commit LSN
    versions = [r[3] for r in got]
    assert versions == sorted(versions) and min(versions) > next(iter(snap_versions))

    # the slot moved only as far as what Kafka holds; the stored position is the last commit's end
    position = OffsetStore(kafka_conf).load(cdc_names["name"])
    assert position["mode"] == "cdc" and position["snapshot"] is None
    assert position["lsn"] > bounds["C"][0]
    with pg_engine.connect() as c:
        confirmed = c.execute(text("SELECT confirmed_flush_lsn::text FROM pg_replication_slots "
                                   "WHERE slot_name = :s"), {"s": default_name(cdc_names["name"])}).scalar_one()
    assert bounds["L"][1] <= lsn_int(confirmed) <= position["lsn"]

    # a third run with nothing new adds nothing (the slot resumes after the last acknowledged commit)
    run_once(pipeline)
    assert len(changes(kafka_conf, cdc_names["topic"])) == len(snap) + len(got)


def test_a_table_whose_deletes_carry_no_key_is_refused_in_one_line(
    pg: Any, pg_engine: Any, kafka: Any, cdc_names: dict[str, str]
) -> None:
    from connectors.rds.source import RdsSource

    t = cdc_names["table"]
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, v text)"))
        c.execute(text(f"ALTER TABLE {t} REPLICA IDENTITY NOTHING"))
    pipeline = _pipeline(kafka, pg, cdc_names)
    task = RdsSource(pipeline.sources[0], pipeline.connections["pg"], kafka=kafka)
    try:
        with pytest.raises(SetupError) as err:
            task.open(None)
    finally:
        task.close()
    assert "REPLICA IDENTITY FULL" in str(err.value) and "\n" not in str(err.value)


def test_key_changes_unchanged_large_values_and_a_transaction_larger_than_a_batch(
    pg: Any, pg_engine: Any, kafka: Any, kafka_conf: Any, cdc_names: dict[str, str]
) -> None:
    t = cdc_names["table"]
    big = "x" * 100_000  # TOASTed: an update that leaves it alone does not carry it in the WAL
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, v text NOT NULL, doc text)"))
        c.execute(text(f"ALTER TABLE {t} ALTER COLUMN doc SET STORAGE EXTERNAL"))
        c.execute(text(f"INSERT INTO {t} VALUES (1, 'a', :d)"), {"d": big})
    pipeline = _pipeline(kafka, pg, cdc_names, batch_records=50)
    run_once(pipeline)
    before = len(changes(kafka_conf, cdc_names["topic"]))
    with pg_engine.begin() as c:
        c.execute(text(f"UPDATE {t} SET v = 'b' WHERE id = 1"))  # doc unchanged (not in the WAL record)
    run_once(pipeline)  # (read from the table by key: were the row gone by then, its delete would follow)
    with pg_engine.begin() as c:
        c.execute(text(f"UPDATE {t} SET id = 2 WHERE id = 1"))  # the key changed
        c.execute(text(f"INSERT INTO {t} SELECT g, 'bulk', NULL FROM generate_series(10, 129) g"))  # 120 > 50
    run_once(pipeline)
    got = changes(kafka_conf, cdc_names["topic"])[before:]
    assert [(i, None if v is None else v["v"]) for _p, i, v, _ver in got[:3]] == [(1, "b"), (1, None), (2, "b")]
    assert got[0][2]["doc"] == big and got[2][2]["doc"] == big  # filled in, not null
    assert [i for _p, i, _v, _ver in got[3:]] == list(range(10, 130))  # all of it, in order
    assert len({ver for *_r, ver in got[1:]}) == 1  # one transaction, one version
    assert got[0][3] < got[1][3]


def test_nan_in_numeric_is_null_or_left_out_and_later_changes_arrive(
    pg: Any, pg_engine: Any, kafka: Any, kafka_conf: Any, cdc_names: dict[str, str]
) -> None:
    """Issue #40 item 7, in the snapshot and in the change stream: a NaN never stops the source on its row."""
    import decimal

    t = cdc_names["table"]
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, amount numeric(10,2), must numeric(10,2) NOT NULL)"))
        c.execute(text(f"INSERT INTO {t} VALUES (1, 'NaN', 1), (2, 2, 'NaN'), (3, 3, 3)"))
    pipeline = _pipeline(kafka, pg, cdc_names)
    (s,) = run_once(pipeline).values()
    assert s.error is None, s.error
    snap = changes(kafka_conf, cdc_names["topic"])
    d = decimal.Decimal
    assert [(i, v) for _p, i, v, _ver in snap] == [
        (1, {"id": 1, "amount": None, "must": d("1.00")}), (3, {"id": 3, "amount": d("3.00"), "must": d("3.00")})]
    with pg_engine.begin() as c:
        c.execute(text(f"INSERT INTO {t} VALUES (4, 'NaN', 4), (5, 5, 'NaN')"))
    with pg_engine.begin() as c:
        c.execute(text(f"INSERT INTO {t} VALUES (6, 6, 6)"))
    (s,) = run_once(pipeline).values()
    assert s.error is None, s.error
    got = changes(kafka_conf, cdc_names["topic"])[len(snap):]
    assert [(i, v) for _p, i, v, _ver in got] == [
        (4, {"id": 4, "amount": None, "must": d("4.00")}), (6, {"id": 6, "amount": d("6.00"), "must": d("6.00")})]


def test_unbounded_numeric_arrives_exactly_with_the_default_decimal_handling(
    pg: Any, pg_engine: Any, kafka: Any, kafka_conf: Any, cdc_names: dict[str, str]
) -> None:
    """Issue #49: 0.12345678901 (11 fractional digits) in an unbounded numeric once stopped change capture for good."""
    t = cdc_names["table"]
    big = "123456789012345678901234567890.123456789012345678901"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, amount numeric, price numeric(10,2))"))
        c.execute(text(f"INSERT INTO {t} VALUES (1, 0.12345678901, 1.50)"))
    pipeline = _pipeline(kafka, pg, cdc_names)
    (s,) = run_once(pipeline).values()
    assert s.error is None, s.error
    with pg_engine.begin() as c:
        c.execute(text(f"INSERT INTO {t} VALUES (2, 0.12345678901, 2.25), (3, {big}, 3), (4, 'NaN', 4)"))
    (s,) = run_once(pipeline).values()
    assert s.error is None, s.error
    import decimal

    got = [(i, v) for _p, i, v, _ver in changes(kafka_conf, cdc_names["topic"])]
    d = decimal.Decimal
    assert got == [
        (1, {"id": 1, "amount": "0.12345678901", "price": d("1.50")}),  # the snapshot
        (2, {"id": 2, "amount": "0.12345678901", "price": d("2.25")}),  # the change stream
        (3, {"id": 3, "amount": big, "price": d("3.00")}),
        (4, {"id": 4, "amount": "NaN", "price": d("4.00")}),
    ]


def test_a_change_that_cannot_be_encoded_stops_in_one_line_or_is_a_dead_letter(
    pg: Any, pg_engine: Any, kafka: Any, kafka_conf: Any, cdc_names: dict[str, str], caplog: Any
) -> None:
    """Issue #49: a transaction with one value Avro cannot carry (a 2-D array in an ``int[]`` column) and one good row.

    ``errors.tolerance: none`` (default): the source stops at it in one line naming the key and how to move on, the
    slot keeps the changes; ``all``: the bad change is a dead letter with its context, the good row and everything
    after it arrive, in the same Kafka transactions as the dead letter (``exactly_once``).
    """
    import json
    import logging

    from tests.integration.sources.rds import dead_letters

    t, name, topic = cdc_names["table"], cdc_names["name"], cdc_names["topic"]
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, v text NOT NULL, dims int[])"))
        c.execute(text(f"INSERT INTO {t} VALUES (1, 'snapshot', '{{1}}')"))
    pipeline = _pipeline(kafka, pg, cdc_names)
    (s,) = run_once(pipeline).values()
    assert s.error is None, s.error
    snapshot_position = OffsetStore(kafka_conf).load(name)
    with pg_engine.begin() as c:  # one transaction: the bad value, then a good row
        c.execute(text(f"INSERT INTO {t} VALUES (2, 'bad', '{{{{1,2}},{{3,4}}}}')"))
        c.execute(text(f"INSERT INTO {t} VALUES (3, 'good', '{{3}}')"))
    with pg_engine.begin() as c:
        c.execute(text(f"INSERT INTO {t} VALUES (4, 'after', NULL)"))

    caplog.set_level(logging.ERROR)
    (s,) = run_once(pipeline).values()
    assert s.state == "failed" and not s.restartable
    for part in (name, t, "{'id': 2}", 'column "dims"', "errors.tolerance: all", f"{topic}.dlq", "decimal_handling"):
        assert part in s.error, f"{part!r} missing from: {s.error}"
    assert "\n" not in s.error
    assert len([r for r in caplog.records if "{'id': 2}" in r.getMessage()]) == 1  # one line
    assert [i for _p, i, _v, _ver in changes(kafka_conf, topic)] == [1]  # nothing past it, nothing skipped
    assert OffsetStore(kafka_conf).load(name) == snapshot_position

    tolerant = _pipeline(kafka, pg, cdc_names, errors={"tolerance": "all"}, exactly_once=True)
    (s,) = run_once(tolerant).values()
    assert s.error is None, s.error
    assert s.dead_letters == 1
    got = changes(kafka_conf, topic, isolation="read_committed")
    assert [(i, v and v["v"]) for _p, i, v, _ver in got] == [(1, "snapshot"), (3, "good"), (4, "after")]
    ((key, value, headers),) = dead_letters(kafka_conf, f"{topic}.dlq")
    assert key == {"id": 2}
    assert value == {"id": 2, "v": "bad", "dims": [[1, 2], [3, 4]]}
    assert headers["dlq.topic"] == topic and headers["dlq.stage"] == "encode" and headers["dlq.component"] == name
    assert headers["dlq.source.table"] == t and headers["dlq.source.column"] == "dims"
    assert json.loads(headers["dlq.source.key"]) == {"id": 2}
    assert 'column "dims"' in headers["dlq.error.message"]
    position = json.loads(headers["dlq.source.position"])
    assert position["mode"] == "cdc" and position["lsn"] > snapshot_position["lsn"]

    with pg_engine.begin() as c:  # later changes flow
        c.execute(text(f"INSERT INTO {t} VALUES (5, 'later', '{{5}}')"))
    (s,) = run_once(tolerant).values()
    assert s.error is None, s.error
    got = changes(kafka_conf, topic, isolation="read_committed")
    assert [i for _p, i, _v, _ver in got] == [1, 3, 4, 5]
    assert len(dead_letters(kafka_conf, f"{topic}.dlq")) == 1
