"""``rds_source`` ``mode: cdc`` on the stack's MariaDB (row-based binlog) and Kafka.

A snapshot taken while writers commit, then the binlog from the snapshot's position: no change lost, none
before it applied twice; inserts, updates, deletes (tombstones), key changes and a transaction larger than a
batch in commit order with binlog-position versions; every type exact in the snapshot and in the stream; a
column added mid-stream is published as a new schema; TRUNCATE tombstones every key; a purged position stops
in one line or takes a new snapshot, as configured; a value Avro cannot carry is a dead letter; a user without
replication privileges is refused in one line by ``threes check`` and at start; an interrupted snapshot resumes
after its last key; a position the server cannot send (error 1236) is detected while streaming.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from sqlalchemy import text

from connectors.rds.binlog_rows import SchemaChanged
from connectors.rds.connection import RdsConnection
from connectors.rds.source import RdsSource
from connectors.runtime.offsets import OFFSETS_TOPIC, OffsetStore
from kernel.exceptions import SetupError
from tests.integration.sources.rds import dead_letters, source_pipeline
from tests.integration.sources.test_rds_cdc import changes
from threes.testing.source import run_once

D = decimal.Decimal


@pytest.fixture
def names(mysql_engine: Any, unique: str) -> Iterator[dict[str, str]]:
    """Table, connector and topic names; the table is dropped afterwards."""
    yield {"table": f"bcdc_{unique}", "name": f"bcdc-{unique}", "topic": f"state.bcdc.{unique}"}
    with mysql_engine.begin() as c:
        c.execute(text(f"DROP TABLE IF EXISTS bcdc_{unique}"))


def _pipeline(kafka: Any, mysql: RdsConnection, names: dict[str, str], **extra: Any) -> Any:
    return source_pipeline(
        kafka,
        mysql,
        name=names["name"],
        topic=names["topic"],
        table=names["table"],
        mode="cdc",
        topic_spec={"partitions": 1},
        **extra,
    )


def _ok(pipeline: Any) -> Any:
    (s,) = run_once(pipeline).values()
    assert s.error is None, s.error
    return s


def _latest(records: list[tuple[Any, ...]]) -> dict[Any, Any]:
    latest: dict[Any, Any] = {}
    for _p, key, value, _version in records:
        latest[key] = value
    return latest


def test_a_snapshot_taken_during_writes_then_the_binlog_lose_nothing(
    mysql: Any, mysql_engine: Any, kafka: Any, kafka_conf: Any, names: dict[str, str]
) -> None:
    t = names["table"]
    with mysql_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL)"))
        c.execute(text(f"INSERT INTO {t} VALUES " + ",".join(f"({i}, 0)" for i in range(1, 2001))))
    stop = threading.Event()
    deleted: list[int] = []

    def write() -> None:  # commits while the snapshot pages are read (batch_records 100: 20 pages)
        i = 0
        while not stop.is_set():
            i += 1
            with mysql_engine.begin() as c:
                c.execute(text(f"UPDATE {t} SET v = v + 1 WHERE id = :id"), {"id": (i * 37) % 2000 + 1})
                c.execute(text(f"INSERT INTO {t} VALUES (:id, 1)"), {"id": 10_000 + i})
                if i % 3 == 0:
                    c.execute(text(f"DELETE FROM {t} WHERE id = :id"), {"id": (i * 53) % 2000 + 1})
                    deleted.append((i * 53) % 2000 + 1)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        pipeline = _pipeline(kafka, mysql, names, batch_records=100)
        _ok(pipeline)
    finally:
        stop.set()
        writer.join(30)
    _ok(pipeline)
    got = changes(kafka_conf, names["topic"])
    with mysql_engine.connect() as c:
        table = dict(c.execute(text(f"SELECT id, v FROM {t}")).all())
    latest = _latest(got)
    assert {k: v["v"] for k, v in latest.items() if v is not None} == table
    # a row deleted before the snapshot read it never reached the topic; every other ends in a tombstone
    tombstoned = {k for k, v in latest.items() if v is None}
    assert deleted and tombstoned and tombstoned <= set(deleted)
    assert all(k in tombstoned for k in set(deleted) if k in latest)
    versions = [r[3] for r in got]
    assert versions == sorted(versions)  # the snapshot's version, then the binlog's, in commit order
    position = OffsetStore(kafka_conf).load(names["name"])
    assert position["mode"] == "cdc" and position["snapshot"] is None and position["gtid"]


def test_changes_arrive_in_commit_order_with_tombstones_key_changes_and_large_transactions(
    mysql: Any, mysql_engine: Any, kafka: Any, kafka_conf: Any, names: dict[str, str]
) -> None:
    t = names["table"]
    with mysql_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, v varchar(20) NOT NULL, n int)"))
        c.execute(text(f"INSERT INTO {t} VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3), (4, 'd', 4)"))
    pipeline = _pipeline(kafka, mysql, names, batch_records=50)
    _ok(pipeline)
    snap = changes(kafka_conf, names["topic"])
    assert sorted(r[1] for r in snap) == [1, 2, 3, 4] and len({r[3] for r in snap}) == 1

    long_tx = mysql_engine.connect()  # opens first, commits after A and B
    long_tx.execute(text(f"UPDATE {t} SET v = 'L1' WHERE id = 1"))
    with mysql_engine.begin() as c:
        c.execute(text(f"INSERT INTO {t} VALUES (5, 'A', 5)"))
    with mysql_engine.begin() as c:
        c.execute(text(f"UPDATE {t} SET v = 'B', n = NULL WHERE id = 2"))
        c.execute(text(f"DELETE FROM {t} WHERE id = 3"))
    long_tx.execute(text(f"DELETE FROM {t} WHERE id = 4"))
    long_tx.commit()
    long_tx.close()
    with mysql_engine.begin() as c:
        c.execute(text(f"UPDATE {t} SET id = 10 WHERE id = 1"))  # the key changed
        c.execute(text(f"INSERT INTO {t} VALUES " + ",".join(f"({i}, 'bulk', {i})" for i in range(100, 220))))
    _ok(pipeline)
    got = changes(kafka_conf, names["topic"])[len(snap) :]
    shape = [(i, None if v is None else v["v"]) for _p, i, v, _ver in got]
    assert shape[:7] == [(5, "A"), (2, "B"), (3, None), (1, "L1"), (4, None), (1, None), (10, "L1")]
    assert got[1][2]["n"] is None
    assert [i for _p, i, _v, _ver in got[7:]] == list(range(100, 220))  # 120 rows > 50: all, in order
    versions = [r[3] for r in got]
    assert versions == sorted(versions) and versions[0] > snap[0][3]
    assert len({versions[1], versions[2]}) == 1 and len(set(versions[5:])) == 1  # one transaction, one version
    assert len(set(versions[:5])) == 3
    _ok(pipeline)  # nothing new: nothing added
    assert len(changes(kafka_conf, names["topic"])) == len(snap) + len(got)


TYPES_DDL = (
    "CREATE TABLE {t} (id bigint unsigned PRIMARY KEY, amount decimal(30,10) NOT NULL, at datetime(6), "
    "instant timestamp(6) NULL, doc json, state enum('new','paid','void'), tags set('x','y','z'), data blob, "
    "note varchar(40), ratio double, alarm time(6), born date)"
)
TYPES_ROW = (
    "INSERT INTO {t} VALUES ({id}, 12345678901234567890.0123456789, '2024-02-29 23:59:59.123456', "
    "'2024-02-29 23:59:59.654321', '{{\"a\": [1, 2.5, \"é\"]}}', 'paid', 'z,x', x'00ff10', 'héllo ✓', 1.5, "
    "'12:34:56.000001', '2024-01-01')"
)


def _expected(i: int) -> dict[str, Any]:
    return {
        "id": D(i),
        "amount": D("12345678901234567890.0123456789"),
        "at": dt.datetime(2024, 2, 29, 23, 59, 59, 123456),
        "instant": dt.datetime(2024, 2, 29, 23, 59, 59, 654321, tzinfo=dt.UTC),
        "doc": '{"a": [1, 2.5, "é"]}',
        "state": "paid",
        "tags": "x,z",
        "data": b"\x00\xff\x10",
        "note": "héllo ✓",
        "ratio": 1.5,
        "alarm": dt.time(12, 34, 56, 1),
        "born": dt.date(2024, 1, 1),
    }


def test_every_type_is_exact_in_the_snapshot_and_in_the_stream(
    mysql: Any, mysql_engine: Any, kafka: Any, kafka_conf: Any, names: dict[str, str]
) -> None:
    t = names["table"]
    top = 18446744073709551615  # the largest unsigned bigint
    with mysql_engine.begin() as c:
        c.execute(text("SET time_zone = '+00:00'"))
        c.execute(text(TYPES_DDL.format(t=t)))
        c.execute(text(TYPES_ROW.format(t=t, id=top)))
    pipeline = _pipeline(kafka, mysql, names)
    _ok(pipeline)
    with mysql_engine.begin() as c:
        c.execute(text("SET time_zone = '+00:00'"))
        c.execute(text(TYPES_ROW.format(t=t, id=top - 1)))
        c.execute(text(f"UPDATE {t} SET note = 'changed' WHERE id = {top}"))
    _ok(pipeline)
    got = [(i, v) for _p, i, v, _ver in changes(kafka_conf, names["topic"])]
    assert got == [
        (D(top), _expected(top)),  # the snapshot
        (D(top - 1), _expected(top - 1)),  # the binlog
        (D(top), {**_expected(top), "note": "changed"}),
    ]


def test_a_column_added_mid_stream_is_a_new_schema_and_truncate_tombstones_every_key(
    mysql: Any, mysql_engine: Any, kafka: Any, kafka_conf: Any, names: dict[str, str]
) -> None:
    t = names["table"]
    with mysql_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, v varchar(10) NOT NULL)"))
        c.execute(text(f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')"))
    pipeline = _pipeline(kafka, mysql, names)
    _ok(pipeline)
    # a running task (opened before the ALTER) meets row events with a column its schema lacks
    task = RdsSource(pipeline.sources[0], pipeline.connections["pg"], kafka=kafka)
    try:
        task.open(OffsetStore(kafka_conf).load(names["name"]))
        with mysql_engine.begin() as c:
            c.execute(text(f"INSERT INTO {t} VALUES (3, 'c')"))
        with mysql_engine.begin() as c:
            c.execute(text(f"ALTER TABLE {t} ADD COLUMN extra int NULL"))
        with mysql_engine.begin() as c:
            c.execute(text(f"INSERT INTO {t} VALUES (4, 'd', 40)"))
        seen = []
        with pytest.raises(SchemaChanged) as err:
            for batch in task.poll():
                seen.extend(batch.records)
    finally:
        task.close()
    assert seen == [({"id": 3}, {"id": 3, "v": "c"})]  # what came before the new shape, then the stop
    assert "added ['extra']" in str(err.value) and "restarts" in str(err.value) and "\n" not in str(err.value)
    # the restarted task (a new run here) reflects the table again: the new schema, nothing lost or twice
    _ok(pipeline)
    got = [(i, v) for _p, i, v, _ver in changes(kafka_conf, names["topic"])]
    assert got == [
        (1, {"id": 1, "v": "a"}),
        (2, {"id": 2, "v": "b"}),
        (3, {"id": 3, "v": "c", "extra": None}),
        (4, {"id": 4, "v": "d", "extra": 40}),
    ]

    with mysql_engine.begin() as c:
        c.execute(text(f"TRUNCATE TABLE {t}"))
    with mysql_engine.begin() as c:
        c.execute(text(f"INSERT INTO {t} VALUES (9, 'after', NULL)"))
    _ok(pipeline)
    after = changes(kafka_conf, names["topic"])[len(got) :]
    latest = _latest(after)
    assert latest[9] == {"id": 9, "v": "after", "extra": None}
    assert {k for k, v in latest.items() if v is None} == {1, 2, 3, 4}  # a tombstone for every key gone


def _store_position(kafka_conf: Any, name: str, topic: str, position: dict[str, Any]) -> None:
    store = OffsetStore(kafka_conf)
    producer = Producer(kafka_conf)
    producer.produce(OFFSETS_TOPIC, store.encode(name, name, 0, topic, position), name.encode())
    assert producer.flush(30) == 0


def test_a_purged_position_stops_in_one_line_or_takes_a_new_snapshot(
    mysql: Any, mysql_engine: Any, kafka: Any, kafka_conf: Any, names: dict[str, str]
) -> None:
    t, name = names["table"], names["name"]
    with mysql_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL)"))
        c.execute(text(f"INSERT INTO {t} VALUES (1, 1), (2, 2), (3, 3)"))
    _ok(_pipeline(kafka, mysql, names))
    position = OffsetStore(kafka_conf).load(name)
    # what a purge leaves behind: a stored file the server no longer lists (purging the shared server's binlog
    # would take other sessions' positions too), with changes made meanwhile that the binlog no longer holds
    _store_position(kafka_conf, name, names["topic"], {**position, "file": "mariadb-bin.000000", "pos": 4})
    with mysql_engine.begin() as c:
        c.execute(text(f"DELETE FROM {t} WHERE id = 2"))
        c.execute(text(f"UPDATE {t} SET v = 30 WHERE id = 3"))

    (s,) = run_once(_pipeline(kafka, mysql, names)).values()
    assert s.state == "failed" and "\n" not in s.error
    for part in ("mariadb-bin.000000", "purged", "binlog_purged: snapshot", "threes offsets reset"):
        assert part in s.error, f"{part!r} missing from: {s.error}"
    assert OffsetStore(kafka_conf).load(name)["file"] == "mariadb-bin.000000"  # nothing skipped silently

    before = len(changes(kafka_conf, names["topic"]))
    _ok(_pipeline(kafka, mysql, names, binlog_purged="snapshot"))
    latest = _latest(changes(kafka_conf, names["topic"])[before:])
    assert latest == {1: {"id": 1, "v": 1}, 2: None, 3: {"id": 3, "v": 30}}  # the new snapshot, 2 tombstoned
    assert OffsetStore(kafka_conf).load(name)["file"] != "mariadb-bin.000000"


def test_a_value_avro_cannot_carry_stops_in_one_line_or_is_a_dead_letter(
    mysql: Any, mysql_engine: Any, kafka: Any, kafka_conf: Any, names: dict[str, str]
) -> None:
    """A ``TIME`` of 30 hours (MySQL's range is ±838 h; Avro's ``time-micros`` is a time of day)."""
    t, name, topic = names["table"], names["name"], names["topic"]
    with mysql_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, v varchar(10) NOT NULL, alarm time)"))
        c.execute(text(f"INSERT INTO {t} VALUES (1, 'snapshot', '08:00:00')"))
    _ok(_pipeline(kafka, mysql, names))
    snapshot_position = OffsetStore(kafka_conf).load(name)
    with mysql_engine.begin() as c:  # one transaction: the bad value, then a good row
        c.execute(text(f"INSERT INTO {t} VALUES (2, 'bad', '30:00:00')"))
        c.execute(text(f"INSERT INTO {t} VALUES (3, 'good', '09:00:00')"))

    (s,) = run_once(_pipeline(kafka, mysql, names)).values()
    assert s.state == "failed" and not s.restartable and "\n" not in s.error
    for part in (name, "{'id': 2}", 'column "alarm"', "errors.tolerance: all"):
        assert part in s.error, f"{part!r} missing from: {s.error}"
    assert OffsetStore(kafka_conf).load(name) == snapshot_position

    _ok(_pipeline(kafka, mysql, names, errors={"tolerance": "all"}, exactly_once=True))
    got = changes(kafka_conf, topic, isolation="read_committed")
    assert [(i, v and v["v"]) for _p, i, v, _ver in got] == [(1, "snapshot"), (3, "good")]
    ((key, _value, headers),) = dead_letters(kafka_conf, f"{topic}.dlq")
    assert key == {"id": 2} and headers["dlq.source.column"] == "alarm"
    assert json.loads(headers["dlq.source.position"])["mode"] == "cdc"


def test_a_user_without_replication_privileges_is_refused_in_one_line(
    mysql: Any, mysql_engine: Any, kafka: Any, names: dict[str, str], unique: str
) -> None:
    from sqlalchemy.engine import make_url

    from threes.check import run_checks

    t, user = names["table"], f"norepl_{unique}"[:32]
    with mysql_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY)"))
        c.execute(text(f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw-{unique}'"))
        c.execute(text(f"GRANT SELECT ON threes.* TO '{user}'@'%'"))
    try:
        url = make_url(mysql.url).set(username=user).render_as_string(hide_password=False)
        weak = RdsConnection(type="rds", url=url, password=f"pw-{unique}")
        pipeline = _pipeline(kafka, weak, names)
        results = [r for r in run_checks(pipeline) if r.system == "rds"]
        assert results and not any(r.ok for r in results)
        assert "REPLICATION SLAVE" in results[0].detail and "REPLICATION CLIENT" in results[0].detail
        assert f"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO '{user}'" in results[0].detail
        task = RdsSource(pipeline.sources[0], pipeline.connections["pg"], kafka=kafka)
        try:
            with pytest.raises(SetupError) as err:
                task.open(None)
        finally:
            task.close()
        assert "REPLICATION SLAVE" in str(err.value) and "\n" not in str(err.value)
        ok = [r for r in run_checks(_pipeline(kafka, mysql, names)) if r.system == "rds"]
        assert [r.ok for r in ok] == [True] and "binlog ready" in ok[0].detail
    finally:
        with mysql_engine.begin() as c:
            c.execute(text(f"DROP USER IF EXISTS '{user}'@'%'"))


def test_an_interrupted_snapshot_resumes_after_its_last_key_and_streams_from_its_start(
    mysql: Any, mysql_engine: Any, kafka: Any, kafka_conf: Any, names: dict[str, str]
) -> None:
    """What a crash during the copy leaves: the first snapshot's binlog position and the last key stored."""
    t, name = names["table"], names["name"]
    with mysql_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL)"))
        c.execute(text(f"INSERT INTO {t} VALUES " + ",".join(f"({i}, {i})" for i in range(1, 11))))
    with mysql_engine.connect() as c:  # where a snapshot of the ten rows would have started the stream
        log_file, pos = c.exec_driver_sql("SHOW MASTER STATUS").first()[:2]
    interrupted = {"mode": "cdc", "file": log_file, "pos": int(pos), "gtid": None, "snapshot": {"after": [5]}}
    _store_position(kafka_conf, name, names["topic"], interrupted)
    with mysql_engine.begin() as c:  # after the first snapshot's position: the stream replays it
        c.execute(text(f"UPDATE {t} SET v = 20 WHERE id = 2"))
        c.execute(text(f"DELETE FROM {t} WHERE id = 7"))
    _ok(_pipeline(kafka, mysql, names))
    got = changes(kafka_conf, names["topic"])
    assert [(i, v and v["v"]) for _p, i, v, _ver in got] == [
        (6, 6),
        (8, 8),
        (9, 9),
        (10, 10),  # the copy, after key 5, at a fresh snapshot
        (2, 20),
        (7, None),  # the binlog from the first snapshot's position
    ]
    assert OffsetStore(kafka_conf).load(name)["snapshot"] is None


