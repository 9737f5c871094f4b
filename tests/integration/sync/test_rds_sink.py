"""RdsSink against the real PostgreSQL and MariaDB (MySQL dialect), and SQLite: the same contract."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import BigInteger, Column, Integer, MetaData, Table, Text, select, text

from connectors.rds.config import RdsSinkConfig
from connectors.rds.connection import RdsConnection
from connectors.rds.sink import RdsSink
from kernel.exceptions import SinkBackpressureError
from sync_service.isolation import write_isolating
from threes.testing.sink import SinkContract, batch, record


def rds_state(sink: RdsSink) -> dict[str, tuple[int, dict[str, Any]]]:
    table = Table(sink.config.table, MetaData(), autoload_with=sink.engine)
    with sink.engine.connect() as conn:
        rows = conn.execute(select(table)).mappings().all()
    return {str(r["id"]): (r["_version"], dict(r)) for r in rows}


def drop(engine: Any, name: str) -> None:
    Table(name, MetaData()).drop(engine, checkfirst=True)
    Table(f"{name}__deleted", MetaData()).drop(engine, checkfirst=True)  # the sink's tombstone table


def make_config(table: str, **extra: Any) -> RdsSinkConfig:
    return RdsSinkConfig(
        name=f"rds-{table}",
        type="rds_sink",
        connection="db",
        topics=["updates.items"],
        table=table,
        key=["id"],
        create_table=True,
        **extra,
    )


def created_columns(sink: RdsSink) -> dict[str, Column]:
    """The columns of the table the sink created, after checking what every dialect shares.

    ``id`` is the primary key and a BIGINT, ``qty`` an INTEGER, ``name`` TEXT, ``_version`` NOT NULL.
    """
    cols = {c.name: c for c in Table(sink.config.table, MetaData(), autoload_with=sink.engine).c}
    assert [c.name for c in cols.values() if c.primary_key] == ["id"]
    assert isinstance(cols["id"].type, BigInteger) and isinstance(cols["qty"].type, Integer)
    assert isinstance(cols["name"].type, Text) and not cols["_version"].nullable
    return cols


def check_lock_held_is_backpressure(
    db: RdsConnection, engine: Any, table: str, lock_timeout_s: float, lock: str
) -> None:
    """A row or table lock held past ``lock_timeout_s`` is backpressure (retried), and the write applies after it.

    ``lock`` is the SQL that takes the lock on ``table``'s row 1 (or the whole table), run in an open transaction.
    """
    s = RdsSink(make_config(table, lock_timeout_s=lock_timeout_s), db)
    s.open()
    try:
        s.write(batch([record(1, 1, 0)]))
        with engine.connect() as locker:
            locker.execute(text(lock))
            with pytest.raises(SinkBackpressureError):
                s.write(batch([record(1, 2, 1)]))
            locker.rollback()
        s.write(batch([record(1, 2, 1)]))
        assert rds_state(s)["1"][0] == 2
    finally:
        drop(s.engine, table)
        s.close()


class RdsSinkContract(SinkContract):
    """The sink contract on a database server: a subclass gives its connection as the ``db`` fixture."""

    @pytest.fixture
    def db(self) -> RdsConnection:
        raise NotImplementedError

    @pytest.fixture
    def sink(self, db: RdsConnection, unique: str) -> Iterator[RdsSink]:
        s = RdsSink(make_config(f"items_{unique}"), db)
        s.open()
        yield s
        drop(s.engine, f"items_{unique}")
        s.close()

    def state(self, sink: RdsSink) -> dict[str, tuple[int, dict[str, Any]]]:
        return rds_state(sink)


class TestRdsSinkPostgres(RdsSinkContract):
    @pytest.fixture
    def db(self, pg: RdsConnection) -> RdsConnection:
        return pg

    @pytest.fixture
    def bad_sink(self, pg: RdsConnection, unique: str) -> RdsSink:
        bad = pg.model_copy(update={"password": None, "url": pg.url.replace("threes@", "threes:wrong@")})
        return RdsSink(make_config(f"items_{unique}"), RdsConnection(type="rds", url=bad.url, connect_timeout_s=3))

    def test_created_table_types(self, sink: RdsSink) -> None:
        sink.write(batch([record(1, 1, 0)]))
        cols = created_columns(sink)
        assert cols["updated_at"].type.timezone is True

    def test_refused_value_is_a_record_failure_and_the_rest_applies(self, sink: RdsSink) -> None:
        recs = [record(k, 1, k) for k in range(20)]
        recs[7].value["name"] = "bad\x00name"  # PostgreSQL text cannot hold NUL
        failures = write_isolating(sink.write, batch(recs))  # the sink runtime bisects the refused write
        assert [f.record.offset for f in failures] == [7]
        assert sorted(int(k) for k in rds_state(sink)) == [k for k in range(20) if k != 7]

    def test_lock_held_is_backpressure(self, pg_engine: Any, pg: RdsConnection, unique: str) -> None:
        quoted = pg_engine.dialect.identifier_preparer.quote(f"items_{unique}")
        lock = f"LOCK TABLE {quoted} IN ACCESS EXCLUSIVE MODE"
        check_lock_held_is_backpressure(pg, pg_engine, f"items_{unique}", 0.5, lock)

    def test_existing_table_without_unique_key_is_refused(self, pg_engine: Any, pg: RdsConnection, unique: str) -> None:
        from kernel.exceptions import FatalError

        name = f"nokey_{unique}"
        Table(name, MetaData(), Column("id", BigInteger), Column("_version", BigInteger)).create(pg_engine)
        try:
            s = RdsSink(make_config(name), pg)
            with pytest.raises(FatalError, match="no primary key or unique index"):
                s.open()
            s.close()
        finally:
            drop(pg_engine, name)


class TestRdsSinkMysql(RdsSinkContract):
    """The contract on MariaDB: ``INSERT ... ON DUPLICATE KEY UPDATE`` applied only when the version is newer."""

    @pytest.fixture
    def db(self, mysql: RdsConnection) -> RdsConnection:
        return mysql

    @pytest.fixture
    def bad_sink(self, mysql: RdsConnection, unique: str) -> RdsSink:
        bad = RdsConnection(type="rds", url=mysql.url, password="wrong-secret", connect_timeout_s=3)
        return RdsSink(make_config(f"items_{unique}"), bad)

    def test_created_table_types(self, sink: RdsSink) -> None:
        from datetime import UTC, datetime

        from sqlalchemy.dialects import mysql

        rec = record(1, 1, 0)
        rec.value["updated_at"] = datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC)
        assert sink.write(batch([rec])) == []
        cols = created_columns(sink)
        # an instant is a DATETIME(6) holding UTC: microseconds kept (MySQL's DATETIME keeps whole seconds)
        assert isinstance(cols["updated_at"].type, mysql.DATETIME) and cols["updated_at"].type.fsp == 6
        with sink.engine.connect() as conn:
            stored = conn.execute(text(f"SELECT updated_at FROM `{sink.config.table}`")).scalar_one()
        assert stored == datetime(2024, 2, 29, 23, 59, 59, 123456)

    def test_upsert_is_on_duplicate_key_update(self, sink: RdsSink) -> None:
        from sqlalchemy.dialects import mysql

        from connectors.rds.sink_sql import upsert_statement

        sink.write(batch([record(1, 1, 0)]))
        assert sink.table is not None
        statement = upsert_statement(sink.table, sink.config.key, sink.config.version_column, sink.engine.dialect.name)
        sql = str(statement.compile(dialect=mysql.dialect())).lower()
        # every column takes the new value only when the new version is greater; the version column comes last
        assert "on duplicate key update" in sql
        assert f"name = if(values(_version) > {sink.config.table}._version, values(name), " in sql
        assert sql.endswith("_version = greatest(values(_version), " + f"{sink.config.table}._version)")

    def test_refused_value_is_a_record_failure_and_the_rest_applies(self, sink: RdsSink) -> None:
        recs = [record(k, 1, k) for k in range(20)]
        recs[7].value["qty"] = 2**40  # strict mode: out of range for INT, an error (never clipped)
        failures = write_isolating(sink.write, batch(recs))  # the sink runtime bisects the refused write
        assert [f.record.offset for f in failures] == [7]
        assert type(failures[0].error).__name__ == "DataError"
        assert sorted(int(k) for k in rds_state(sink)) == [k for k in range(20) if k != 7]

    def test_lock_held_is_backpressure(self, mysql_engine: Any, mysql: RdsConnection, unique: str) -> None:
        lock = f"SELECT * FROM `items_{unique}` WHERE id = 1 FOR UPDATE"
        check_lock_held_is_backpressure(mysql, mysql_engine, f"items_{unique}", 1, lock)


class TestRdsSinkSqlite(SinkContract):
    @pytest.fixture
    def sink(self, tmp_path: Path) -> Iterator[RdsSink]:
        s = RdsSink(make_config("items"), RdsConnection(type="rds", url=f"sqlite:///{tmp_path / 'db.sqlite'}"))
        s.open()
        yield s
        s.close()

    @pytest.fixture
    def bad_sink(self, tmp_path: Path) -> RdsSink:
        return RdsSink(
            make_config("items"), RdsConnection(type="rds", url=f"sqlite:///{tmp_path / 'missing-dir' / 'db.sqlite'}")
        )

    def state(self, sink: RdsSink) -> dict[str, tuple[int, dict[str, Any]]]:
        return rds_state(sink)


def test_sync_service_into_mysql_dead_letters_a_refused_row(
    kafka: Any, kafka_conf: dict[str, Any], mysql: RdsConnection, mysql_engine: Any, unique: str
) -> None:
    """Through the sync service: upserts, newer versions, a tombstone, and one row MariaDB refuses -> the DLQ."""
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

    topic, dlq, table = f"updates.my.{unique}", f"dlq.{unique}", f"my_{unique}"
    create_topic(kafka_conf, topic, 2)
    producer = UpdateProducer(kafka, topic)
    refused = 500  # a key of its own: its only update is refused
    for key in range(200):
        producer.send(key, 1)
    producer.send(refused, 1, {**item(refused, 1), "qty": 2**40})  # out of range for INT in strict mode
    for key in range(0, 200, 10):
        producer.send(key, 3)
    producer.send(5, 4, None)  # tombstone
    producer.send(6, 0)  # older than the row's version 1: ignored
    producer.flush()
    p = pipeline(
        kafka,
        {"my": {"type": "rds", "url": mysql.url, "password": mysql.password.get_secret_value()}},
        [
            {
                "name": f"my-{unique}",
                "dead_letter_topic": dlq,
                "batch": {"max_records": 100, "max_age_ms": 200},
                "sinks": [
                    {
                        "name": "db",
                        "type": "rds_sink",
                        "connection": "my",
                        "topics": [topic],
                        "table": table,
                        "key": ["id"],
                        "create_table": True,
                    }
                ],
            }
        ],
    )
    service = SyncService(p.kafka, p.sync[0], dict(p.connections))
    thread, stop, errors = run_in_thread(service)
    try:
        group = p.sync[0].consumer_group()
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0 or errors, 120, "lag back to 0")
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors

    (letter_msg,) = read_topic(kafka_conf, dlq, 1)
    letter = DeadLetter.from_headers(letter_msg.headers())
    partition, offset = producer.delivered[refused]
    assert (letter.topic, letter.partition, letter.offset) == (topic, partition, offset)
    assert letter.stage == "write" and letter.component.endswith("/db") and letter.error_class == "DataError"
    assert "Out of range value for column 'qty'" in letter.message and "[SQL:" not in letter.message

    t = Table(table, MetaData(), autoload_with=mysql_engine)
    with mysql_engine.connect() as conn:
        rows = {r.id: r for r in conn.execute(select(t))}
    assert sorted(rows) == [k for k in range(200) if k != 5]
    for key, row in rows.items():
        want = 3 if key % 10 == 0 else 1
        assert (row._version, row.name, row.qty) == (want, f"item-{key}-v{want}", item(key, want)["qty"])
    t.drop(mysql_engine)
