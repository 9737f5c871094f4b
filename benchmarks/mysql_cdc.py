"""``rds_source`` ``mode: cdc`` on MySQL/MariaDB vs a raw ``mysql-replication`` reader of the same binlog.

Usage::

    python benchmarks/mysql_cdc.py [--transactions 3000] [--rows 10000]

A fresh table (``--rows`` rows, the stack's MariaDB) is snapshotted by the source, which stops; a backlog of
``--transactions`` transactions is committed (each: one insert, one update of a random row, a delete of a
random row every other transaction), between two binlog positions read with ``SHOW MASTER STATUS``. Then,
in the same run, over the same binlog range:

* **raw**: ``pymysqlreplication.BinLogStreamReader`` (the library the source uses) reads from the first
  position to the second, decoding the table's row events and counting their rows: nothing else (no Avro,
  no Kafka). Changes/s = rows / (time of the last row event read - of the first).
* **threes**: the source resumes from its stored position (the first) and runs until caught up:
  changes/s = records of the backlog / (Kafka timestamp of its last record - of its first), so process
  start does not count: from commit (already in the binlog) to topic.

The ratio ``ratio_mysql_cdc_vs_raw`` = threes / raw. The binlog is shared with whatever else writes to the
server (both readers skip the same other events). Prints a table and, last, one JSON line with the load
averages before and after.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import random
import threading
import time
import uuid
from typing import Any

from bench_topics import BenchTopics
from confluent_kafka import Consumer, TopicPartition
from rich.console import Console
from rich.table import Table
from sqlalchemy import text

from connectors.rds.binlog_setup import version_of
from connectors.rds.connection import RdsConnection, sql_engine
from connectors.runtime.process import tune_gc
from connectors.runtime.standalone import SourceWorker, task_specs
from kernel.config.models import KafkaConfig
from kernel.kafka.topics import end_offsets
from threes.config import pipeline_from_dict
from threes.local.endpoints import Endpoints


def pipeline(kafka: Any, conn: RdsConnection, name: str, table: str, topic: str) -> Any:
    source = {
        "name": name,
        "type": "rds_source",
        "connection": "db",
        "topic": topic,
        "table": table,
        "mode": "cdc",
        "topic_spec": {"partitions": 1},
        "batch_records": 1000,
    }
    secret = conn.password.get_secret_value() if conn.password else None
    return pipeline_from_dict(
        {
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
            "connections": {"db": {"type": "rds", "url": conn.url, "password": secret}},
            "sources": [source],
        }
    )


def run_until_caught_up(p: Any) -> None:
    worker = SourceWorker(p)
    for spec in task_specs(p.sources):
        worker.start(spec, once=True)
    worker.wait(threading.Event())
    for key, stats in worker.stats().items():
        if stats.error:
            raise RuntimeError(f"{key}: {stats.error}")


def kafka_span(kconf: dict[str, Any], topic: str, start: int) -> tuple[int, float]:
    """Records of partition 0 from ``start`` and the span of their Kafka timestamps, seconds."""
    end = end_offsets(kconf, topic).get(0, 0)
    consumer = Consumer({**kconf, "group.id": f"bench-{uuid.uuid4().hex}", "enable.auto.commit": False})
    stamps: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, 0, start)])
        while start + len(stamps) < end:
            stamps.extend(msg.timestamp()[1] for msg in consumer.consume(10_000, timeout=1.0))
    finally:
        consumer.close()
    return len(stamps), max((stamps[-1] - stamps[0]) / 1000, 1e-3) if len(stamps) > 1 else float("nan")


def binlog_end(engine: Any) -> tuple[str, int]:
    with engine.connect() as c:
        row = c.exec_driver_sql("SHOW MASTER STATUS").first()
    return str(row[0]), int(row[1])


def backlog(engine: Any, table: str, n: int, rows: int) -> int:
    """``n`` transactions (insert, update, a delete every other one); returns the changes committed."""
    rng = random.Random(1)
    changes = 0
    with engine.connect() as c:
        for i in range(n):
            c.execute(text(f"INSERT INTO {table} (id, v, payload) VALUES (:id, 0, 'bulk')"), {"id": rows + 1 + i})
            changes += (
                1
                + c.execute(text(f"UPDATE {table} SET v = v + 1 WHERE id = :id"), {"id": rng.randint(1, rows)}).rowcount
            )
            if i % 2:
                changes += c.execute(text(f"DELETE FROM {table} WHERE id = :id"), {"id": rng.randint(1, rows)}).rowcount
            c.commit()
    return changes


def raw_read(conn: RdsConnection, table: str, start: tuple[str, int], end: tuple[str, int]) -> tuple[int, float]:
    """Rows of ``table``'s row events between two binlog positions, read by a bare BinLogStreamReader."""
    from pymysqlreplication import BinLogStreamReader
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent
    from sqlalchemy.dialects.mysql.pymysql import MySQLDialect_pymysql

    _args, settings = MySQLDialect_pymysql().create_connect_args(conn.sqlalchemy_url())
    database = settings.pop("database")
    reader = BinLogStreamReader(
        connection_settings=settings,
        server_id=0x7D000001,
        log_file=start[0],
        log_pos=start[1],
        resume_stream=True,
        blocking=False,
        only_schemas=[database],
        only_tables=[table],
        only_events=[WriteRowsEvent, UpdateRowsEvent, DeleteRowsEvent],
        enable_logging=False,
    )
    count, first, last = 0, None, None
    stop = version_of(*end)
    try:
        for event in reader:
            now = time.monotonic()
            first = now if first is None else first
            count += len(event.rows)
            last = now
            if version_of(reader.log_file, reader.log_pos) >= stop:
                break
    finally:
        reader.close()
    return count, max((last or 0) - (first or 0), 1e-3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=3000, help="backlog transactions")
    parser.add_argument("--rows", type=int, default=10_000, help="rows of the table before the backlog")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    tune_gc()  # what `threes source run` sets in the source's process
    load_before = os.getloadavg()
    endpoints = Endpoints.from_env()
    kafka = KafkaConfig(bootstrap_servers=endpoints.kafka_bootstrap)
    kconf = kafka.librdkafka_config()
    atexit.register(BenchTopics(kconf).drop)  # this run's bench.* topics
    conn = RdsConnection(type="rds", url=endpoints.mysql_url)
    engine = sql_engine(conn)
    u = uuid.uuid4().hex[:8]
    table, name, topic = f"bench_bcdc_{u}", f"bench-bcdc-{u}", f"bench.bcdc.{u}"
    with engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v int NOT NULL, payload varchar(40))"))
        for lo in range(1, args.rows + 1, 1000):
            values = ",".join(f"({i}, 0, MD5({i}))" for i in range(lo, min(lo + 1000, args.rows + 1)))
            c.execute(text(f"INSERT INTO {table} VALUES {values}"))
    try:
        p = pipeline(kafka, conn, name, table, topic)
        run_until_caught_up(p)  # the snapshot; the position is the binlog's end then
        snapshot_end = end_offsets(kconf, topic).get(0, 0)
        start = binlog_end(engine)
        committed = backlog(engine, table, args.transactions, args.rows)
        end = binlog_end(engine)
        raw_rows, raw_s = raw_read(conn, table, start, end)
        run_until_caught_up(p)
        records, threes_s = kafka_span(kconf, topic, snapshot_end)
    finally:
        with engine.begin() as c:
            c.execute(text(f"DROP TABLE IF EXISTS {table}"))
        engine.dispose()
    raw_rate, threes_rate = raw_rows / raw_s, records / threes_s
    load_after = os.getloadavg()
    out = Table(title="mysql binlog cdc: rds_source vs a raw mysql-replication reader (same binlog range)")
    for col in ("reader", "backlog changes", "changes read", "seconds", "changes/s"):
        out.add_column(col)
    out.add_row("raw BinLogStreamReader", str(committed), str(raw_rows), f"{raw_s:.2f}", f"{raw_rate:,.0f}")
    out.add_row("rds_source mode: cdc", str(committed), str(records), f"{threes_s:.2f}", f"{threes_rate:,.0f}")
    Console(width=140).print(out)
    print(
        json.dumps(
            {
                "benchmark": "mysql_cdc",
                "backlog_transactions": args.transactions,
                "backlog_changes": committed,
                "raw_changes": raw_rows,
                "threes_records": records,
                "raw_changes_per_s": round(raw_rate),
                "threes_changes_per_s": round(threes_rate),
                "ratio_mysql_cdc_vs_raw": round(threes_rate / raw_rate, 3),
                "load_average_before": [round(x, 2) for x in load_before],
                "load_average_after": [round(x, 2) for x in load_after],
            }
        )
    )


if __name__ == "__main__":
    main()
