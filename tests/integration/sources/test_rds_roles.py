"""RdsSource under unprivileged roles: the watermark's view of other roles' transactions, and cdc's privileges.

The stack's ``threes`` role is a superuser; a connector in production is not.
Here the writer and the connector are separate, unprivileged roles:

* without ``pg_read_all_stats`` the connector cannot see the writer's open
  transaction in ``pg_stat_activity``; the timestamp source refuses to start
  (instead of silently falling back to ``commit_delay_s``);
* with it, a row written by the writer's long transaction (older timestamp,
  committed after the source read past it) still arrives;
* ``mode: cdc`` without the ``REPLICATION`` attribute is one line naming it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from connectors.rds.connection import RdsConnection
from connectors.rds.source import RdsSource
from kernel.exceptions import SetupError
from tests.integration.sources.rds import source_pipeline
from threes.testing.source import run_once, topic_state

PASSWORD = "unprivileged-pw"


@pytest.fixture
def roles(pg: RdsConnection, pg_engine: Any, unique: str) -> Iterator[dict[str, Any]]:
    """A table ``t`` written by role ``writer`` and read by role ``reader`` (both plain LOGIN roles)."""
    t, writer, reader = f"roles_{unique}", f"writer_{unique}", f"reader_{unique}"
    with pg_engine.begin() as c:
        for role in (writer, reader):
            c.execute(text(f"CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'"))
        c.execute(text(f"CREATE TABLE {t} (id int PRIMARY KEY, v text, updated_at timestamptz NOT NULL "
                       "DEFAULT now())"))
        c.execute(text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {t} TO {writer}"))
        c.execute(text(f"GRANT SELECT ON {t} TO {reader}"))

    def conn(role: str) -> RdsConnection:
        url = make_url(pg.url).set(username=role).render_as_string(hide_password=False)
        return RdsConnection(type="rds", url=url, password=SecretStr(PASSWORD))

    writer_conn = conn(writer)
    writer_engine = create_engine(make_url(writer_conn.url).set(password=PASSWORD))
    try:
        yield {"table": t, "writer": writer_engine, "reader": conn(reader), "reader_role": reader}
    finally:
        writer_engine.dispose()
        with pg_engine.begin() as c:
            c.execute(text(f"DROP TABLE IF EXISTS {t}"))
            for role in (writer, reader):
                c.execute(text(f"DROP OWNED BY {role}"))
                c.execute(text(f"DROP ROLE {role}"))


def _source(kafka: Any, conn: RdsConnection, table: str, topic: str, **extra: Any) -> Any:
    return source_pipeline(kafka, conn, name=f"roles-{table}", topic=topic, table=table, **extra)


def test_timestamp_source_refuses_a_role_blind_to_other_roles_transactions(
    kafka: Any, roles: dict[str, Any], topic: str
) -> None:
    pipeline = _source(kafka, roles["reader"], roles["table"], topic, mode="timestamp", timestamp_column="updated_at")
    cfg = pipeline.sources[0]
    task = RdsSource(cfg, pipeline.connections["pg"], kafka=kafka)
    with pytest.raises(SetupError) as err:
        task.open(None)
    task.close()
    message = str(err.value)
    assert "pg_read_all_stats" in message and roles["reader_role"] in message and "\n" not in message
    # hold_for_transactions: none accepts the delay-only bound explicitly
    cfg_none = _source(kafka, roles["reader"], roles["table"], topic, mode="timestamp",
                       timestamp_column="updated_at", hold_for_transactions="none").sources[0]
    task = RdsSource(cfg_none, pipeline.connections["pg"], kafka=kafka)
    task.open(None)
    task.close()


def test_with_pg_read_all_stats_another_roles_long_transaction_holds_the_watermark(
    kafka: Any, kafka_conf: Any, pg_engine: Any, roles: dict[str, Any], topic: str
) -> None:
    with pg_engine.begin() as c:
        c.execute(text(f"GRANT pg_read_all_stats TO {roles['reader_role']}"))
    t = roles["table"]
    # reconciliation off: it would re-send a skipped row behind the watermark's back
    pipeline = _source(kafka, roles["reader"], t, topic, mode="timestamp", timestamp_column="updated_at",
                       reconcile_interval_s=None)
    long_tx = roles["writer"].connect()
    try:
        long_tx.execute(text(f"INSERT INTO {t} (id, v) VALUES (1, 'committed late')"))  # updated_at = T0
        with roles["writer"].begin() as c:
            c.execute(text(f"INSERT INTO {t} (id, v) VALUES (2, 'committed first')"))  # T1 > T0
        run_once(pipeline)
        assert set(topic_state(kafka_conf, topic)) == set()  # held below T0 by the writer's open transaction
        long_tx.commit()
    finally:
        long_tx.close()
    run_once(pipeline)
    assert {k[0]: v["v"] for k, v in topic_state(kafka_conf, topic).items()} == {
        1: "committed late", 2: "committed first"
    }


def test_cdc_without_the_replication_attribute_is_one_line(kafka: Any, roles: dict[str, Any], topic: str) -> None:
    pipeline = _source(kafka, roles["reader"], roles["table"], topic, mode="cdc")
    task = RdsSource(pipeline.sources[0], pipeline.connections["pg"], kafka=kafka)
    try:
        with pytest.raises(SetupError) as err:
            task.open(None)
    finally:
        task.close()
    message = str(err.value)
    assert "REPLICATION" in message and roles["reader_role"] in message and "\n" not in message
