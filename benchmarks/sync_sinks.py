"""Sync sinks against raw client baselines, side by side in one run, on the same data.

    python benchmarks/sync_sinks.py [--records 50000] [--rounds 3]

Sinks are driven as the sync service drives them: batches of 10k records of 4
partitions written concurrently up to the adaptive concurrency limit (the
figure the targets apply to); the one-partition figure (one batch at a time) is
printed below it.

* Elasticsearch: docs/s of ``ElasticsearchSink.write`` (external versions,
  newest-per-key, per-item results, adaptive concurrency up to 4) vs
  ``elasticsearch.helpers.parallel_bulk`` (4 threads, 500 per chunk) of the same docs.
* PostgreSQL: rows/s of ``RdsSink.write`` (conditional upsert) vs raw psycopg:
  ``COPY`` into a temp table then ``INSERT ... SELECT ... ON CONFLICT DO UPDATE``,
  same rows, same 10k-row transactions.
* S3: MB/s of ``S3Sink.write`` (JSON Lines encoding + upload) vs boto3
  ``upload_fileobj`` of the same bytes.
* S3 Parquet (``--only s3pq``): records/s of ``S3Sink.write`` on records shaped
  like the demo's (the 51-field enriched flight), in small objects (~150 rows,
  67 ``dt=`` folders per batch) and large ones (25k rows), vs the sink as it
  was before (types inferred per object, objects uploaded one after another
  with ``upload_fileobj``), side by side in the same run.
* Memory: peak RSS of a sync service process (real consumer, batching,
  backpressure) whose sink is throttled to a tenth of the input rate, vs its
  configured ``buffer_max_bytes``.

Rounds alternate baseline and sink; the median of each is reported. Prints a
table, then one JSON line with every figure and ratio. Targets: every ratio
>= 0.9; peak RSS <= buffer bound + 150 MB. Needs the local stack (``threes local up``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fastavro

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from connectors import clients  # noqa: E402
from connectors.config.models import (  # noqa: E402
    ElasticsearchConnection,
    KafkaConfig,
    RdsConnection,
    S3Connection,
)
from connectors.local import Endpoints  # noqa: E402
from connectors.runtime.sink import SinkBatch, SinkRecord  # noqa: E402
from schemas.serde import fingerprint  # noqa: E402
from sync_service.concurrency import AdaptiveConcurrency  # noqa: E402

SCHEMA = {
    "type": "record", "name": "Flight", "namespace": "bench",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "carrier", "type": "string"},
        {"name": "flight", "type": "int"},
        {"name": "origin", "type": "string"},
        {"name": "dest", "type": "string"},
        {"name": "dep_delay", "type": ["null", "double"], "default": None},
        {"name": "arr_delay", "type": ["null", "double"], "default": None},
        {"name": "distance", "type": "int"},
        {"name": "tailnum", "type": ["null", "string"], "default": None},
        {"name": "time_hour", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}
PARSED = fastavro.parse_schema(SCHEMA)
FP = fingerprint(SCHEMA)
BATCH = 10_000
PARTITIONS = 4  # update-topic partitions: the service writes their batches concurrently
T0 = datetime(2013, 1, 1, tzinfo=UTC)


def row(i: int) -> dict[str, Any]:
    return {
        "id": i, "carrier": ("UA", "AA", "B6", "DL", "EV")[i % 5], "flight": 100 + i % 4000,
        "origin": ("JFK", "LGA", "EWR")[i % 3], "dest": f"D{i % 97:02d}",
        "dep_delay": float(i % 60 - 10), "arr_delay": None if i % 11 == 0 else float(i % 80 - 20),
        "distance": 200 + i % 2500, "tailnum": f"N{i % 3322:04d}", "time_hour": T0 + timedelta(hours=i % 8760),
    }


def batches(n: int, version: int) -> list[SinkBatch]:
    out = []
    for start in range(0, n, BATCH):
        recs = [SinkRecord("bench", 0, i, i, row(i), version, timestamp_ms=0, size_bytes=200,
                           value_schema=PARSED, value_fingerprint=FP) for i in range(start, min(n, start + BATCH))]
        out.append(SinkBatch("bench", len(out) % PARTITIONS, recs[0].offset, recs[-1].offset, recs))
    return out


def drive(sink: Any, data: list[SinkBatch], partitions: int) -> None:
    """Write batches the way the sync service does.

    ``partitions=1``: one partition, one batch at a time. Otherwise batches of
    ``partitions`` partitions in flight at once, up to the sink's adaptive
    concurrency limit, each write holding a limiter slot unless the sink splits
    its own requests (``sync_service.service`` + ``sync_service.writer``).
    """
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    def write_one(b: SinkBatch) -> None:
        if sink.splits_requests:
            assert sink.write(b) == []
        else:
            with sink.limiter.slot(len(b.records)):
                assert sink.write(b) == []

    if partitions == 1:
        for b in data:
            write_one(b)
        return
    with ThreadPoolExecutor(max_workers=partitions) as pool:
        pending: set[Any] = set()
        for b in data:
            while len(pending) >= min(partitions, sink.limiter.limit):
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    f.result()
            pending.add(pool.submit(write_one, b))
        for f in pending:
            f.result()


def timed(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# -- Elasticsearch ------------------------------------------------------------------------------

def bench_es(conn: ElasticsearchConnection, n: int, rounds: int) -> dict[str, float]:
    from elasticsearch import helpers

    from connectors.elasticsearch.config import ElasticsearchSinkConfig
    from connectors.elasticsearch.sink import ElasticsearchSink

    es = clients.elasticsearch_client(conn)
    docs = [row(i) for i in range(n)]
    base_rates, sink_rates, seq_rates = [], [], []
    for r in range(rounds):
        index = f"bench-base-{uuid.uuid4().hex[:8]}"

        def baseline(index: str = index) -> None:
            actions = ({"_index": index, "_id": str(d["id"]), "_source": d} for d in docs)
            for ok, info in helpers.parallel_bulk(es, actions, thread_count=4, chunk_size=500):
                assert ok, info

        base_rates.append(n / timed(baseline))
        es.indices.delete(index=index)
        index = f"bench-sink-{uuid.uuid4().hex[:8]}"
        cfg = ElasticsearchSinkConfig(name="bench-es", type="elasticsearch_sink", connection="es", topics=["bench"],
                                      index=index, max_concurrency=4)
        sink = ElasticsearchSink(cfg, conn, limiter=AdaptiveConcurrency("bench-es", 4))
        sink.open()
        data = batches(n, r + 1)
        sink_rates.append(n / timed(lambda sink=sink, data=data: drive(sink, data, PARTITIONS)))
        es.indices.refresh(index=index)
        assert es.count(index=index)["count"] == n
        sink.close()
        es.indices.delete(index=index)
        sink = ElasticsearchSink(cfg.model_copy(update={"index": index + "-seq"}), conn,
                                 limiter=AdaptiveConcurrency("bench-es", 4))
        sink.open()
        seq_rates.append(n / timed(lambda sink=sink, data=data: drive(sink, data, 1)))
        sink.close()
        es.indices.delete(index=index + "-seq")
    es.close()
    return {"es_baseline_docs_s": statistics.median(base_rates), "es_sink_docs_s": statistics.median(sink_rates),
            "es_sink_one_partition_docs_s": statistics.median(seq_rates)}


# -- PostgreSQL ---------------------------------------------------------------------------------

def bench_pg(conn: RdsConnection, n: int, rounds: int) -> dict[str, float]:
    import psycopg
    from psycopg import sql
    from sqlalchemy import MetaData, Table

    from connectors.rds.config import RdsSinkConfig
    from connectors.rds.sink import RdsSink
    from connectors.rds.sink_types import table_from_avro

    engine = clients.sql_engine(conn)
    dsn = conn.sqlalchemy_url().set(drivername="postgresql").render_as_string(hide_password=False)
    rows = [row(i) for i in range(n)]
    cols = [f["name"] for f in SCHEMA["fields"]] + ["_version"]
    base_rates, sink_rates, seq_rates = [], [], []
    for r in range(rounds):
        name = f"bench_base_{uuid.uuid4().hex[:8]}"
        table_from_avro(name, SCHEMA, ["id"], "_version").create(engine)

        def baseline(name: str = name, version: int = r + 1) -> None:
            with psycopg.connect(dsn) as pgc:
                for start in range(0, n, BATCH):
                    with pgc.transaction(), pgc.cursor() as cur:
                        cur.execute(sql.SQL("CREATE TEMP TABLE IF NOT EXISTS stage (LIKE {} INCLUDING DEFAULTS) "
                                            "ON COMMIT DELETE ROWS").format(sql.Identifier(name)))
                        with cur.copy(sql.SQL("COPY stage ({}) FROM STDIN").format(
                                sql.SQL(", ").join(map(sql.Identifier, cols)))) as copy:
                            for d in rows[start:start + BATCH]:
                                copy.write_row([*d.values(), version])
                        sets = sql.SQL(", ").join(
                            sql.SQL("{} = EXCLUDED.{}").format(sql.Identifier(c), sql.Identifier(c))
                            for c in cols if c != "id")
                        cur.execute(sql.SQL("INSERT INTO {t} ({c}) SELECT {c} FROM stage ON CONFLICT (id) DO UPDATE "
                                            "SET {s}").format(t=sql.Identifier(name),
                                                              c=sql.SQL(", ").join(map(sql.Identifier, cols)), s=sets))

        base_rates.append(n / timed(baseline))
        Table(name, MetaData()).drop(engine)
        name = f"bench_sink_{uuid.uuid4().hex[:8]}"
        cfg = RdsSinkConfig(name="bench-pg", type="rds_sink", connection="pg", topics=["bench"], table=name,
                            key=["id"], create_table=True)
        sink = RdsSink(cfg, conn, limiter=AdaptiveConcurrency("bench-pg", cfg.max_concurrency))
        sink.open()
        data = batches(n, r + 1)
        sink.write(SinkBatch("bench", 0, 0, 0, data[0].records[:1]))  # create the table outside the timing
        sink_rates.append(n / timed(lambda sink=sink, data=data: drive(sink, data, PARTITIONS)))
        sink.close()
        Table(name, MetaData()).drop(engine)
        sink = RdsSink(cfg.model_copy(update={"table": name + "_seq"}), conn,
                       limiter=AdaptiveConcurrency("bench-pg", cfg.max_concurrency))
        sink.open()
        sink.write(SinkBatch("bench", 0, 0, 0, data[0].records[:1]))
        seq_rates.append(n / timed(lambda sink=sink, data=data: drive(sink, data, 1)))
        sink.close()
        Table(name + "_seq", MetaData()).drop(engine)
    engine.dispose()
    return {"pg_baseline_rows_s": statistics.median(base_rates), "pg_sink_rows_s": statistics.median(sink_rates),
            "pg_sink_one_partition_rows_s": statistics.median(seq_rates)}


# -- S3 -----------------------------------------------------------------------------------------

def bench_s3(conn: S3Connection, n: int, rounds: int) -> dict[str, float]:
    from connectors.s3.config import S3SinkConfig
    from connectors.s3.sink import S3Sink, encode_jsonl

    s3 = clients.s3_client(conn)
    bucket = f"bench-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    base_rates, sink_rates, seq_rates = [], [], []
    for r in range(rounds):
        data = batches(n, r + 1)
        bodies = [encode_jsonl(b.records) for b in data]
        total_mb = sum(len(b) for b in bodies) / 1e6

        def baseline(r: int = r, bodies: list[bytes] = bodies) -> None:
            for i, body in enumerate(bodies):
                s3.upload_fileobj(io.BytesIO(body), bucket, f"base/{r}/{i}.jsonl")

        base_rates.append(total_mb / timed(baseline))
        cfg = S3SinkConfig(
            name="bench-s3",
            type="s3_sink",
            connection="s3",
            topics=["bench"],
            bucket=bucket,
            prefix=f"sink/{r}/",
            format="jsonl",
        )
        sink = S3Sink(cfg, conn, limiter=AdaptiveConcurrency("bench-s3", cfg.max_concurrency))
        sink.open()
        sink_rates.append(total_mb / timed(lambda sink=sink, data=data: drive(sink, data, PARTITIONS)))
        seq_rates.append(total_mb / timed(lambda sink=sink, data=data: drive(sink, data, 1)))
        sink.close()
    _empty_bucket(s3, bucket)
    return {
        "s3_baseline_mb_s": statistics.median(base_rates),
        "s3_sink_mb_s": statistics.median(sink_rates),
        "s3_sink_one_partition_mb_s": statistics.median(seq_rates),
    }


def _empty_bucket(s3: Any, bucket: str) -> None:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for o in page.get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=o["Key"])
    s3.delete_bucket(Bucket=bucket)


# -- S3 Parquet: the demo's records, the sink before and after explicit schemas + concurrent uploads --------

ENRICHED = json.loads((ROOT / "schemas" / "nycflights13" / "enriched_flight.avsc").read_text())


def enriched_row(i: int) -> dict[str, Any]:
    """A value of the demo's enriched-flight schema (51 fields): deterministic, ~1 in 7 nullable fields null."""
    out: dict[str, Any] = {}
    for j, f in enumerate(ENRICHED["fields"]):
        typ = f["type"]
        nullable = isinstance(typ, list)
        base = typ[1] if nullable else typ
        if nullable and (i * 31 + j * 17) % 7 == 0:
            out[f["name"]] = None
        elif isinstance(base, dict):  # time_hour, timestamp-micros
            out[f["name"]] = T0 + timedelta(hours=i % 8760)
        elif base == "int":
            out[f["name"]] = (i * 7 + j) % 2400
        elif base == "double":
            out[f["name"]] = ((i * 13 + j) % 1000) / 7.0
        else:
            out[f["name"]] = ("UA", "AA", "JFK", "LGA", "America/New_York", "Boeing 737-800")[(i + j) % 6]
    return out


