"""Helpers of the RdsSource tests on both dialects (PostgreSQL and MariaDB): the pipeline, the contract, a naive poller."""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from sqlalchemy import text

from connectors.rds.connection import RdsConnection
from threes.testing.source import SourceContract, run_once


def source_pipeline(kafka: Any, conn: RdsConnection, **source: Any) -> Any:
    """A pipeline of one ``rds_source`` on ``conn`` (connection ``pg``, ``commit_delay_s`` 0 unless given)."""
    from threes.config import pipeline_from_dict

    return pipeline_from_dict(
        {
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
            "connections": {"pg": {"type": "rds", "url": conn.url, "password": conn.password.get_secret_value()}},
            "sources": [{"type": "rds_source", "connection": "pg", "commit_delay_s": 0, **source}],
        }
    )


def dead_letters(kafka_conf: Any, topic: str) -> list[tuple[Any, Any, dict[str, str]]]:
    """Every record of a source's dead letter topic, read ``read_committed``: ``(key, value, headers)``.

    The key is decoded as the state topic's (``None`` when absent), the value is the row's JSON, the ``dlq.*``
    headers are text (the batch's own binary headers are left out).
    """
    import uuid

    from confluent_kafka import Consumer, TopicPartition

    from kernel.kafka.topics import end_offsets
    from schemas.serde import AvroDeserializer
    from schemas.store import SchemaStore

    ends = end_offsets(kafka_conf, topic)
    consumer = Consumer({**kafka_conf, "group.id": f"dlq-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    de = AvroDeserializer(SchemaStore(kafka_conf))
    out: list[tuple[Any, Any, dict[str, str]]] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        idle = 0
        while idle < 3:
            msgs = consumer.consume(1000, timeout=1.0)
            idle = 0 if msgs else idle + 1
            for msg in msgs:
                assert msg.error() is None, msg.error()
                key = None if msg.key() is None else de(msg.key())
                value = None if msg.value() is None else json.loads(msg.value())
                headers = msg.headers() or []
                out.append((key, value, {k: (v or b"").decode() for k, v in headers if k.startswith("dlq.")}))
    finally:
        consumer.close()
    return out


def write_source_run_config(
    folder: Path,
    kafka: Any,
    conn: RdsConnection,
    name: str,
    topic: str,
    table: str,
    options: str,
    client_config: dict[str, Any] | None = None,
) -> tuple[Path, dict[str, str]]:
    """A one-source pipeline for ``threes source run`` as a child process (kill -9 and group tests).

    Args:
        folder: where ``pipeline.yaml`` goes.
        options: the source's further YAML lines (indented by four spaces, each ending in a newline).
        client_config: ``kafka.client_config`` (librdkafka properties), if any.

    Returns:
        The config's path and the child's environment (the password in ``$THREES_PGPASS``, never in the file).
    """
    cfg = folder / "pipeline.yaml"
    tuning = "".join(f"    {key}: {value}\n" for key, value in (client_config or {}).items())
    cfg.write_text(
        f"kafka:\n  bootstrap_servers: {kafka.bootstrap_servers}\n"
        + (f"  client_config:\n{tuning}" if tuning else "")
        + f"connections:\n  pg:\n    type: rds\n    url: {conn.url}\n    password: ${{env:THREES_PGPASS}}\n"
        f"sources:\n  - name: {name}\n    type: rds_source\n    connection: pg\n    topic: {topic}\n"
        f"    table: {table}\n{options}"
    )
    return cfg, {"THREES_PGPASS": conn.password.get_secret_value(), "PATH": "/usr/bin:/bin"}


def naive_poll(engine: Any, table: str, last: dt.datetime | None) -> tuple[list[int], dt.datetime | None]:
    """What a naive timestamp poller does (Kafka Connect JDBC ``timestamp`` mode, no delay): ts > last AND ts < now.

    Returns the ids read, in ``updated_at`` order, and the new watermark (the last
    ``updated_at`` read, else ``last``). "now" is the statement's time on the server.
    """
    if engine.dialect.name == "postgresql":
        no_last, now = "CAST(:last AS timestamptz) IS NULL", "statement_timestamp()"
    else:
        no_last, now = ":last IS NULL", "NOW(6)"
    with engine.connect() as c:
        rows = c.execute(
            text(
                f"SELECT id, updated_at FROM {table} WHERE ({no_last} OR updated_at > :last) "
                f"AND updated_at < {now} ORDER BY updated_at"
            ),
            {"last": last},
        ).all()
    return [r.id for r in rows], (rows[-1].updated_at if rows else last)


@dataclass(frozen=True)
class LateCommit:
    """What the late-commit scenario saw: the naive poller's two reads and the source's two runs (stats)."""

    naive_seen: list[int]
    naive_more: list[int]
    first: Any
    second: Any


def late_commit(
    engine: Any,
    table: str,
    pipeline: Any,
    *,
    committed: Callable[[], None] = lambda: None,
    before_second_run: Callable[[], None] = lambda: None,
) -> LateCommit:
    """Run the late-commit scenario on ``table (id, v, updated_at DEFAULT <the server's clock>)``.

    A transaction writes row 1 (``updated_at`` = T0) and stays open; another
    commits row 2 (T1 > T0); the naive poller and ``pipeline`` run once; the
    first transaction commits (then ``committed()``); the naive poller reads
    again, ``before_second_run()``, and ``pipeline`` runs again. A naive poller
    has moved its watermark past T0 and never sees row 1.
    """
    long_tx = engine.connect()
    tx = long_tx.begin()
    long_tx.execute(text(f"INSERT INTO {table} (id, v) VALUES (1, 'committed late')"))  # updated_at = T0
    with engine.begin() as c:
        c.execute(text(f"INSERT INTO {table} (id, v) VALUES (2, 'committed at once')"))  # updated_at = T1 > T0

    # both pollers run while the first transaction is still open
    naive_seen, naive_last = naive_poll(engine, table, None)
    (first,) = run_once(pipeline).values()
    assert first.state == "caught_up", first.error
    tx.commit()
    committed()
    long_tx.close()
    naive_more, _ = naive_poll(engine, table, naive_last)
    before_second_run()
    (second,) = run_once(pipeline).values()
    assert second.state == "caught_up", second.error
    return LateCommit(naive_seen, naive_more, first, second)


class RdsSourceContract(SourceContract):
    """The source contract on a table in ``timestamp`` mode; a subclass gives its dialect's fixtures and SQL.

    The table is ``(id, name, amount, born, doc, updated_at)``: a JSON ``doc`` and
    an ``updated_at`` the upsert sets to the server's clock.
    """

    #: Names of the connection and engine fixtures of the dialect.
    connection_fixture: ClassVar[str]
    engine_fixture: ClassVar[str]
    #: ``CREATE TABLE {table} ...`` and ``INSERT INTO {table} ...`` (an upsert that moves ``updated_at``).
    create_sql: ClassVar[str]
    upsert_sql: ClassVar[str]

    def setup_system(self, ctx: dict[str, Any]) -> None:
        engine = ctx["request"].getfixturevalue(self.engine_fixture)
        ctx["engine"] = engine
        ctx["db"] = ctx["request"].getfixturevalue(self.connection_fixture)
        ctx["table"] = f"src_{ctx['unique']}"
        with engine.begin() as c:
            c.execute(text(self.create_sql.format(table=ctx["table"])))

    def connections(self, ctx: dict[str, Any]) -> dict[str, Any]:
        db = ctx["db"]
        return {"db": {"type": "rds", "url": db.url, "password": db.password.get_secret_value()}}

    def bad_connections(self, ctx: dict[str, Any]) -> tuple[dict[str, Any], str]:
        secret = "wrong-secret-4711"
        return {"db": {"type": "rds", "url": ctx["db"].url, "password": secret}}, secret

    def source_config(self, ctx: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": ctx["name"],
            "type": "rds_source",
            "connection": "db",
            "topic": ctx["topic"],
            "table": ctx["table"],
            "mode": "timestamp",
            "timestamp_column": "updated_at",
            "commit_delay_s": 0,
            "batch_records": 7,
        }

    def make_row(self, i: int, version: int = 0) -> dict[str, Any]:
        return {
            "id": i,
            "name": f"n{i}v{version}",
            "amount": decimal.Decimal(f"{i * 3 + version}.{i % 100:02d}"),
            "born": dt.date(2000, 1, 1) + dt.timedelta(days=i),
            "doc": {"i": i, "v": version, "t": "é"},
        }

    def upsert(self, ctx: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        with ctx["engine"].begin() as c:
            c.execute(
                text(self.upsert_sql.format(table=ctx["table"])),
                [{**r, "doc": json.dumps(r["doc"], ensure_ascii=False)} for r in rows],
            )

    def delete(self, ctx: dict[str, Any], keys: list[tuple]) -> None:
        with ctx["engine"].begin() as c:
            c.execute(text(f"DELETE FROM {ctx['table']} WHERE id = :id"), [{"id": k[0]} for k in keys])

    def system_state(self, ctx: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
        with ctx["engine"].connect() as c:
            rows = c.execute(text(f"SELECT id, name, amount, born, doc, updated_at FROM {ctx['table']}")).mappings()
            return {(r["id"],): {**r, "doc": self.doc_text(r["doc"])} for r in rows}

    def doc_text(self, doc: Any) -> str:
        """The JSON text the source writes for ``doc`` as the driver returns it (here: the text itself)."""
        return doc
