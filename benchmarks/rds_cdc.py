"""``rds_source`` ``mode: cdc`` vs the polling mode (``timestamp``): change throughput and commit -> Kafka delay.

Usage::

    python benchmarks/rds_cdc.py [--transactions 3000] [--rate 20] [--seconds 10]

Each side gets a fresh table (10,000 rows, database ``threes_bench``) and topic
and is measured twice:

* **throughput**: the source snapshots the table and stops; a backlog of
  ``--transactions`` pgbench-style transactions is committed (each: one
  insert, one update of a random row, a delete of a random row every other
  transaction); the source then runs until caught up. Changes/s = records of
  the backlog / (Kafka timestamp of its last record - of its first), so process
  start and the snapshot do not count. The polling side cannot see deletes
  (reconciliation off, as it would be between reconciliations): its record
  count says so.
* **delay**: the source runs; ``--rate`` transactions per second (one insert
  each, a token in ``payload``) are committed for ``--seconds``; a consumer
  takes each token's arrival time - the time its ``COMMIT`` returned (p50,
  p99, max).

Polling runs ``mode: timestamp`` with ``commit_delay_s: 0``, ``poll_interval_s:
0.5`` (its low-latency setting; the defaults, 5 s and 5 s, add ~7.5 s) and the
commit-safe watermark (``hold_for_transactions: writers``); CDC runs with its
defaults (``poll_interval_s`` 0.2 s). Prints a table and, last, one JSON line.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import random
import statistics
import threading
import time
import uuid
from typing import Any

from bench_topics import BenchTopics
from confluent_kafka import Consumer, TopicPartition
from rich.console import Console
from rich.table import Table
from sqlalchemy import text
from sqlalchemy.engine import make_url

from connectors.rds.cdc import default_name
from connectors.rds.connection import RdsConnection, sql_engine
from connectors.runtime.process import tune_gc
from connectors.runtime.standalone import SourceWorker, task_specs
from kernel.config.models import KafkaConfig
from kernel.kafka.topics import end_offsets
from schemas.serde import AvroDeserializer
from schemas.store import SchemaStore
from threes.config import pipeline_from_dict
from threes.local.endpoints import Endpoints

DB = "threes_bench"
ROWS = 10_000


def database(admin_url: str) -> RdsConnection:
    admin = sql_engine(RdsConnection(type="rds", url=admin_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        if not c.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": DB}).first():
            c.execute(text(f'CREATE DATABASE "{DB}"'))
    admin.dispose()
    return RdsConnection(type="rds", url=make_url(admin_url).set(database=DB).render_as_string(hide_password=False))


def pipeline(kafka: Any, conn: RdsConnection, name: str, table: str, topic: str, mode: str) -> Any:
    source: dict[str, Any] = {"name": name, "type": "rds_source", "connection": "pg", "topic": topic, "table": table,
                              "topic_spec": {"partitions": 1}, "batch_records": 1000}
    if mode == "cdc":
        source["mode"] = "cdc"
    else:
        source.update(mode="timestamp", timestamp_column="updated_at", commit_delay_s=0, poll_interval_s=0.5,
                      reconcile_interval_s=None)
    return pipeline_from_dict({"kafka": {"bootstrap_servers": kafka.bootstrap_servers},
                               "connections": {"pg": {"type": "rds", "url": conn.url,
                                                      "password": conn.password.get_secret_value()}},
                               "sources": [source]})


def run_until_caught_up(p: Any) -> None:
    worker = SourceWorker(p)
    for spec in task_specs(p.sources):
        worker.start(spec, once=True)
    worker.wait(threading.Event())
    for key, stats in worker.stats().items():
        if stats.error:
            raise RuntimeError(f"{key}: {stats.error}")


def records(kconf: dict[str, Any], topic: str, start: int) -> list[Any]:
    """Records of partition 0 from ``start``: (kafka timestamp ms, value or None)."""
    end = end_offsets(kconf, topic).get(0, 0)
    consumer = Consumer({**kconf, "group.id": f"bench-{uuid.uuid4().hex}", "enable.auto.commit": False})
    de = AvroDeserializer(SchemaStore(kconf))
    out: list[Any] = []
    try:
        consumer.assign([TopicPartition(topic, 0, start)])
        while start + len(out) < end:
            for msg in consumer.consume(10_000, timeout=1.0):
                out.append((msg.timestamp()[1], None if msg.value() is None else de(msg.value())))
    finally:
        consumer.close()
    return out


def backlog(engine: Any, table: str, n: int) -> int:
    """``n`` transactions (insert, update, a delete every other one); returns the changes committed."""
    rng = random.Random(1)
    changes = 0
    with engine.connect() as c:
        for i in range(n):
            c.execute(text(f"INSERT INTO {table} (v, payload) VALUES (0, 'bulk')"))
            updated = c.execute(text(f"UPDATE {table} SET v = v + 1, updated_at = now() WHERE id = :id"),
                                {"id": rng.randint(1, ROWS)})
            changes += 1 + updated.rowcount
            if i % 2:
                deleted = c.execute(text(f"DELETE FROM {table} WHERE id = :id"), {"id": rng.randint(1, ROWS)})
                changes += deleted.rowcount
            c.commit()
    return changes


def measure(kafka: Any, conn: RdsConnection, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    engine = sql_engine(conn)
    u = uuid.uuid4().hex[:8]
    table, name, topic = f"bench_cdc_{mode}_{u}", f"bench-cdc-{mode}-{u}", f"bench.cdc.{mode}.{u}"
    kconf = kafka.librdkafka_config()
    with engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, v int NOT NULL, payload text, "
                       "updated_at timestamptz NOT NULL DEFAULT now())"))
        c.execute(text(f"INSERT INTO {table} (v, payload) SELECT 0, md5(g::text) FROM generate_series(1, {ROWS}) g"))
    p = pipeline(kafka, conn, name, table, topic, mode)
    try:
        run_until_caught_up(p)  # the snapshot (and, for cdc, the slot)
        snapshot_end = end_offsets(kconf, topic).get(0, 0)
        committed = backlog(engine, table, args.transactions)
        run_until_caught_up(p)
        got = records(kconf, topic, snapshot_end)
        span_s = max((got[-1][0] - got[0][0]) / 1000, 1e-3) if len(got) > 1 else float("nan")
        rate = len(got) / span_s

        # delay: the source runs while transactions commit at --rate
        worker = SourceWorker(p)
        for spec in task_specs(p.sources):
            worker.start(spec)
        time.sleep(2.0)
        commit_at: dict[str, float] = {}
        arrived: dict[str, float] = {}
        stop = threading.Event()
        start = end_offsets(kconf, topic).get(0, 0)

        def consume() -> None:
            consumer = Consumer({**kconf, "group.id": f"bench-{uuid.uuid4().hex}", "enable.auto.commit": False})
            de = AvroDeserializer(SchemaStore(kconf))
            consumer.assign([TopicPartition(topic, 0, start)])
            try:
                while not stop.is_set():
                    for msg in consumer.consume(1000, timeout=0.1):
                        now = time.time()
                        if msg.value() is not None:
                            token = de(msg.value())["payload"]
                            if token and token.startswith("lat-"):
                                arrived.setdefault(token, now)
            finally:
                consumer.close()

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        total = int(args.rate * args.seconds)
        t0 = time.monotonic()
        with engine.connect() as c:
            for i in range(total):
                token = f"lat-{i}"
                c.execute(text(f"INSERT INTO {table} (v, payload) VALUES (1, :t)"), {"t": token})
                c.commit()
                commit_at[token] = time.time()
                time.sleep(max(0.0, t0 + (i + 1) / args.rate - time.monotonic()))
        deadline = time.monotonic() + 30
        while len(arrived) < total and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        reader.join(10)
        worker.stop()
        delays = sorted(max(0.0, arrived[t] - commit_at[t]) for t in commit_at if t in arrived)
        q = statistics.quantiles(delays, n=100) if len(delays) > 1 else [float("nan")] * 99
        return {
            "mode": mode,
            "backlog_transactions": args.transactions,
            "backlog_changes": committed,
            "records": len(got),
            "changes_per_s": rate,
            "delay_p50_s": q[49],
            "delay_p99_s": q[98],
            "delay_max_s": delays[-1] if delays else float("nan"),
            "delivered": f"{len(delays)}/{total}",
        }
    finally:
        with engine.connect() as c:
            if mode == "cdc":  # a slot retains WAL: drop it once its WAL sender is gone
                for _ in range(50):
                    active = c.execute(text("SELECT active FROM pg_replication_slots WHERE slot_name = :s"),
                                       {"s": default_name(name)}).scalar()
                    if not active:
                        break
                    time.sleep(0.2)
                c.execute(text("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                               "WHERE slot_name = :s"), {"s": default_name(name)})
                c.execute(text(f'DROP PUBLICATION IF EXISTS "{default_name(name)}"'))
            c.execute(text(f"DROP TABLE IF EXISTS {table}"))
            c.commit()
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=3000, help="backlog transactions for the throughput")
    parser.add_argument("--rate", type=float, default=20.0, help="transactions per second during the delay run")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the delay run")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    tune_gc()  # what `threes source run` sets in the source's process
    endpoints = Endpoints.from_env()
    kafka = KafkaConfig(bootstrap_servers=endpoints.kafka_bootstrap)
    atexit.register(BenchTopics(kafka.librdkafka_config()).drop)  # this run's bench.* topics
    conn = database(endpoints.postgres_url)
    results = [measure(kafka, conn, mode, args) for mode in ("cdc", "timestamp")]
    table = Table(title="rds_source: cdc vs polling (timestamp)")
    for col in ("mode", "backlog changes", "records", "changes/s", "delay p50 s", "delay p99 s", "delay max s",
                "delivered"):
        table.add_column(col)
    for r in results:
        table.add_row(r["mode"], str(r["backlog_changes"]), str(r["records"]), f"{r['changes_per_s']:,.0f}",
                      f"{r['delay_p50_s']:.3f}", f"{r['delay_p99_s']:.3f}", f"{r['delay_max_s']:.3f}", r["delivered"])
    Console(width=140).print(table)
    cdc, poll = results
    print(json.dumps({
        "benchmark": "rds_cdc",
        "cdc_changes_per_s": round(cdc["changes_per_s"]),
        "polling_changes_per_s": round(poll["changes_per_s"]),
        "cdc_records": cdc["records"],
        "polling_records": poll["records"],
        "backlog_changes": cdc["backlog_changes"],
        "cdc_delay_p50_s": round(cdc["delay_p50_s"], 3),
        "cdc_delay_p99_s": round(cdc["delay_p99_s"], 3),
        "polling_delay_p50_s": round(poll["delay_p50_s"], 3),
        "polling_delay_p99_s": round(poll["delay_p99_s"], 3),
    }))


if __name__ == "__main__":
    main()
