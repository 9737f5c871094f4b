"""Fixtures of the source tests: a PostgreSQL database of their own, and ``rds`` over both dialects.

The commit-safe watermark of RdsSource looks at the open transactions of its
*database*; other test suites writing to the shared database at the same time
would hold it back (correctly, but it would make these tests depend on them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from connectors.rds import connection as rds_connection
from connectors.rds.connection import RdsConnection
from tests.conftest import sql_engine

SOURCES_DB = "threes_sources"


@pytest.fixture(scope="session")
def pg(pg: RdsConnection) -> RdsConnection:
    """The stack's PostgreSQL, database ``threes_sources`` (created when missing)."""
    admin = rds_connection.sql_engine(pg, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            if not c.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": SOURCES_DB}).first():
                try:
                    c.execute(text(f'CREATE DATABASE "{SOURCES_DB}"'))
                except Exception:  # another session created it at the same moment
                    pass
    finally:
        admin.dispose()
    url = make_url(pg.url).set(database=SOURCES_DB).render_as_string(hide_password=False)
    return RdsConnection(type="rds", url=url, password=pg.password)


@pytest.fixture(scope="session")
def pg_engine(pg: RdsConnection) -> Iterator[Any]:
    """An engine of ``threes_sources`` (the session-wide ``pg_engine`` is of database ``threes``)."""
    yield from sql_engine(pg)


@pytest.fixture(params=["postgresql", "mysql"])
def rds(request: pytest.FixtureRequest) -> tuple[RdsConnection, Any]:
    """``(connection, engine)`` of PostgreSQL, then of MariaDB (MySQL dialect): one test, both databases."""
    if request.param == "postgresql":
        return request.getfixturevalue("pg"), request.getfixturevalue("pg_engine")
    return request.getfixturevalue("mysql"), request.getfixturevalue("mysql_engine")
