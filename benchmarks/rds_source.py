"""RdsSource vs a raw loop: load a PostgreSQL table into Kafka, rows per second, side by side.

Usage::

    python benchmarks/rds_source.py [--rows 1000000] [--rounds 1] [--tasks 2]

Both sides read the same table (``bench_rds_source_<rows>``, created once in the
database ``threes_bench`` with ``generate_series`` and reused by later runs),
encode key and value with the project's Avro serde, and produce with the same
idempotent ``acks=all`` producer from :func:`kernel.kafka.clients.kafka_producer`
to a fresh compacted topic each:

Both sides are timed from before their own setup (topic creation, schema
registration, producer) to the last acknowledgement.

* **baseline**: one psycopg server-side cursor (``itersize`` 10,000), a dict per
  row, the serde, ``produce`` with ``BufferError`` handled, one delivery callback
  counting errors, ``flush`` at the end. No positions, no retries.
* **rds_source**: ``RdsSource`` in ``bulk`` mode run by the worker until caught
  up (``--once``): keyset pages of ``batch_records`` rows, positions tracked per
  batch and written to the offsets topic, metrics; reconciliation off (the
  baseline has none). Pages are read as Arrow (ADBC) and encoded column-wise
  (:mod:`connectors.runtime.columnar`), queued with ``produce_batch``.
* **rds_source_per_record**: the same source with column-wise batches off, one
  dict and one fastavro call per record: what ``rds_source`` did before issue #12,
  measured in the same run for a before/after side by side.

* **rds_source_N_tasks** (``--tasks N``): the same source with ``tasks: N``, each
  task in its own process (what N workers of a ``--group`` do), timed from the
  start of the tasks to the last acknowledgement.

The sides alternate (baseline first) ``--rounds`` times; the best round of each
counts. Prints a table and, last, one JSON line with the rates and ratios.
Target (issue #12): ``rds_source`` >= 100k rows/s and >= 0.8x the baseline.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import threading
import time
import uuid
from typing import Any

from bench_topics import BenchTopics
from rich.console import Console
from rich.table import Table
from sqlalchemy import text
from sqlalchemy.engine import make_url

from connectors.rds.connection import RdsConnection, sql_engine
from connectors.runtime.process import tune_gc
from connectors.runtime.standalone import SourceWorker, task_specs
from kernel.config.models import KafkaConfig
from kernel.kafka import clients
from kernel.kafka.topics import end_offsets, ensure_compacted_topic
from schemas.serde import AvroSerializer
from schemas.store import SchemaStore
from threes.config import pipeline_from_dict
from threes.local.endpoints import Endpoints

DB = "threes_bench"
PAGE = 10_000


def ensure_table(admin_url: str, rows: int) -> tuple[RdsConnection, str]:
    admin = sql_engine(RdsConnection(type="rds", url=admin_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        if not c.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": DB}).first():
            c.execute(text(f'CREATE DATABASE "{DB}"'))
    admin.dispose()
    conn = RdsConnection(type="rds", url=make_url(admin_url).set(database=DB).render_as_string(hide_password=False))
    table = f"bench_rds_source_{rows}"
    engine = sql_engine(conn)
    with engine.begin() as c:
        exists = c.execute(text("SELECT to_regclass(:t) IS NOT NULL"), {"t": table}).scalar_one()
        if not exists:
            t0 = time.perf_counter()
            c.execute(
                text(
                    f"CREATE TABLE {table} (id bigint PRIMARY KEY, name text NOT NULL, amount numeric(12,2) NOT NULL, "
                    "qty integer, flag boolean NOT NULL, updated_at timestamptz NOT NULL)"
                )
            )
            c.execute(
                text(
                    f"INSERT INTO {table} SELECT g, 'customer-' || g, (g % 100000) / 100.0, g % 1000, g % 2 = 0, "
                    "timestamptz '2024-01-01' + g * interval '1 second' FROM generate_series(1, :n) g"
                ),
                {"n": rows},
            )
            c.execute(text(f"ANALYZE {table}"))
            print(f"created {table} ({rows:,} rows) in {time.perf_counter() - t0:.1f} s")
    engine.dispose()
    return conn, table


KEY_SCHEMA = {"type": "record", "name": "bench_key", "fields": [{"name": "id", "type": "long"}]}
VALUE_SCHEMA = {
    "type": "record",
    "name": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "qty", "type": ["null", "int"], "default": None},
        {"name": "flag", "type": "boolean"},
        {"name": "updated_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}


def run_baseline(conn: RdsConnection, table: str, kafka: KafkaConfig, rows: int) -> float:
    import psycopg

    t0 = time.perf_counter()  # like the source's run: its own setup (topic, schemas, producer) counts
    kconf = kafka.librdkafka_config()
    topic = f"bench.baseline.{uuid.uuid4().hex[:8]}"
    ensure_compacted_topic(kconf, topic)
    store = SchemaStore(kconf, kafka.schema_topic)
    key_ser = AvroSerializer(KEY_SCHEMA, store)
    value_ser = AvroSerializer(VALUE_SCHEMA, store)
    producer = clients.kafka_producer(kafka)
    errors: list[Any] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(err)

    url = conn.sqlalchemy_url()
    with psycopg.connect(
        host=url.host, port=url.port, user=url.username, password=url.password, dbname=url.database
    ) as pgc:
        with pgc.cursor(name="bench") as cur:
            cur.itersize = PAGE
            cur.execute(f"SELECT id, name, amount, qty, flag, updated_at FROM {table}")  # fixed name
            names = [d.name for d in cur.description]
            produce = producer.produce
            n = 0
            for row in cur:
                v = dict(zip(names, row, strict=True))
                kb = key_ser({"id": v["id"]})
                vb = value_ser(v)
                try:
                    produce(topic, vb, kb, on_delivery=on_delivery)
                except BufferError:
                    while True:
                        producer.poll(0.05)
                        try:
                            produce(topic, vb, kb, on_delivery=on_delivery)
                            break
                        except BufferError:
                            continue
                n += 1
                if n % PAGE == 0:
                    producer.poll(0)
    producer.flush(120)
    elapsed = time.perf_counter() - t0
    assert not errors, errors[:3]
    assert sum(end_offsets(kconf, topic).values()) == rows
    return elapsed


def _pipeline_doc(
    conn: RdsConnection, table: str, kafka: KafkaConfig, name: str, topic: str, tasks: int
) -> dict[str, Any]:
    return {
        "kafka": kafka.model_dump(mode="json", exclude_none=True),
        "connections": {"pg": {"type": "rds", "url": conn.url, "password": conn.password.get_secret_value()}},
        "sources": [
            {
                "name": name,
                "type": "rds_source",
                "connection": "pg",
                "topic": topic,
                "table": table,
                "mode": "bulk",
                "batch_records": PAGE,
                "reconcile_interval_s": None,
                "tasks": tasks,
                "topic_spec": {"partitions": max(1, tasks)},
            }
        ],
    }


def _run_one_task(doc: dict[str, Any], task_id: int) -> tuple[str, int, str | None]:
    """Child process: run one task of the source until caught up (what a worker of a --group does)."""
    logging.basicConfig(level=logging.WARNING)
    tune_gc()
    pipeline = pipeline_from_dict(doc)
    worker = SourceWorker(pipeline)
    spec = [s for s in task_specs(pipeline.sources) if s.task_id == task_id][0]
    worker.start(spec, once=True)
    worker.wait(threading.Event())
    (stats,) = worker.stats().values()
    return stats.state, stats.acked, stats.error


def run_rds_source_tasks(conn: RdsConnection, table: str, kafka: KafkaConfig, rows: int, tasks: int) -> float:
    """The source split into ``tasks`` tasks, each in its own worker process (processes started before timing)."""
    import multiprocessing as mp

    name = f"bench-{uuid.uuid4().hex[:8]}"
    topic = f"bench.rds_source.{name}"
    doc = _pipeline_doc(conn, table, kafka, name, topic, tasks)
    ensure_compacted_topic(kafka.librdkafka_config(), topic, partitions=tasks)
    ctx = mp.get_context("spawn")
    with ctx.Pool(tasks) as pool:
        pool.map(abs, range(tasks))  # warm the worker processes (imports) outside the timing
        t0 = time.perf_counter()
        results = pool.starmap(_run_one_task, [(doc, i) for i in range(tasks)])
        elapsed = time.perf_counter() - t0
    assert all(state == "caught_up" for state, _, _ in results), results
    assert sum(acked for _, acked, _ in results) == rows, results
    assert sum(end_offsets(kafka.librdkafka_config(), topic).values()) == rows
    return elapsed


def run_rds_source_per_record(conn: RdsConnection, table: str, kafka: KafkaConfig, rows: int) -> float:
    """``rds_source`` with column-wise batches off (one dict and one fastavro call per record), for comparison."""
    from connectors.rds.source import RdsSource

    columnar = RdsSource._columnar_schema
    RdsSource._columnar_schema = lambda self: None  # type: ignore[method-assign]
    try:
        return run_rds_source(conn, table, kafka, rows)
    finally:
        RdsSource._columnar_schema = columnar  # type: ignore[method-assign]


def run_rds_source(conn: RdsConnection, table: str, kafka: KafkaConfig, rows: int) -> float:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    topic = f"bench.rds_source.{name}"
    pipeline = pipeline_from_dict(_pipeline_doc(conn, table, kafka, name, topic, 1))
    t0 = time.perf_counter()
    worker = SourceWorker(pipeline)
    for spec in task_specs(pipeline.sources):
        worker.start(spec, once=True)
    worker.wait(threading.Event())
    elapsed = time.perf_counter() - t0
    (stats,) = worker.stats().values()
    assert stats.state == "caught_up", stats.error
    assert stats.acked == rows, stats
    assert sum(end_offsets(kafka.librdkafka_config(), topic).values()) == rows
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--tasks", type=int, default=1, help="also run the source split into this many tasks, one worker process each"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    tune_gc()  # what `threes source run` sets in the source's process
    endpoints = Endpoints.from_env()
    kafka = KafkaConfig(bootstrap_servers=endpoints.kafka_bootstrap)
    atexit.register(BenchTopics(kafka.librdkafka_config()).drop)  # this run's bench.* topics
    conn, table = ensure_table(endpoints.postgres_url, args.rows)

    results: dict[str, list[float]] = {"baseline": [], "rds_source_per_record": [], "rds_source": []}
    tasks_side = f"rds_source_{args.tasks}_tasks"
    if args.tasks > 1:
        results[tasks_side] = []
    for _ in range(args.rounds):
        results["baseline"].append(run_baseline(conn, table, kafka, args.rows))
        results["rds_source_per_record"].append(run_rds_source_per_record(conn, table, kafka, args.rows))
        results["rds_source"].append(run_rds_source(conn, table, kafka, args.rows))
        if args.tasks > 1:
            results[tasks_side].append(run_rds_source_tasks(conn, table, kafka, args.rows, args.tasks))

    best = {k: min(v) for k, v in results.items()}
    rate = {k: args.rows / s for k, s in best.items()}
    ratio = rate["rds_source"] / rate["baseline"]
    out = Table(title=f"PostgreSQL table -> Kafka, {args.rows:,} rows, best of {args.rounds}")
    out.add_column("side")
    out.add_column("seconds", justify="right")
    out.add_column("rows/s", justify="right")
    out.add_column("all rounds (s)")
    for side in results:
        out.add_row(side, f"{best[side]:.2f}", f"{rate[side]:,.0f}", ", ".join(f"{s:.2f}" for s in results[side]))
    Console().print(out)
    print(
        f"ratio rds_source/baseline = {ratio:.3f} (target >= 0.8); rds_source {rate['rds_source']:,.0f} rows/s "
        "(target >= 100,000)"
    )
    print(
        f"rds_source {rate['rds_source'] / rate['rds_source_per_record']:.2f} x the per-record path "
        f"({rate['rds_source_per_record']:,.0f} rows/s) in the same run"
    )
    summary = {
        "benchmark": "rds_source",
        "rows": args.rows,
        "rounds": args.rounds,
        "baseline_rows_per_s": round(rate["baseline"]),
        "rds_source_rows_per_s": round(rate["rds_source"]),
        "ratio": round(ratio, 3),
        "rds_source_per_record_rows_per_s": round(rate["rds_source_per_record"]),
        "speedup_vs_per_record": round(rate["rds_source"] / rate["rds_source_per_record"], 2),
    }
    if args.tasks > 1:
        summary.update(
            {
                "tasks": args.tasks,
                "rds_source_tasks_rows_per_s": round(rate[tasks_side]),
                "tasks_ratio": round(rate[tasks_side] / rate["baseline"], 3),
            }
        )
        print(
            f"{args.tasks} tasks in {args.tasks} processes: {rate[tasks_side]:,.0f} rows/s, "
            f"{rate[tasks_side] / rate['baseline']:.2f} x the one-loop baseline"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
