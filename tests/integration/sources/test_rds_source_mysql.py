"""RdsSource against a real MariaDB (MySQL dialect) and Kafka: the contract, the delay bound, the types.

The tests that are the same on both dialects take the ``rds`` fixture in
``test_rds_source.py``; these need MySQL's own SQL.
"""

from __future__ import annotations

import datetime as dt
import decimal
import time
from typing import Any

from sqlalchemy import text

from connectors.rds.connection import RdsConnection
from tests.integration.sources.rds import RdsSourceContract, late_commit, source_pipeline
from threes.testing.source import run_once, topic_state

UTC = dt.UTC


class TestRdsSourceMysqlContract(RdsSourceContract):
    """The source contract on a MariaDB table in ``timestamp`` mode (a ``DATETIME(6)`` cursor).

    MariaDB's JSON is LONGTEXT with a ``json_valid`` check: the text comes back as written.
    """

    connection_fixture = "mysql"
    engine_fixture = "mysql_engine"
    create_sql = (
        "CREATE TABLE {table} (id int PRIMARY KEY, name text NOT NULL, amount decimal(12,2), "
        "born date, doc json, updated_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))"
    )
    upsert_sql = (
        "INSERT INTO {table} (id, name, amount, born, doc) "
        "VALUES (:id, :name, :amount, :born, :doc) ON DUPLICATE KEY UPDATE "
        "name = VALUES(name), amount = VALUES(amount), born = VALUES(born), doc = VALUES(doc), "
        "updated_at = NOW(6)"
    )


# -- commit-safe watermark: the delay bound ------------------------------------------------------------------

DELAY_S = 6.0


def _wait_until_older_than(engine: Any, table: str, seconds: float) -> None:
    """Wait (on the server's clock) until every row of ``table`` is ``seconds`` old: a wait, not a timed assertion."""
    deadline = time.monotonic() + 120
    with engine.connect() as c:
        while not c.execute(
            text(f"SELECT MAX(updated_at) < NOW(6) - INTERVAL :s MICROSECOND FROM {table}"), {"s": int(seconds * 1e6)}
        ).scalar_one():
            assert time.monotonic() < deadline, "the server's clock did not move"
            c.rollback()
            time.sleep(0.2)


