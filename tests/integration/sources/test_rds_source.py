"""RdsSource against real PostgreSQL and Kafka (plus SQLite for quick local use).

Tests taking the ``rds`` fixture run on PostgreSQL and on MariaDB (MySQL
dialect); the MySQL-only ones are in ``test_rds_source_mysql.py``.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    Numeric,
    Table,
    Text,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.dialects import mysql

from connectors.rds.connection import RdsConnection, sql_engine
from connectors.runtime.offsets import OffsetStore
from kernel.exceptions import ConfigError
from kernel.kafka.topics import ensure_compacted_topic
from tests.conftest import ROOT
from tests.integration.sources.rds import RdsSourceContract, dead_letters, late_commit, source_pipeline
from threes.testing.source import count_records, run_once, topic_state

UTC = dt.UTC


def _pipeline_yaml(
    path: Path, kafka: Any, conn: RdsConnection, *, name: str, topic: str, table: str, extra: str = ""
) -> Path:
    """Write the YAML pipeline of one ``incrementing`` source on ``table`` to ``path``; returns ``path``.

    The password is ``${env:THREES_PGPASS}``: the CLI run needs ``THREES_PGPASS`` in its environment.
    ``extra`` holds more source keys, each a line indented by four spaces.
    """
    path.write_text(
        f"kafka:\n  bootstrap_servers: {kafka.bootstrap_servers}\n"
        f"connections:\n  pg:\n    type: rds\n    url: {conn.url}\n    password: ${{env:THREES_PGPASS}}\n"
        f"sources:\n  - name: {name}\n    type: rds_source\n    connection: pg\n    topic: {topic}\n"
        f"    table: {table}\n    mode: incrementing\n    incrementing_column: id\n{extra}"
    )
    return path


def _filled_table(engine: Any, table: str, first: int, last: int, v: str = "'v'") -> None:
    """PostgreSQL: create ``table (id integer PRIMARY KEY, v text)`` with a row per id in ``first..last``.

    ``v`` is the SQL of the ``v`` column, over the id ``g`` (``'v' || g``).
    """
    with engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id integer PRIMARY KEY, v text)"))
        c.execute(text(f"INSERT INTO {table} SELECT g, {v} FROM generate_series({int(first)}, {int(last)}) g"))


class TestRdsSourceContract(RdsSourceContract):
    """The source contract on a PostgreSQL table in ``timestamp`` mode."""

    connection_fixture = "pg"
    engine_fixture = "pg_engine"
    create_sql = (
        "CREATE TABLE {table} (id integer PRIMARY KEY, name text NOT NULL, amount numeric(12,2), "
        "born date, doc jsonb, updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )
    upsert_sql = (
        "INSERT INTO {table} (id, name, amount, born, doc) "
        "VALUES (:id, :name, :amount, :born, CAST(:doc AS jsonb)) ON CONFLICT (id) DO UPDATE SET "
        "name = excluded.name, amount = excluded.amount, born = excluded.born, doc = excluded.doc, "
        "updated_at = clock_timestamp()"
    )

    def doc_text(self, doc: Any) -> str:
        """psycopg decodes ``jsonb``; the source writes it as compact JSON text."""
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


# -- modes ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["bulk", "incrementing", "timestamp+incrementing", "query"])
def test_modes_copy_the_table(
    mode: str, rds: tuple[RdsConnection, Any], kafka: Any, kafka_conf: Any, unique: str, tmp_path: Any
) -> None:
    conn, engine = rds
    table = f"modes_{unique}"
    # the same table on both dialects: BIGSERIAL / BIGINT AUTO_INCREMENT, timestamptz / TIMESTAMP(6)
    tbl = Table(
        table,
        MetaData(),
        Column("id", BigInteger, primary_key=True, autoincrement=True),
        Column("name", Text),
        Column(
            "updated_at",
            DateTime(timezone=True).with_variant(mysql.TIMESTAMP(fsp=6), "mysql", "mariadb"),
            nullable=False,
            server_default=text("CURRENT_TIMESTAMP(6)") if engine.dialect.name == "mysql" else func.clock_timestamp(),
        ),
    )
    tbl.create(engine)
    with engine.begin() as c:
        c.execute(tbl.insert(), [{"name": f"r{i}"} for i in range(1, 26)])
    # reconciliation off: it would re-send rows the mode missed and hide a broken mode
    source: dict[str, Any] = {"name": f"m-{unique}", "topic": f"state.{unique}", "mode": mode, "batch_records": 10,
                              "reconcile_interval_s": None}
    if mode == "query":
        schema = {
            "type": "record",
            "name": "q",
            "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": ["null", "string"]}],
        }
        (tmp_path / "q.avsc").write_text(json.dumps(schema))
        source.update(
            query=f"SELECT id, upper(name) AS name FROM {table} WHERE MOD(id, 5) <> 0",
            key=["id"],
            value_schema=str(tmp_path / "q.avsc"),
        )
    else:
        source.update(table=table, incrementing_column="id", timestamp_column="updated_at")
        if mode == "bulk":
            source.pop("incrementing_column")
            source.pop("timestamp_column")
        elif mode == "incrementing":
            source.pop("timestamp_column")
    pipeline = source_pipeline(kafka, conn, **source)
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert s.tombstones == 0
    state = topic_state(kafka_conf, f"state.{unique}")
    if mode == "query":
        assert state == {(i,): {"id": i, "name": f"R{i}"} for i in range(1, 26) if i % 5}
    else:
        assert sorted(state) == [(i,) for i in range(1, 26)]
        assert all(v["name"] == f"r{k[0]}" for k, v in state.items())

    # more rows and one update: the mode alone brings what it promises, and only that
    with engine.begin() as c:
        c.execute(tbl.insert(), [{"name": f"r{i}"} for i in range(26, 31)])
        values: dict[str, Any] = {"name": "changed"}
        if mode != "bulk":
            values["updated_at"] = func.now() if engine.dialect.name != "postgresql" else func.clock_timestamp()
        c.execute(tbl.update().where(tbl.c.id == 2).values(**values))
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    state = topic_state(kafka_conf, f"state.{unique}")
    ids = [i for i in range(1, 31) if mode != "query" or i % 5]
    assert sorted(state) == [(i,) for i in ids]
    # incrementing sees new ids only; timestamp+incrementing new and updated rows; bulk and query re-read all
    sent = {"incrementing": 5, "timestamp+incrementing": 6, "bulk": 30, "query": len(ids)}[mode]
    assert (s.produced, s.tombstones) == (sent, 0)
    if mode == "incrementing":
        assert state[(2,)]["name"] == "r2"
    else:
        assert state[(2,)]["name"] == ("CHANGED" if mode == "query" else "changed")

    # a delete is reconciliation's job (no change data capture): on, it tombstones the row
    with engine.begin() as c:
        c.execute(tbl.delete().where(tbl.c.id == 3))
    (s,) = run_once(source_pipeline(kafka, conn, **{**source, "reconcile_interval_s": 0.001})).values()
    assert s.state == "caught_up", s.error
    state = topic_state(kafka_conf, f"state.{unique}")
    assert sorted(state) == [(i,) for i in ids if i != 3]
    assert s.tombstones == 1


def test_tasks_split_the_table(pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str) -> None:
    table = f"split_{unique}"
    name = f"split-{unique}"
    _filled_table(pg_engine, table, -20, 40, "'v' || g")
    pipeline = source_pipeline(
        kafka,
        pg,
        name=name,
        topic=f"state.{unique}",
        table=table,
        mode="incrementing",
        incrementing_column="id",
        tasks=3,
        batch_records=7,
    )
    stats = run_once(pipeline)
    assert sorted(stats) == [f"{name}#0", f"{name}#1", f"{name}#2"]
    assert all(s.state == "caught_up" for s in stats.values()), {k: s.error for k, s in stats.items()}
    # every task read its share (task 0's reconciliation may re-emit rows of the others still in flight)
    assert all(s.rows_read > 0 for s in stats.values())
    assert sorted(topic_state(kafka_conf, f"state.{unique}")) == [(i,) for i in range(-20, 41)]
    with pg_engine.begin() as c:
        c.execute(text(f"DELETE FROM {table} WHERE id IN (-20, 0, 7)"))
        c.execute(text(f"INSERT INTO {table} VALUES (41, 'v41')"))
    stats = run_once(pipeline)
    assert sum(s.tombstones for s in stats.values()) == 3
    state = topic_state(kafka_conf, f"state.{unique}")
    assert sorted(state) == [(i,) for i in range(-20, 42) if i not in (-20, 0, 7)]
    stored = OffsetStore(kafka_conf).load_all()
    assert {f"{name}#0", f"{name}#1", f"{name}#2"} <= set(stored)


def test_tasks_need_an_integer_key(pg_engine: Any, pg: RdsConnection, kafka: Any, unique: str) -> None:
    table = f"splitk_{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (code text PRIMARY KEY)"))
    stats = run_once(source_pipeline(kafka, pg, name=f"sk-{unique}", topic=f"state.{unique}", table=table, tasks=2))
    assert all(s.state == "failed" and "integer key" in s.error for s in stats.values())


# -- commit-safe watermark ---------------------------------------------------------------------------------


def test_long_transaction_loses_no_row(
    pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    table = f"late_{unique}"
    with pg_engine.begin() as c:
        # DEFAULT now(): the transaction's *start* time, the usual way updated_at is written
        c.execute(
            text(
                f"CREATE TABLE {table} (id integer PRIMARY KEY, v text, updated_at timestamptz NOT NULL DEFAULT now())"
            )
        )
    pipeline = source_pipeline(
        kafka,
        pg,
        name=f"late-{unique}",
        topic=f"state.{unique}",
        table=table,
        mode="timestamp",
        timestamp_column="updated_at",
        commit_delay_s=0,
        reconcile_interval_s=None,
    )

    seen = late_commit(pg_engine, table, pipeline)

    # the naive poller moved its watermark past T0 and never sees row 1 ...
    assert seen.naive_seen == [2]
    assert 1 not in seen.naive_more
    # ... this source held its watermark below the open transaction and has both
    assert sorted(topic_state(kafka_conf, f"state.{unique}")) == [(1,), (2,)]


# -- identifiers ---------------------------------------------------------------------------------------------


def test_identifier_injection_is_quoted(
    rds: tuple[RdsConnection, Any], kafka: Any, kafka_conf: Any, unique: str
) -> None:
    pg, pg_engine = rds  # PostgreSQL quotes with ", MySQL with `: both must hold
    victim = f"victim_{unique}"
    evil = f'evil"; DROP TABLE {victim}; --{unique}'
    md = MetaData()
    Table(victim, md, Column("id", Integer, primary_key=True))
    Table(
        evil,
        md,
        Column('id"; DROP TABLE x; --', Integer, primary_key=True),
        Column("unit price", Numeric(8, 2)),
        Column("select", Text),
        Column("c;--", Text),
    )
    md.create_all(pg_engine)
    with pg_engine.begin() as c:
        c.execute(
            md.tables[evil].insert(),
            [
                {'id"; DROP TABLE x; --': i, "unit price": decimal.Decimal("1.25") * i, "select": f"s{i}", "c;--": "x"}
                for i in range(1, 4)
            ],
        )
    pipeline = source_pipeline(
        kafka,
        pg,
        name=f"evil-{unique}",
        topic=f"state.{unique}",
        table=evil,
        mode="incrementing",
        incrementing_column='id"; DROP TABLE x; --',
    )
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert inspect(pg_engine).has_table(victim), "the victim table must survive"
    state = topic_state(kafka_conf, f"state.{unique}")
    assert state[(2,)] == {
        "id___DROP_TABLE_x____": 2,
        "unit_price": decimal.Decimal("2.50"),
        "select": "s2",
        "c___": "x",
    }


def test_missing_table_is_a_config_error(pg: RdsConnection, kafka: Any, unique: str) -> None:
    pipeline = source_pipeline(kafka, pg, name=f"nt-{unique}", topic=f"state.{unique}", table=f"no_such_{unique}")
    (s,) = run_once(pipeline).values()
    assert s.state == "failed"
    assert f"no_such_{unique}" in s.error and "does not exist" in s.error


# -- encoding errors ---------------------------------------------------------------------------------------------


def test_unencodable_value_stops_in_one_line_or_is_a_dead_letter(
    pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    """Issue #49: a row Avro cannot carry (a 2-D array in an ``int[]`` column) stops the source without advancing
    (``errors.tolerance: none``, the default), or is a dead letter and the source goes on (``all``)."""
    table = f"enc_{unique}"
    name = f"enc-{unique}"
    topic = f"state.{unique}"
    with pg_engine.begin() as c:
        # PostgreSQL does not enforce an array column's dimensions: int[] holds a 2-D array too
        c.execute(text(f"CREATE TABLE {table} (id integer PRIMARY KEY, amount numeric, dims int[])"))
        c.execute(text(f"INSERT INTO {table} VALUES (1, 1.5, '{{1}}'), (2, 1.0000000001, '{{{{1,2}},{{3,4}}}}'), "
                       f"(3, 0.12345678901, '{{3}}')"))
    options: dict[str, Any] = {"name": name, "topic": topic, "table": table, "mode": "incrementing",
                               "incrementing_column": "id", "batch_records": 1}
    (s,) = run_once(source_pipeline(kafka, pg, **options)).values()
    assert s.state == "failed" and not s.restartable
    for part in (name, table, "{'id': 2}", 'column "dims"', "errors.tolerance: all", f"{topic}.dlq"):
        assert part in s.error, f"{part!r} missing from: {s.error}"
    assert "\n" not in s.error
    # the position stays before the bad row: id 1 acknowledged, nothing past it
    assert OffsetStore(kafka_conf).load(name) == {"mode": "incrementing", "after": [1]}
    assert sorted(topic_state(kafka_conf, topic)) == [(1,)]

    # errors.tolerance: all: the row is a dead letter, the position moves past it, the rows after it arrive
    tolerant = source_pipeline(kafka, pg, **options, errors={"tolerance": "all"})
    (s,) = run_once(tolerant).values()
    assert s.state == "caught_up", s.error
    assert s.dead_letters == 1
    assert OffsetStore(kafka_conf).load(name) == {"mode": "incrementing", "after": [3]}
    assert topic_state(kafka_conf, topic) == {
        (1,): {"id": 1, "amount": "1.5", "dims": [1]},
        (3,): {"id": 3, "amount": "0.12345678901", "dims": [3]},  # every digit (decimal_handling: precise)
    }
    ((key, value, headers),) = dead_letters(kafka_conf, f"{topic}.dlq")
    assert key == {"id": 2}
    assert value == {"id": 2, "amount": "1.0000000001", "dims": [[1, 2], [3, 4]]}
    assert (headers["dlq.topic"], headers["dlq.stage"], headers["dlq.component"]) == (topic, "encode", name)
    assert (headers["dlq.source.table"], headers["dlq.source.column"]) == (table, "dims")
    assert json.loads(headers["dlq.source.key"]) == {"id": 2}
    assert json.loads(headers["dlq.source.position"]) == {"mode": "incrementing", "after": [2]}

    # a later bad row is a dead letter too; the rows after it arrive
    with pg_engine.begin() as c:
        c.execute(text(f"INSERT INTO {table} VALUES (4, 4, '{{{{4}}}}'), (5, 5, '{{5}}')"))
    (s,) = run_once(tolerant).values()
    assert s.state == "caught_up", s.error
    assert sorted(topic_state(kafka_conf, topic)) == [(1,), (3,), (5,)]
    assert [v["id"] for _k, v, _h in dead_letters(kafka_conf, f"{topic}.dlq")] == [2, 4]


@pytest.mark.parametrize("reader", ["adbc", "psycopg"])
def test_nan_and_infinity_in_numeric_never_stop_the_source(
    pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str, reader: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Issue #40 item 7: a NaN used to fail the task on its row, restarted forever; later commits never arrived."""
    table = f"nan_{reader}_{unique}"
    extra = ", doc jsonb" if reader == "psycopg" else ""  # a jsonb column needs psycopg's rows (no ADBC)
    with pg_engine.begin() as c:
        # PostgreSQL allows NaN in any numeric, +/-Infinity only in an unbounded one
        c.execute(text(f"CREATE TABLE {table} (id integer PRIMARY KEY, amount numeric(10,2), plain numeric, "
                       f"must numeric(10,2) NOT NULL{extra})"))
        c.execute(text(f"INSERT INTO {table} (id, amount, plain, must) VALUES (1, 1.5, 1, 1), (2, 'NaN', 2, 2), "
                       "(3, 2.5, 'Infinity', 3), (4, 3.5, '-Infinity', 4), (5, 4.5, 5, 'NaN'), (6, 5.5, 6, 6)"))
    pipeline = source_pipeline(kafka, pg, name=f"nan-{unique}", topic=f"state.{unique}", table=table,
                               mode="incrementing", incrementing_column="id", batch_records=2)
    with caplog.at_level(logging.WARNING, logger="connectors.rds.source"):
        (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    d = decimal.Decimal
    doc = {"doc": None} if reader == "psycopg" else {}
    assert topic_state(kafka_conf, f"state.{unique}") == {
        # an unbounded numeric is its exact text (decimal_handling: precise): NaN and +/-Infinity as such
        (1,): {"id": 1, "amount": d("1.50"), "plain": "1", "must": d("1.00"), **doc},
        (2,): {"id": 2, "amount": None, "plain": "2", "must": d("2.00"), **doc},
        (3,): {"id": 3, "amount": d("2.50"), "plain": "Infinity", "must": d("3.00"), **doc},
        (4,): {"id": 4, "amount": d("3.50"), "plain": "-Infinity", "must": d("4.00"), **doc},
        # 5: NaN in a NOT NULL column, left out of the topic
        (6,): {"id": 6, "amount": d("5.50"), "plain": "6", "must": d("6.00"), **doc},
    }
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "connectors.rds.source"]
    for level, key, column, shown in [(logging.WARNING, 2, "amount", "NaN"), (logging.ERROR, 5, "must", "NaN")]:
        assert any(lv == level and table in m and f"{{'id': {key}}}" in m and f'column "{column}"' in m
                   and f"holds {shown}," in m for lv, m in logged), (key, logged)
    assert OffsetStore(kafka_conf).load(f"nan-{unique}") == {"mode": "incrementing", "after": [6]}
    # a later commit arrives; the fixed row 5 too once it is updated (incrementing: as a new id here)
    with pg_engine.begin() as c:
        c.execute(text(f"INSERT INTO {table} (id, amount, plain, must) VALUES (7, 'NaN', 7, 7)"))
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    state = topic_state(kafka_conf, f"state.{unique}")
    assert state[(7,)] == {"id": 7, "amount": None, "plain": "7", "must": d("7.00"), **doc}


