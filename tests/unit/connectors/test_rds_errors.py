"""Database errors are classified by the server's code, not by the driver's exception class."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from connectors.rds.errors import classify


def _pg(sqlstate: str) -> Exception:
    import psycopg.errors

    cls = psycopg.errors.lookup(sqlstate)
    return cls(f"server said {sqlstate}")


@pytest.mark.parametrize(
    ("state", "meaning"),
    [
        ("54000", "record"),  # index row too big: psycopg's OperationalError, refused for good
        ("23514", "record"),  # check constraint
        ("22001", "record"),  # string too long
        ("42804", "record"),  # datatype mismatch
        ("08006", "transient"),  # connection failure
        ("57P01", "transient"),  # admin shutdown
        ("53200", "busy"),
        ("40001", "busy"),
        ("55P03", "busy"),
        ("42P01", "target"),  # undefined table: any record would hit it (issue #40)
        ("42501", "target"),  # insufficient privilege
        ("42703", "target"),  # undefined column
        ("25006", "target"),  # read-only transaction
        ("53100", "target"),  # disk full
        ("XX000", "suspect"),  # internal error: a record error only if its neighbours succeed
        ("0A000", "fatal"),
    ],
)
def test_postgresql_by_sqlstate(state: str, meaning: str) -> None:
    exc = _pg(state)
    wrapped = OperationalError("INSERT ...", {}, exc)
    got = classify(wrapped, "postgresql")
    assert (got.meaning, got.code) == (meaning, state)


def test_no_server_answer_is_transient() -> None:
    import psycopg

    got = classify(OperationalError("connect", {}, psycopg.OperationalError("connection refused")), "postgresql")
    assert got.meaning == "transient" and got.code == ""


@pytest.mark.parametrize(
    ("code", "meaning"),
    [(1406, "record"), (3819, "record"), (4025, "record"), (1205, "busy"), (2013, "transient"), (1146, "target"), (1142, "target"), (1290, "target"), (1105, "fatal")],
)
def test_mysql_by_error_number(code: int, meaning: str) -> None:
    class OperationalErrorLike(Exception):
        pass

    got = classify(OperationalError("INSERT", {}, OperationalErrorLike(code, "msg")), "mysql")
    assert (got.meaning, got.code) == (meaning, str(code))


def test_sqlite_by_error_name() -> None:
    import sqlite3

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (q INTEGER CHECK (q >= 0))")
    with pytest.raises(sqlite3.IntegrityError) as info:
        conn.execute("INSERT INTO t VALUES (-1)")
    assert classify(info.value, "sqlite").meaning == "record"