def enriched_batches(n: int, per_object: int, objects_per_batch: int) -> list[SinkBatch]:
    """Batches of ``per_object * objects_per_batch`` records, ``per_object`` consecutive ones per ``dt`` day."""
    parsed = fastavro.parse_schema(ENRICHED)
    fp = fingerprint(ENRICHED)
    size = per_object * objects_per_batch
    out = []
    for start in range(0, n, size):
        recs = []
        for i in range(start, min(n, start + size)):
            value = enriched_row(i)
            value["time_hour"] = T0 + timedelta(days=i // per_object % 365, hours=i % 24)
            recs.append(
                SinkRecord(
                    "bench",
                    len(out) % PARTITIONS,
                    i,
                    i,
                    value,
                    1,
                    timestamp_ms=0,
                    size_bytes=600,
                    value_schema=parsed,
                    value_fingerprint=fp,
                )
            )
        out.append(SinkBatch("bench", len(out) % PARTITIONS, recs[0].offset, recs[-1].offset, recs))
    return out


def previous_s3_sink() -> type:
    """``S3Sink`` as it was before (reference for the Parquet figures): types inferred per object, dictionary
    encoding always, and one object after another through ``upload_fileobj`` (a TransferManager and thread
    pool per object)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from connectors.s3.formats import _arrow_safe, envelope
    from connectors.s3.sink import S3Sink

    def encode_parquet_inferred(records: list[SinkRecord]) -> bytes:
        rows = [envelope(r) for r in records]
        for row in rows:
            if row["value"] is not None:
                row["value"] = _arrow_safe(row["value"])
        out = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), out, compression="zstd")
        return out.getvalue()

    class PreviousS3Sink(S3Sink):
        def write(self, batch: SinkBatch) -> list[Any]:
            for obj in self.objects(batch):
                body = encode_parquet_inferred(obj.records)
                self.client.upload_fileobj(io.BytesIO(body), self.config.bucket, obj.key, Config=self._transfer)
            return []

    return PreviousS3Sink


def bench_s3_parquet(conn: S3Connection, n: int, rounds: int) -> dict[str, float]:
    """Records/s of the Parquet sink, before vs after, on small (~150-row) and large (~25k-row) objects."""
    from connectors.s3.config import S3SinkConfig
    from connectors.s3.sink import S3Sink

    s3 = clients.s3_client(conn)
    bucket = f"bench-pq-{uuid.uuid4().hex[:8]}"
    s3.create_bucket(Bucket=bucket)
    before = previous_s3_sink()
    figures: dict[str, float] = {}
    for label, per_object, per_batch in (("small", 150, 67), ("large", 25_000, 1)):
        data = enriched_batches(max(n, per_object * per_batch), per_object, per_batch)
        total = sum(len(b.records) for b in data)
        rates: dict[str, list[float]] = {"before": [], "after": []}
        for r in range(rounds):
            for name, cls in (("before", before), ("after", S3Sink)):
                cfg = S3SinkConfig(
                    name=f"bench-pq-{name}",
                    type="s3_sink",
                    connection="s3",
                    topics=["bench"],
                    bucket=bucket,
                    prefix=f"{label}/{name}/{r}/",
                    format="parquet",
                    partition_by="time_hour",
                )
                sink = cls(cfg, conn, limiter=AdaptiveConcurrency("bench-pq", cfg.max_concurrency))
                sink.open()
                rates[name].append(total / timed(lambda sink=sink, data=data: drive(sink, data, PARTITIONS)))
                sink.close()
        figures[f"s3_parquet_{label}_before_rec_s"] = statistics.median(rates["before"])
        figures[f"s3_parquet_{label}_after_rec_s"] = statistics.median(rates["after"])
        figures[f"s3_parquet_{label}_ratio"] = (
            figures[f"s3_parquet_{label}_after_rec_s"] / figures[f"s3_parquet_{label}_before_rec_s"]
        )
        figures[f"s3_parquet_{label}_objects"] = sum(len(S3Sink.objects(sink, b)) for b in data)
    _empty_bucket(s3, bucket)
    return figures


# -- memory under a throttled sink --------------------------------------------------------------

def rss_child(bootstrap: str, topic: str, bound: int, rate: float, seconds: float) -> None:
    """Run a sync service whose sink applies ``rate`` records/s, for ``seconds``; print peak RSS as JSON."""
    import threading

    from connectors.config import pipeline_from_dict
    from connectors.runtime.sink import RecordFailure, Sink
    from sync_service.service import SyncService

    class ThrottledSink(Sink):
        """Writes nowhere, at ``rate`` records per second: a slow target."""

        def write(self, batch: SinkBatch) -> list[RecordFailure]:
            time.sleep(len(batch.records) / rate)
            return []

    p = pipeline_from_dict({
        "kafka": {"bootstrap_servers": bootstrap},
        "connections": {"pg": {"type": "rds", "url": "sqlite://"}},
        "sync": [{"name": f"rss-{topic}", "dead_letter_topic": f"{topic}.dlq", "buffer_max_bytes": bound,
                  "batch": {"max_records": 2_000, "max_age_ms": 500},
                  "sinks": [{"name": "slow", "type": "rds_sink", "connection": "pg", "topics": [topic],
                             "table": "unused", "key": ["id"], "max_concurrency": 2}]}],
    })
    cfg = p.sync[0]
    sink = ThrottledSink(cfg.sinks[0], None)
    service = SyncService(p.kafka, cfg, dict(p.connections), sinks=[sink])
    stop = threading.Event()
    peak_buffered = 0
    paused_max = 0
    def current_rss() -> int:
        # not ru_maxrss: on Linux it keeps the parent's high-water mark across fork and exec
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    service.open()
    idle_rss_mb = current_rss() / 2**20
    thread = threading.Thread(target=service.run, args=(stop,))
    thread.start()
    end = time.monotonic() + seconds
    peak_rss = 0
    while time.monotonic() < end:
        peak_rss = max(peak_rss, current_rss())
        peak_buffered = max(peak_buffered, int(service.metrics.value("threes_sync_buffered_bytes")))
        paused_max = max(paused_max, int(service.metrics.value("threes_sync_paused_partitions")))
        time.sleep(0.1)
    applied = service.metrics.value("threes_sync_records_out_total", sink="slow")
    stop.set()
    thread.join(120)
    print(json.dumps({"peak_rss_mb": peak_rss / 2**20, "idle_rss_mb": idle_rss_mb,
                      "peak_buffered_mb": peak_buffered / 1e6, "paused_partitions_max": paused_max,
                      "applied": applied}))


def bench_rss(kafka: KafkaConfig, bound: int, input_rate: float, seconds: float) -> dict[str, float]:
    from confluent_kafka.admin import AdminClient, NewTopic

    from connectors.updates import encode_version
    from schemas.serde import AvroSerializer
    from schemas.store import SchemaStore

    topic = f"bench.rss.{uuid.uuid4().hex[:8]}"
    conf = kafka.librdkafka_config()
    admin = AdminClient(conf)  # keep a reference until the result is in: a collected client cancels it
    admin.create_topics([NewTopic(topic, num_partitions=4, replication_factor=1)])[topic].result(30)
    store = SchemaStore(conf, kafka.schema_topic)
    key_ser, value_ser = AvroSerializer("long", store), AvroSerializer(SCHEMA, store)
    producer = clients.kafka_producer(kafka, linger_ms=50)
    child = subprocess.Popen(
        [sys.executable, __file__, "--rss-child", kafka.bootstrap_servers, topic, str(bound),
         str(input_rate / 10), str(seconds)], stdout=subprocess.PIPE, text=True,
    )
    start, sent = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        due = int((time.monotonic() - start) * input_rate)
        while sent < due:
            try:
                producer.produce(topic, key=key_ser(sent), value=value_ser(row(sent)),
                                 headers=[("version", encode_version(1))])
                sent += 1
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
        time.sleep(0.01)
    producer.flush(30)
    out, _ = child.communicate(timeout=300)
    result = json.loads(out.strip().splitlines()[-1])
    return {"rss_input_records": sent, "rss_input_mb": sent * 250 / 1e6, "rss_bound_mb": bound / 1e6,
            "rss_peak_mb": result["peak_rss_mb"], "rss_peak_buffered_mb": result["peak_buffered_mb"],
            "rss_idle_mb": result["idle_rss_mb"],
            "rss_paused_partitions_max": result["paused_partitions_max"], "rss_applied": result["applied"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bound-mb", type=int, default=64)
    parser.add_argument("--input-rate", type=float, default=20_000, help="records/s produced during the RSS run")
    parser.add_argument("--rss-seconds", type=float, default=30)
    parser.add_argument("--only", choices=["es", "pg", "s3", "s3pq", "rss"], action="append")
    parser.add_argument("--rss-child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rss_child:
        b, topic, bound, rate, seconds = args.rss_child
        rss_child(b, topic, int(bound), float(rate), float(seconds))
        return
    ep = Endpoints.from_env()
    kafka = KafkaConfig(bootstrap_servers=ep.kafka_bootstrap)
    only = set(args.only or ["es", "pg", "s3", "s3pq", "rss"])
    figures: dict[str, Any] = {"records": args.records, "rounds": args.rounds}
    if "es" in only:
        figures |= bench_es(ElasticsearchConnection(type="elasticsearch", hosts=[ep.elasticsearch_url]),
                            args.records, args.rounds)
        figures["es_ratio"] = figures["es_sink_docs_s"] / figures["es_baseline_docs_s"]
    if "pg" in only:
        figures |= bench_pg(RdsConnection(type="rds", url=ep.postgres_url), args.records, args.rounds)
        figures["pg_ratio"] = figures["pg_sink_rows_s"] / figures["pg_baseline_rows_s"]
    if "s3" in only:
        figures |= bench_s3(S3Connection(type="s3", endpoint_url=ep.s3_endpoint_url, region=ep.s3_region,
                                         access_key_id=ep.s3_access_key_id,
                                         secret_access_key=ep.s3_secret_access_key, path_style=True),
                            args.records, args.rounds)
        figures["s3_ratio"] = figures["s3_sink_mb_s"] / figures["s3_baseline_mb_s"]
    if "s3pq" in only:
        figures |= bench_s3_parquet(S3Connection(type="s3", endpoint_url=ep.s3_endpoint_url, region=ep.s3_region,
                                                 access_key_id=ep.s3_access_key_id,
                                                 secret_access_key=ep.s3_secret_access_key, path_style=True),
                                    args.records, args.rounds)
    if "rss" in only:
        figures |= bench_rss(kafka, args.bound_mb * 1024 * 1024, args.input_rate, args.rss_seconds)
        figures["rss_headroom_mb"] = figures["rss_bound_mb"] + 150 - figures["rss_peak_mb"]
    rows = [
        ("Elasticsearch docs/s", "es_baseline_docs_s", "es_sink_docs_s", "es_ratio", ">= 0.9"),
        ("PostgreSQL rows/s", "pg_baseline_rows_s", "pg_sink_rows_s", "pg_ratio", ">= 0.9"),
        ("S3 MB/s", "s3_baseline_mb_s", "s3_sink_mb_s", "s3_ratio", ">= 0.9"),
    ]
    print(f"{'measure':<24}{'baseline':>14}{'sink':>14}{'ratio':>9}  target")
    for label, base, ours, ratio, target in rows:
        if ratio in figures:
            print(f"{label:<24}{figures[base]:>14,.1f}{figures[ours]:>14,.1f}{figures[ratio]:>9.2f}  {target}")
            seq = ours.replace("_sink_", "_sink_one_partition_")
            print(f"{'  (one partition)':<24}{'':>14}{figures[seq]:>14,.1f}{figures[seq] / figures[base]:>9.2f}")
    for label in ("small", "large"):
        if f"s3_parquet_{label}_ratio" in figures:
            print(f"{'S3 Parquet ' + label + ' rec/s':<24}{figures[f's3_parquet_{label}_before_rec_s']:>14,.1f}"
                  f"{figures[f's3_parquet_{label}_after_rec_s']:>14,.1f}{figures[f's3_parquet_{label}_ratio']:>9.2f}"
                  f"  after vs before ({figures[f's3_parquet_{label}_objects']:.0f} objects)")
    if "rss_peak_mb" in figures:
        print(f"{'peak RSS MB (throttled)':<24}{figures['rss_bound_mb'] + 150:>14,.1f}{figures['rss_peak_mb']:>14,.1f}"
              f"{'':>9}  <= bound + 150 MB (bound {figures['rss_bound_mb']:.0f} MB, "
              f"peak buffered {figures['rss_peak_buffered_mb']:.1f} MB)")
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in figures.items()}))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