# -- types --------------------------------------------------------------------------------------------------------


def test_types_round_trip(pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str) -> None:
    table = f"types_{unique}"
    u = uuid.uuid4()
    with pg_engine.begin() as c:
        c.execute(
            text(
                f"CREATE TABLE {table} (id bigint PRIMARY KEY, small smallint, big bigint, price numeric(20,6), "
                "ratio double precision, flag boolean, at timestamptz, local_at timestamp, day date, "
                "doc jsonb, raw bytea, uid uuid, tags text[], note varchar(10))"
            )
        )
        c.execute(
            text(
                f"INSERT INTO {table} VALUES (1, 7, 9007199254740993, 12345678901234.123456, 0.5, true, "
                "'2024-02-29 23:59:59.123456+02', '2024-02-29 23:59:59.5', '1999-12-31', "
                "'{\"a\": [1, 2], \"b\": null}', '\\xdeadbeef', :u, ARRAY['x', NULL], 'hi'), "
                "(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
            ),
            {"u": u},
        )
    pipeline = source_pipeline(kafka, pg, name=f"types-{unique}", topic=f"state.{unique}", table=table)
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    state = topic_state(kafka_conf, f"state.{unique}")
    assert state[(1,)] == {
        "id": 1,
        "small": 7,
        "big": 9007199254740993,
        "price": decimal.Decimal("12345678901234.123456"),
        "ratio": 0.5,
        "flag": True,
        "at": dt.datetime(2024, 2, 29, 21, 59, 59, 123456, tzinfo=UTC),
        "local_at": dt.datetime(2024, 2, 29, 23, 59, 59, 500000),
        "day": dt.date(1999, 12, 31),
        "doc": '{"a":[1,2],"b":null}',
        "raw": b"\xde\xad\xbe\xef",
        "uid": u,
        "tags": ["x", None],
        "note": "hi",
    }
    assert state[(2,)] == {"id": 2, **{k: None for k in state[(1,)] if k != "id"}}