def test_late_commit_within_the_delay_loses_no_row(
    mysql_engine: Any, mysql: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    """MySQL has no snapshot horizon to read: the delay bound alone keeps a late commit's row.

    A transaction writes row 1 (``updated_at = NOW(6)`` = T0), another commits row
    2 (T1 > T0), both pollers run, then the first transaction commits, within
    ``commit_delay_s`` of its write. The naive poller has moved past T1 and never
    sees row 1; RdsSource read nothing younger than the delay, so it has both.
    """
    table = f"late_{unique}"
    with mysql_engine.begin() as c:
        c.execute(
            text(
                f"CREATE TABLE {table} (id int PRIMARY KEY, v text, "
                "updated_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))"
            )
        )
    pipeline = source_pipeline(
        kafka,
        mysql,
        name=f"late-{unique}",
        topic=f"state.{unique}",
        table=table,
        mode="timestamp",
        timestamp_column="updated_at",
        commit_delay_s=DELAY_S,
        reconcile_interval_s=None,
    )

    def committed() -> None:
        with mysql_engine.connect() as c:
            # the premise: the transaction committed within the delay of its write (else the bound cannot help)
            age = c.execute(text(f"SELECT TIMESTAMPDIFF(MICROSECOND, updated_at, NOW(6)) FROM {table} WHERE id = 1"))
            assert age.scalar_one() < DELAY_S * 1e6, "the machine stalled longer than the delay; raise DELAY_S"

    seen = late_commit(
        mysql_engine,
        table,
        pipeline,
        committed=committed,
        before_second_run=lambda: _wait_until_older_than(mysql_engine, table, DELAY_S),
    )

    # the naive poller moved its watermark past T0 and never sees row 1 ...
    assert seen.naive_seen == [2]
    assert 1 not in seen.naive_more
    # ... this source has both: it read nothing younger than the delay while the transaction was open
    assert sorted(topic_state(kafka_conf, f"state.{unique}")) == [(1,), (2,)]
    assert seen.first.rows_read == 0


def test_timestamp_cursor_is_utc_whatever_the_writers_time_zone(
    mysql_engine: Any, mysql: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    """A ``TIMESTAMP`` column is an instant: written from a +05:00 session, it reaches the topic as UTC.

    The source's sessions start in +03:00 (the server's default zone is set to it for the
    test, ``SET GLOBAL time_zone``; a URL's ``init_command`` is refused as unsafe): the
    connector's own ``SET time_zone`` must win.
    """
    table = f"tz_{unique}"
    with mysql_engine.connect() as c:
        c.execute(text("SET time_zone = '+05:00'"))
        c.execute(text(f"CREATE TABLE {table} (id int PRIMARY KEY, at timestamp(6) NOT NULL)"))
        c.execute(text(f"INSERT INTO {table} VALUES (1, '2024-06-01 12:00:00.250000'), (2, NOW(6))"))
        c.commit()
    pipeline = source_pipeline(
        kafka,
        mysql,
        name=f"tz-{unique}",
        topic=f"state.{unique}",
        table=table,
        mode="timestamp",
        timestamp_column="at",
        commit_delay_s=0,
    )
    with mysql_engine.connect() as c:
        default_zone = c.execute(text("SELECT @@GLOBAL.time_zone")).scalar()
        c.execute(text("SET GLOBAL time_zone = '+03:00'"))  # new sessions start in +03:00
    try:
        (s,) = run_once(pipeline).values()
    finally:
        with mysql_engine.connect() as c:
            c.execute(text("SET GLOBAL time_zone = :zone"), {"zone": default_zone})
    assert s.state == "caught_up", s.error
    state = topic_state(kafka_conf, f"state.{unique}")
    # row 2 (NOW() of a +05:00 session) is read at once: the bound is taken in the same (UTC) clock
    assert sorted(state) == [(1,), (2,)]
    assert state[(1,)]["at"] == dt.datetime(2024, 6, 1, 7, 0, 0, 250000, tzinfo=UTC)


# -- types ----------------------------------------------------------------------------------------------------


def test_types_round_trip(mysql_engine: Any, mysql: RdsConnection, kafka: Any, kafka_conf: Any, unique: str) -> None:
    table = f"types_{unique}"
    with mysql_engine.begin() as c:
        c.execute(
            text(
                f"CREATE TABLE {table} (id bigint PRIMARY KEY, small smallint, tiny tinyint, flag boolean, "
                "ubig bigint unsigned, price decimal(20,6), big_dec decimal(65,30), ratio double, single float, "
                "at timestamp(6) NULL, local_at datetime(6), whole_at datetime, day date, t time(6), doc json, "
                "raw blob, vb varbinary(8), note varchar(10), e enum('a','b'))"
            )
        )
        c.execute(
            text(
                f"INSERT INTO {table} VALUES (1, 7, -3, true, 18446744073709551615, 12345678901234.123456, "
                "12345678901234567890123456789012345.123456789012345678901234567890, 0.5, 1.5, "
                "'2024-02-29 23:59:59.123456', '2024-02-29 23:59:59.5', '2024-02-29 23:59:59', '1999-12-31', "
                "'12:34:56.5', '{\"a\": [1, 2], \"b\": null}', x'deadbeef00', x'01', 'hé', 'b')"
            )
        )
        c.execute(text(f"INSERT INTO {table} (id) VALUES (2)"))
    pipeline = source_pipeline(kafka, mysql, name=f"types-{unique}", topic=f"state.{unique}", table=table)
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    state = topic_state(kafka_conf, f"state.{unique}")
    assert state[(1,)] == {
        "id": 1,
        "small": 7,
        "tiny": -3,
        "flag": 1,  # BOOLEAN is TINYINT(1): an int, never a lossy boolean
        "ubig": decimal.Decimal("18446744073709551615"),
        "price": decimal.Decimal("12345678901234.123456"),
        "big_dec": decimal.Decimal("12345678901234567890123456789012345.123456789012345678901234567890"),
        "ratio": 0.5,
        "single": 1.5,
        "at": dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC),
        "local_at": dt.datetime(2024, 2, 29, 23, 59, 59, 500000),
        "whole_at": dt.datetime(2024, 2, 29, 23, 59, 59),
        "day": dt.date(1999, 12, 31),
        "t": dt.time(12, 34, 56, 500000),
        "doc": '{"a": [1, 2], "b": null}',
        "raw": b"\xde\xad\xbe\xef\x00",
        "vb": b"\x01",
        "note": "hé",
        "e": "b",
    }
    assert state[(2,)] == {"id": 2, **{k: None for k in state[(1,)] if k != "id"}}


def test_zero_date_stops_in_one_line_or_is_a_dead_letter(
    mysql_engine: Any, mysql: RdsConnection, kafka: Any, kafka_conf: Any, unique: str
) -> None:
    """Issue #49 on MariaDB: a zero date (``'0000-00-00'``, which MariaDB takes unless ``sql_mode`` has
    ``NO_ZERO_DATE``) has no Avro ``date``: the driver hands it as the text ``'0000-00-00'``.

    ``errors.tolerance: none`` stops the source before it in one line; ``all`` makes it a dead letter and goes on.
    """
    import json

    from connectors.runtime.offsets import OffsetStore
    from tests.integration.sources.rds import dead_letters

    table, name, topic = f"zero_{unique}", f"zero-{unique}", f"state.{unique}"
    with mysql_engine.begin() as c:
        c.execute(text("SET SESSION sql_mode = ''"))
        c.execute(text(f"CREATE TABLE {table} (id int PRIMARY KEY, day date, amount decimal(65,30))"))
        c.execute(text(f"INSERT INTO {table} VALUES (1, '2024-02-29', 1.5), (2, '0000-00-00', 2), "
                       f"(3, '2024-03-01', 12345678901234567890123456789012345.123456789012345678901234567891)"))
    options: dict[str, Any] = {"name": name, "topic": topic, "table": table, "mode": "incrementing",
                               "incrementing_column": "id", "batch_records": 1}
    (s,) = run_once(source_pipeline(kafka, mysql, **options)).values()
    assert s.state == "failed" and not s.restartable
    for part in (name, table, "{'id': 2}", 'column "day"', "errors.tolerance: all", f"{topic}.dlq"):
        assert part in s.error, f"{part!r} missing from: {s.error}"
    assert "\n" not in s.error
    assert OffsetStore(kafka_conf).load(name) == {"mode": "incrementing", "after": [1]}
    assert sorted(topic_state(kafka_conf, topic)) == [(1,)]

    tolerant = source_pipeline(kafka, mysql, **options, errors={"tolerance": "all"})
    (s,) = run_once(tolerant).values()
    assert s.state == "caught_up", s.error
    big = decimal.Decimal("12345678901234567890123456789012345.123456789012345678901234567891")
    assert topic_state(kafka_conf, topic) == {
        (1,): {"id": 1, "day": dt.date(2024, 2, 29), "amount": decimal.Decimal("1." + "5".ljust(30, "0"))},
        (3,): {"id": 3, "day": dt.date(2024, 3, 1), "amount": big},  # decimal(65,30): every digit
    }
    ((key, value, headers),) = dead_letters(kafka_conf, f"{topic}.dlq")
    assert key == {"id": 2}
    assert value["day"] == "0000-00-00"
    assert (headers["dlq.stage"], headers["dlq.source.table"], headers["dlq.source.column"]) == ("encode", table, "day")
    assert json.loads(headers["dlq.source.key"]) == {"id": 2}
    assert json.loads(headers["dlq.source.position"]) == {"mode": "incrementing", "after": [2]}
    assert OffsetStore(kafka_conf).load(name) == {"mode": "incrementing", "after": [3]}

    with mysql_engine.begin() as c:  # later rows arrive
        c.execute(text(f"INSERT INTO {table} VALUES (4, '2024-03-02', 4)"))
    (s,) = run_once(tolerant).values()
    assert s.state == "caught_up", s.error
    assert sorted(topic_state(kafka_conf, topic)) == [(1,), (3,), (4,)]