def test_a_position_the_server_cannot_send_is_detected_while_streaming(
    mysql: Any, mysql_engine: Any, kafka: Any, kafka_conf: Any, names: dict[str, str]
) -> None:
    """The file is listed but the server refuses the offset (error 1236, as for a purge seen while reading)."""
    t, name = names["table"], names["name"]
    with mysql_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, v int NOT NULL)"))
        c.execute(text(f"INSERT INTO {t} VALUES (1, 1), (2, 2)"))
    _ok(_pipeline(kafka, mysql, names))
    position = OffsetStore(kafka_conf).load(name)
    _store_position(kafka_conf, name, names["topic"], {**position, "pos": 4_000_000_000})
    with mysql_engine.begin() as c:
        c.execute(text(f"DELETE FROM {t} WHERE id = 1"))

    (s,) = run_once(_pipeline(kafka, mysql, names)).values()
    assert s.state == "failed" and "\n" not in s.error
    assert "cannot send" in s.error and "binlog_purged: snapshot" in s.error, s.error

    before = len(changes(kafka_conf, names["topic"]))
    _ok(_pipeline(kafka, mysql, names, binlog_purged="snapshot"))
    latest = _latest(changes(kafka_conf, names["topic"])[before:])
    assert latest == {1: None, 2: {"id": 2, "v": 2}}  # a new snapshot, the key gone tombstoned