# -- topics ------------------------------------------------------------------------------------------------------


def test_existing_non_compacted_topic_is_refused(
    pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"state.{unique}"
    admin = AdminClient(kafka_conf)
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "delete"})])[topic].result(30)
    table = f"nc_{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id integer PRIMARY KEY)"))
    (s,) = run_once(source_pipeline(kafka, pg, name=f"nc-{unique}", topic=topic, table=table)).values()
    assert s.state == "failed"
    assert "not compacted" in s.error and topic in s.error
    with pytest.raises(ConfigError):
        ensure_compacted_topic(kafka_conf, topic)


def test_topic_is_created_with_configured_spec(
    pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    from kernel.kafka.topics import end_offsets, topic_configs

    table = f"spec_{unique}"
    _filled_table(pg_engine, table, 1, 50)
    topic = f"state.{unique}"
    pipeline = source_pipeline(
        kafka,
        pg,
        name=f"spec-{unique}",
        topic=topic,
        table=table,
        topic_spec={"partitions": 3, "configs": {"min.cleanable.dirty.ratio": "0.2"}},
    )
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    configs = topic_configs(kafka_conf, topic)
    assert configs["cleanup.policy"] == "compact"
    assert configs["min.cleanable.dirty.ratio"] == "0.2"
    ends = end_offsets(kafka_conf, topic)
    assert len(ends) == 3 and sum(ends.values()) == 50 and all(v > 0 for v in ends.values())


def test_full_producer_queue_is_waited_out(
    pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    from connectors.runtime.standalone import SourceWorker, task_specs

    table = f"q_{unique}"
    _filled_table(pg_engine, table, 1, 400, "repeat('x', 100)")
    pipeline = source_pipeline(kafka, pg, name=f"q-{unique}", topic=f"state.{unique}", table=table, batch_records=500)
    # a local queue of 20 messages: the loop must wait for deliveries again and again, and drop nothing
    worker = SourceWorker(pipeline, producer_overrides={"queue_buffering_max_messages": 20})
    for spec in task_specs(pipeline.sources):
        worker.start(spec, once=True)
    import threading

    worker.wait(threading.Event())
    (s,) = worker.stats().values()
    assert s.state == "caught_up", s.error
    assert s.queue_full > 0
    assert s.acked == 400
    assert count_records(kafka_conf, f"state.{unique}") == 400


# -- SQLite, CLI ---------------------------------------------------------------------------------------------------


def test_sqlite_for_quick_local_use(tmp_path: Any, kafka: Any, kafka_conf: Any, unique: str) -> None:
    from threes.config import pipeline_from_dict

    db = tmp_path / "local.db"
    conn = RdsConnection(type="rds", url=f"sqlite:///{db}")
    engine = sql_engine(conn)
    with engine.begin() as c:
        c.execute(text("CREATE TABLE planes (tailnum TEXT PRIMARY KEY, year INTEGER, seats INTEGER)"))
        c.execute(text("INSERT INTO planes VALUES ('N10156', 2004, 55), ('N102UW', 1998, 182), ('N103US', 1999, 182)"))
    pipeline = pipeline_from_dict(
        {
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
            "connections": {"local": {"type": "rds", "url": f"sqlite:///{db}"}},
            "sources": [
                {
                    "name": f"planes-{unique}",
                    "type": "rds_source",
                    "connection": "local",
                    "topic": f"state.{unique}",
                    "table": "planes",
                }
            ],
        }
    )
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    with engine.begin() as c:
        c.execute(text("DELETE FROM planes WHERE tailnum = 'N102UW'"))
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert topic_state(kafka_conf, f"state.{unique}") == {
        ("N10156",): {"tailnum": "N10156", "year": 2004, "seats": 55},
        ("N103US",): {"tailnum": "N103US", "year": 1999, "seats": 182},
    }
    with engine.connect() as c:
        assert c.execute(select(text("count(*)")).select_from(text("planes"))).scalar_one() == 2
    engine.dispose()


def test_cli_once_offsets_list_and_reset(
    tmp_path: Any, pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    table = f"cli_{unique}"
    _filled_table(pg_engine, table, 1, 30, "'v' || g")
    name = f"cli-{unique}"
    cfg = _pipeline_yaml(tmp_path / "pipeline.yaml", kafka, pg, name=name, topic=f"state.{unique}", table=table)
    env = {"THREES_PGPASS": pg.password.get_secret_value(), "PATH": "/usr/bin:/bin"}
    threes = [sys.executable, "-m", "threes.cli"]
    done = subprocess.run(
        [*threes, "source", "run", str(cfg), "--once"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert f"{name}: caught_up rows_read=30 acked=30" in done.stdout
    listed = subprocess.run(
        [*threes, "offsets", "list", str(cfg), "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    (entry,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert entry["connector"] == name and entry["position"] == {"mode": "incrementing", "after": [30]}
    reset = subprocess.run(
        [*threes, "offsets", "reset", str(cfg), "--connector", name, "--yes"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reset.returncode == 0, reset.stderr
    assert OffsetStore(kafka_conf).load(name) is None
    again = subprocess.run(
        [*threes, "source", "run", str(cfg), "--once"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert again.returncode == 0, again.stderr
    assert count_records(kafka_conf, f"state.{unique}") == 60  # re-snapshot after the reset


def test_sigterm_flushes_and_stores_the_position(
    tmp_path: Any, pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    import signal
    import time

    table = f"term_{unique}"
    name = f"term-{unique}"
    _filled_table(pg_engine, table, 1, 500)
    cfg = _pipeline_yaml(
        tmp_path / "pipeline.yaml",
        kafka,
        pg,
        name=name,
        topic=f"state.{unique}",
        table=table,
        # no reconciliation: it could emit the new rows first (without moving the position), by design
        extra="    poll_interval_s: 0.2\n    reconcile_interval_s: null\n",
    )
    env = {"THREES_PGPASS": pg.password.get_secret_value(), "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "threes.cli", "--debug", "source", "run", str(cfg)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    store = OffsetStore(kafka_conf)
    try:
        deadline = time.monotonic() + 60
        while store.load(name) != {"mode": "incrementing", "after": [500]}:
            assert time.monotonic() < deadline and proc.poll() is None, "the source did not catch up"
            time.sleep(0.2)
        with pg_engine.begin() as c:
            c.execute(text(f"INSERT INTO {table} SELECT g, 'w' FROM generate_series(501, 520) g"))
        deadline = time.monotonic() + 30
        while count_records(kafka_conf, f"state.{unique}") < 520:
            assert time.monotonic() < deadline, "the new rows did not arrive"
            time.sleep(0.1)
        # SIGTERM right away, before the next periodic position write: stopping must write it
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert proc.returncode == 0, err[-2000:]
    assert f"{name}: stopped" in out
    assert store.load(name) == {"mode": "incrementing", "after": [520]}, out + err[-3000:]


def test_lost_database_connections_are_retried(
    pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    import threading
    import time

    from connectors.runtime.standalone import SourceWorker, task_specs

    table = f"lost_{unique}"
    _filled_table(pg_engine, table, 1, 100)
    pipeline = source_pipeline(
        kafka,
        pg,
        name=f"lost-{unique}",
        topic=f"state.{unique}",
        table=table,
        mode="incrementing",
        incrementing_column="id",
        poll_interval_s=0.2,
    )
    worker = SourceWorker(pipeline)
    (spec,) = task_specs(pipeline.sources)
    runner = worker.start(spec)
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 60
        while runner.stats.acked < 100:
            assert time.monotonic() < deadline, runner.stats
            time.sleep(0.1)
        # the database drops every connection of the source (a failover, a restart)
        for _ in range(3):
            with pg_engine.begin() as c:
                c.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                        "current_database() AND pid <> pg_backend_pid() AND application_name = ''"
                        " AND backend_type = 'client backend'"
                    )
                )
                c.execute(
                    text(f"INSERT INTO {table} SELECT g, 'w' FROM generate_series(CAST(:a AS int), CAST(:b AS int)) g"),
                    {"a": 101 + _ * 10, "b": 110 + _ * 10},
                )
            time.sleep(0.5)
        deadline = time.monotonic() + 60
        while runner.stats.acked < 130:
            assert runner.stats.state != "failed", runner.stats.error
            assert time.monotonic() < deadline, runner.stats
            time.sleep(0.1)
        assert runner.stats.state in ("running", "caught_up")
    finally:
        stop.set()
        worker.stop()
    assert sorted(topic_state(kafka_conf, f"state.{unique}")) == [(i,) for i in range(1, 131)]


@pytest.mark.parametrize(("handling", "price", "loose"), [
    ("precise", decimal.Decimal("1234.500"), "0.12345678901"),
    ("string", "1234.500", "0.12345678901"),
    ("double", 1234.5, 0.12345678901),
])
def test_decimal_handling(
    pg_engine: Any, pg: RdsConnection, kafka: Any, kafka_conf: Any, unique: str, handling: str, price: Any,
    loose: Any,
) -> None:
    """Issue #49: Debezium's decimal.handling.mode; precise (the default) keeps numeric(p,s) a decimal(p,s)."""
    table = f"dec_{handling}_{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id integer PRIMARY KEY, price numeric(12,3), loose numeric)"))
        c.execute(text(f"INSERT INTO {table} VALUES (1, 1234.5, 0.12345678901)"))
    pipeline = source_pipeline(kafka, pg, name=f"dec-{unique}", topic=f"state.{unique}", table=table,
                               mode="bulk", decimal_handling=handling)
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert topic_state(kafka_conf, f"state.{unique}") == {(1,): {"id": 1, "price": price, "loose": loose}}
