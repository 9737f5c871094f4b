"""Benchmark of the stream job's join against a GlobalKTable-like snapshot (issue #5).

Run: ``python benchmarks/stream_join.py`` (starts Kafka from the local stack if needed).
Everything is measured in one run on the same machine, against baselines run
side by side on the same events:

1. enriched events/s of the job with a 10k-key and a 1M-key snapshot, against
   (a) the same job without the join and (b) a plain Spark stream-static
   broadcast join whose static side is never refreshed. Loading is outside
   this figure on both sides, the same way: (b) reads and caches its static
   side before its query starts; the job starts its query while its
   snapshot loads (readiness gate: topics read, base broadcast and indexed by
   the Python workers), and the time its first micro-batch waits at the gate
   (``StreamJob.gate_wait_s``) is taken out. Everything after the gate
   counts, first batch included; the figure with the gate is printed beside it,
   and loading is measured on its own in 2 and 4;
2. snapshot bootstrap keys/s at 100k and 1M keys;
3. refresh time of the 1M-key snapshot after 1k updates vs a full reload;
4. restart-to-first-batch time at 1M keys with and without the snapshot checkpoint;
5. p50/p99 event -> enriched latency at a fixed input rate.

Sizes: ``THREES_BENCH_KEYS`` (default 1000000), ``THREES_BENCH_EVENTS`` (500000,
in micro-batches of ``THREES_BENCH_BATCH`` = 50000), ``THREES_BENCH_RATE``
(events/s for the latency run, 2000) and ``THREES_BENCH_LATENCY_S`` (30);
``THREES_BENCH_PARTS`` picks parts (default ``throughput,bootstrap,restart,latency``);
throughput configurations run ``THREES_BENCH_ROUNDS`` (2) times in turn and the best
run of each counts, as the machine is shared.
Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from connectors.config.models import KafkaConfig  # noqa: E402
from connectors.config.stream import SparkSettings, StreamJobConfig  # noqa: E402
from connectors.topics import ensure_compacted_topic  # noqa: E402
from schemas.serde import AvroSerializer, fingerprint, schema_json  # noqa: E402
from schemas.store import SchemaStore  # noqa: E402

KEYS = int(os.environ.get("THREES_BENCH_KEYS", "1000000"))
EVENTS = int(os.environ.get("THREES_BENCH_EVENTS", "500000"))
BATCH = int(os.environ.get("THREES_BENCH_BATCH", "50000"))
RATE = int(os.environ.get("THREES_BENCH_RATE", "2000"))
LATENCY_S = float(os.environ.get("THREES_BENCH_LATENCY_S", "30"))
ROUNDS = int(os.environ.get("THREES_BENCH_ROUNDS", "2"))
SMALL, MEDIUM = 10_000, 100_000
STRIDE = max(1, KEYS // SMALL)  # events reference keys 0, STRIDE, 2*STRIDE...: present in every snapshot

KEY = {
    "type": "record",
    "name": "BenchAirportKey",
    "namespace": "threes.bench",
    "fields": [{"name": "faa", "type": "string"}],
}
VALUE = {
    "type": "record",
    "name": "BenchAirport",
    "namespace": "threes.bench",
    "fields": [
        {"name": "faa", "type": "string"},
        {"name": "name", "type": "string"},
        {"name": "lat", "type": "double"},
        {"name": "lon", "type": "double"},
        {"name": "alt", "type": "int"},
        {"name": "tz", "type": ["null", "int"], "default": None},
    ],
}
EVENT = {
    "type": "record",
    "name": "BenchFlight",
    "namespace": "threes.bench",
    "fields": [
        {"name": "flight_id", "type": "long"},
        {"name": "origin", "type": "string"},
        {"name": "dest", "type": "string"},
        {"name": "dep_delay", "type": ["null", "double"], "default": None},
        {"name": "time_hour", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}

log = logging.getLogger("bench")


def faa(i: Any) -> Any:
    """The key of airport ``i`` (a Spark column expression)."""
    from pyspark.sql import functions as f

    return f.format_string("K%07d", i)


class Bench:
    def __init__(self) -> None:
        from connectors.local import LocalStack
        from stream_app.session import spark_session

        stack = LocalStack()
        stack.up(["kafka", "spark"])
        self.kafka = KafkaConfig(bootstrap_servers=stack.endpoints().kafka_bootstrap)
        self.conf = self.kafka.librdkafka_config()
        self.spark = spark_session(
            SparkSettings(master="local[2]", app_name="threes-bench", driver_memory="4g"), stack.spark_jars()
        )
        self.run_id = uuid.uuid4().hex[:8]
        self.tmp = Path(tempfile.mkdtemp(prefix="threes-bench-"))
        self.store = SchemaStore(self.conf, self.kafka.schema_topic)
        for schema in (KEY, VALUE, EVENT):
            self.store.register(schema)
        (self.tmp / "key.avsc").write_text(json.dumps(KEY))
        (self.tmp / "value.avsc").write_text(json.dumps(VALUE))
        (self.tmp / "event.avsc").write_text(json.dumps(EVENT))
        self.results: dict[str, Any] = {}
        self.rows: list[tuple[str, str, str]] = []

    def topic(self, what: str) -> str:
        return f"bench.{what}.{self.run_id}"

    # -- data, written by Spark (JVM Avro encoding: fast) ---------------------------------------

    def _write(self, df: Any, topic: str) -> None:
        from pyspark.sql import functions as f

        from stream_app.kafka_io import spark_kafka_options
        from stream_app.records import write_records

        write_records(df.withColumn("topic", f.lit(topic)), spark_kafka_options(self.kafka))

    def write_snapshot(self, topic: str, keys: int, start: int = 0, name: str = "airport %d", stride: int = 1) -> None:
        """Write ``keys`` airports with ids ``(start + i) * stride`` (stride: the keys the events reference)."""
        from pyspark.sql import functions as f

        from stream_app.avro import encode_avro

        ensure_compacted_topic(self.conf, topic, partitions=2)
        ids = self.spark.range(start, start + keys, numPartitions=4).select((f.col("id") * stride).alias("id"))
        value = f.struct(
            faa(f.col("id")).alias("faa"),
            f.format_string(name, f.col("id")).alias("name"),
            (f.col("id") % 90).cast("double").alias("lat"),
            (f.col("id") % 180).cast("double").alias("lon"),
            (f.col("id") % 5000).cast("int").alias("alt"),
            f.lit(-5).alias("tz"),
        )
        df = ids.select(
            encode_avro(f.struct(faa(f.col("id")).alias("faa")), schema_json(KEY), fingerprint(KEY)).alias("key"),
            encode_avro(value, schema_json(VALUE), fingerprint(VALUE)).alias("value"),
        )
        self._write(df, topic)

    def write_events(self, topic: str, n: int, partitions: int = 2) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic
        from pyspark.sql import functions as f

        from stream_app.avro import encode_avro

        admin = AdminClient(self.conf)
        for fut in admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
            fut.result(30)
        ids = self.spark.range(0, n, numPartitions=4)
        event = f.struct(
            f.col("id").alias("flight_id"),
            faa((f.col("id") * 7919 % SMALL) * STRIDE).alias("origin"),
            faa((f.col("id") * 104729 % SMALL) * STRIDE).alias("dest"),
            (f.col("id") % 60).cast("double").alias("dep_delay"),
            f.timestamp_seconds(f.lit(1357020000) + f.col("id") % 86400).alias("time_hour"),
        )
        df = ids.select(
            f.col("id").cast("string").cast("binary").alias("key"),
            encode_avro(event, schema_json(EVENT), fingerprint(EVENT)).alias("value"),
        )
        self._write(df, topic)

    # -- jobs --------------------------------------------------------------------------------------

    def config(self, events: str, snapshot_topic: str | None, checkpoint: Path, **extra: Any) -> StreamJobConfig:
        data: dict[str, Any] = {
            "name": f"bench-{uuid.uuid4().hex[:6]}",
            "events": {
                "topic": events,
                "value_schema": "event.avsc",
                "starting_offsets": "earliest",
                "max_offsets_per_trigger": BATCH,
            },
            "enriched_topic": self.topic(f"enriched.{uuid.uuid4().hex[:6]}"),
            "dead_letter_topic": self.topic("dlq"),
            "trigger_interval_s": 1,
            "checkpoint_location": str(checkpoint),
        }
        if snapshot_topic:
            data["snapshots"] = [
                {
                    "name": "airports",
                    "topics": [snapshot_topic],
                    "key_schema": "key.avsc",
                    "value_schema": "value.avsc",
                    **extra,
                }
            ]
            data["lookups"] = [{"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_"}]
        return StreamJobConfig.model_validate(data)

    def job(self, config: StreamJobConfig) -> Any:
        from stream_app.job import StreamJob

        return StreamJob(config, self.kafka, self.spark, base_dir=self.tmp)

    @staticmethod
    def throughput(query: Any, gate_wait_s: float = 0.0) -> dict[str, float]:
        """Events/s over every micro-batch of a finished query (Spark's own progress reports).

        ``gate_wait_s``, the time the job's first micro-batch waited at the
        readiness gate (snapshot loading, measured on its own in parts 2 and
        4), is taken out, as the plain join's static side is loaded before
        its query starts; the figure with it is kept as ``events_per_s_with_gate``.
        """
        progress = [p for p in query.recentProgress if p["numInputRows"]]
        rows = sum(p["numInputRows"] for p in progress)
        gross = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
        seconds = gross - gate_wait_s
        steady = progress[1:] or progress
        steady_s = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
        return {
            "events": rows,
            "batches": len(progress),
            "seconds": seconds,
            "events_per_s": rows / seconds,
            "events_per_s_with_gate": rows / gross,
            "gate_wait_s": gate_wait_s,
            "steady_events_per_s": sum(p["numInputRows"] for p in steady) / steady_s,
            "first_batch_s": progress[0]["durationMs"]["triggerExecution"] / 1000 - gate_wait_s,
        }

    def run_job(self, events: str, snapshot_topic: str | None, **snapshot: Any) -> dict[str, float]:
        job = self.job(self.config(events, snapshot_topic, self.tmp / f"cp-{uuid.uuid4().hex[:6]}", **snapshot))
        job.start(available_now=True)
        job.await_termination()
        stats = self.throughput(job.queries[0], job.gate_wait_s)
        stats["engine"] = job.snapshots["airports"].mode if job.snapshots else "none"
        stats["ready_s"] = sum(r["elapsed_s"] for r in job.readiness.values())
        job.stop(checkpoint=False)
        return stats

    def run_plain_broadcast(self, events: str, snapshot_topic: str) -> dict[str, float]:
        """Spark's own stream-static join: the static side read once, cached, broadcast by every plan."""
        from pyspark.sql import functions as f

        from stream_app.avro import decode_avro, encode_avro
        from stream_app.kafka_io import spark_kafka_options

        options = spark_kafka_options(self.kafka)
        writers = {fingerprint(s): schema_json(s) for s in (KEY, VALUE, EVENT)}
        static_raw = (
            self.spark.read.format("kafka")
            .options(**options)
            .option("subscribe", snapshot_topic)
            .option("startingOffsets", "earliest")
            .load()
        )
        static = (
            static_raw.select("key", "offset", decode_avro(f.col("value"), writers, schema_json(VALUE)).alias("v"))
            .groupBy("key")
            .agg(f.max_by("v", "offset").alias("v"))
            .filter(f.col("v").isNotNull())
            .select("v.*")
        )
        static = static.select(*[f.col(c).alias(f"origin_{c}") for c in static.columns]).cache()
        static.count()
        stream = (
            self.spark.readStream.format("kafka")
            .options(**options)
            .option("subscribe", events)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(BATCH))
            .load()
        )
        decoded = stream.select("key", decode_avro(f.col("value"), writers, schema_json(EVENT)).alias("e"))
        joined = decoded.select("key", "e.*").join(f.broadcast(static), f.col("origin") == f.col("origin_faa"), "left")
        out_schema = [fld["name"] for fld in EVENT["fields"]] + [f"origin_{fld['name']}" for fld in VALUE["fields"]]
        from stream_app.avro_schemas import JoinedFields, enriched_schema

        enriched = enriched_schema(EVENT, [JoinedFields("origin_", VALUE, None, True)])
        value = encode_avro(f.struct(*out_schema), schema_json(enriched), fingerprint(enriched))
        query = (
            joined.select("key", value.alias("value"))
            .writeStream.format("kafka")
            .options(**options)
            .option("topic", self.topic("plain"))
            .option("checkpointLocation", str(self.tmp / f"plain-{uuid.uuid4().hex[:6]}"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        stats = self.throughput(query)
        static.unpersist()
        return stats

    # -- the measurements ------------------------------------------------------------------------

    def throughput_runs(self, events: str, small: str, large: str) -> None:
        """Every configuration, ROUNDS times in turn; the best run of each counts (the machine is shared)."""
        runs = {
            "no_join": lambda: self.run_job(events, None),
            "job_10k": lambda: self.run_job(events, small),
            "job_1m": lambda: self.run_job(events, large),
            "plain_broadcast_10k": lambda: self.run_plain_broadcast(events, small),
            "plain_broadcast_1m": lambda: self.run_plain_broadcast(events, large),
            "job_10k_indexed": lambda: self.run_job(events, small, index_min_rows=0),
        }
        for round_ in range(ROUNDS):
            for name, run in runs.items():
                log.info("throughput run %s round %d", name, round_ + 1)
                stats = run()
                best = self.results.get(name)
                if best is None:
                    self.results[name] = {**stats, "rounds": ROUNDS}
                else:  # best of the rounds, overall and steady state each
                    for key in ("events_per_s", "events_per_s_with_gate", "steady_events_per_s"):
                        best[key] = max(best[key], stats[key])
                    best["first_batch_s"] = min(best["first_batch_s"], stats["first_batch_s"])
        for name in runs:
            r = self.results[name]
            self.rows.append(
                (
                    f"events/s {name}",
                    f"{r['events_per_s']:,.0f}",
                    f"steady {r['steady_events_per_s']:,.0f}/s, {r['batches']} batches, "
                    f"first {r['first_batch_s']:.2f} s, engine {r.get('engine', 'spark')}"
                    + (
                        f", ready in {r['ready_s']:.1f} s (gate {r['gate_wait_s']:.1f} s, "
                        f"{r['events_per_s_with_gate']:,.0f}/s with it)"
                        if r.get("ready_s")
                        else ""
                    ),
                )
            )
        r = self.results
        for key, (a, b) in {
            "ratio_1m_vs_plain": ("job_1m", "plain_broadcast_1m"),
            "ratio_1m_vs_10k": ("job_1m", "job_10k"),
            "ratio_1m_vs_10k_indexed": ("job_1m", "job_10k_indexed"),
        }.items():
            r[key] = r[a]["events_per_s"] / r[b]["events_per_s"]
            r[f"{key}_steady"] = r[a]["steady_events_per_s"] / r[b]["steady_events_per_s"]
        for label, key, note in (
            ("job 1M / plain broadcast 1M", "ratio_1m_vs_plain", "target >= 1.0"),
            ("job 1M / job 10k", "ratio_1m_vs_10k", "target >= 0.7"),
            ("job 1M / job 10k, both indexed", "ratio_1m_vs_10k_indexed", "the index engine alone"),
        ):
            self.rows.append(
                (label, f"{r[key]:.2f}x", f"{note}; steady state (first batch excluded) {r[key + '_steady']:.2f}x")
            )

    def snapshot(self, topic: str, checkpoint: Path | None = None) -> Any:
        from stream_app.checkpoint import CheckpointFs, SnapshotCheckpoint
        from stream_app.kafka_io import TopicWatermarks
        from stream_app.plan import build_plan
        from stream_app.snapshot_base import DeadLetterProducer
        from stream_app.snapshot_runtime import Snapshot
        from stream_app.writers import WriterSchemas

        config = self.config(self.topic("events"), topic, checkpoint or self.tmp / "unused")
        plan = build_plan(config, self.spark, self.tmp)
        snap_plan = plan.snapshots["airports"]
        watermarks = TopicWatermarks(self.kafka)
        cp = SnapshotCheckpoint(CheckpointFs(str(checkpoint)), "airports", snap_plan.schema_id) if checkpoint else None
        return Snapshot(
            self.spark,
            self.kafka,
            snap_plan,
            WriterSchemas(self.kafka, watermarks),
            watermarks,
            cp,
            DeadLetterProducer(self.kafka, self.topic("dlq"), "bench"),
            "bench",
        )

    def bootstrap_and_refresh(self, medium: str, large: str) -> None:
        for label, topic in (("100k", medium), ("1m", large)):
            snap = self.snapshot(topic)
            stats = snap.bootstrap()
            self.results[f"bootstrap_{label}"] = {
                "keys": stats["keys"],
                "seconds": stats["elapsed_s"],
                "keys_per_s": stats["keys"] / stats["elapsed_s"],
            }
            self.rows.append(
                (
                    f"bootstrap {label} keys",
                    f"{stats['keys'] / stats['elapsed_s']:,.0f} keys/s",
                    f"{stats['keys']:,} keys in {stats['elapsed_s']:.1f} s",
                )
            )
            if label == "1m":
                # a job refreshes before every micro-batch: 5 refreshes of 1k updates, the median counts
                refreshes = []
                for i in range(5):
                    self.write_snapshot(large, 1000, start=i * 1000, name=f"update {i} of airport %d")
                    started = time.monotonic()
                    snap.catch_up()
                    snap.view()
                    refreshes.append(time.monotonic() - started)
                refresh = sorted(refreshes)[len(refreshes) // 2]
                started = time.monotonic()
                snap.merge()
                snap.view()
                merge = time.monotonic() - started
                full = self.snapshot(large).bootstrap()["elapsed_s"]
                self.results["refresh_1k_of_1m"] = {
                    "refresh_s": refresh,
                    "refreshes_s": refreshes,
                    "merge_s": merge,
                    "full_reload_s": full,
                    "ratio": refresh / full,
                }
                self.rows.append(
                    (
                        "refresh 1M after 1k updates",
                        f"{refresh:.2f} s",
                        f"median of 5 (first {refreshes[0]:.2f} s); full reload {full:.1f} s: "
                        f"{refresh / full:.1%} (target <= 10%); merging 5k into the base {merge:.2f} s",
                    )
                )
            snap.close(checkpoint=False)

    def restart(self, events: str, large: str) -> None:
        checkpoint = self.tmp / "restart"
        config = self.config(events, large, checkpoint)
        timings = {}
        for phase in ("cold", "with_checkpoint", "without_checkpoint"):
            if phase == "without_checkpoint":
                shutil.rmtree(checkpoint / "snapshots")
            self.write_events_small(events, 200)
            job = self.job(config)
            started = time.monotonic()
            job.start()
            while job.batches < 1:
                time.sleep(0.05)
                failed = [q for q in job.queries if q.exception()]
                if failed:
                    raise RuntimeError(failed[0].exception())
            timings[phase] = time.monotonic() - started
            timings[f"{phase}_bootstrap_s"] = job.readiness["airports"]["elapsed_s"]
            job.stop(checkpoint=phase == "cold")
        self.results["restart_1m"] = {**timings, "ratio": timings["with_checkpoint"] / timings["without_checkpoint"]}
        self.rows.append(
            (
                "restart to first batch, 1M, checkpoint",
                f"{timings['with_checkpoint']:.1f} s",
                f"snapshot ready in {timings['with_checkpoint_bootstrap_s']:.1f} s",
            )
        )
        self.rows.append(
            (
                "restart to first batch, 1M, no checkpoint",
                f"{timings['without_checkpoint']:.1f} s",
                f"snapshot ready in {timings['without_checkpoint_bootstrap_s']:.1f} s; ratio "
                f"{self.results['restart_1m']['ratio']:.2f} (target <= 0.20)",
            )
        )

    def write_events_small(self, topic: str, n: int) -> None:
        from confluent_kafka import Producer

        ser = AvroSerializer(EVENT)
        producer = Producer(self.conf)
        for i in range(n):
            producer.produce(
                topic,
                key=str(i).encode(),
                value=ser(
                    {
                        "flight_id": i,
                        "origin": f"K{(i % SMALL) * STRIDE:07d}",
                        "dest": "K0000000",
                        "dep_delay": 1.0,
                        "time_hour": 0,
                    }
                ),
            )
        producer.flush(30)

    def latency(self, large: str) -> None:
        """p50/p99 of enriched.timestamp - event.timestamp (both CreateTime, this machine's clock)."""
        from confluent_kafka import Consumer, Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        events = self.topic("latency")
        admin = AdminClient(self.conf)
        for fut in admin.create_topics([NewTopic(events, num_partitions=2)]).values():
            fut.result(30)
        config = self.config(events, large, self.tmp / "latency")
        job = self.job(config)
        job.start()
        ser = AvroSerializer(EVENT)
        payloads = [
            ser(
                {
                    "flight_id": i,
                    "origin": f"K{(i % SMALL) * STRIDE:07d}",
                    "dest": "K0000000",
                    "dep_delay": 1.0,
                    "time_hour": 0,
                }
            )
            for i in range(2000)
        ]
        producer = Producer({**self.conf, "linger.ms": 5})
        sent = 0
        started = time.monotonic()
        while time.monotonic() - started < LATENCY_S:
            due = int((time.monotonic() - started) * RATE)
            while sent < due:
                producer.produce(events, key=str(sent).encode(), value=payloads[sent % len(payloads)])
                sent += 1
            producer.poll(0)
            time.sleep(0.005)
        producer.flush(30)
        consumer = Consumer({**self.conf, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
        consumer.subscribe([config.enriched_topic])
        lat: list[float] = []
        deadline = time.monotonic() + 120
        by_key: dict[bytes, int] = {}
        source = Consumer({**self.conf, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
        source.subscribe([events])
        while len(by_key) < sent and time.monotonic() < deadline:
            msg = source.poll(0.5)
            if msg is not None and not msg.error():
                by_key[msg.key()] = msg.timestamp()[1]
        source.close()
        seen = set()
        while len(seen) < sent and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() or msg.key() in seen:
                continue
            seen.add(msg.key())
            lat.append((msg.timestamp()[1] - by_key[msg.key()]) / 1000)
        consumer.close()
        job.stop(checkpoint=False)
        warm = sorted(lat[len(lat) // 10 :])  # the first 10 % include the start-up
        p50, p99 = warm[len(warm) // 2], warm[int(len(warm) * 0.99)]
        self.results["latency_1m"] = {
            "rate_per_s": RATE,
            "events": sent,
            "enriched": len(seen),
            "p50_s": p50,
            "p99_s": p99,
            "trigger_s": config.trigger_interval_s,
        }
        self.rows.append(
            (
                f"latency at {RATE}/s, 1M keys",
                f"p50 {p50:.2f} s",
                f"p99 {p99:.2f} s, trigger 1 s, {len(seen)}/{sent} enriched",
            )
        )

    def main(self, parts: set[str]) -> None:
        small, medium, large = self.topic("snap10k"), self.topic("snap100k"), self.topic("snap1m")
        events = self.topic("events")
        started = time.monotonic()
        self.write_snapshot(small, SMALL, stride=STRIDE)  # exactly the keys the events reference
        if "bootstrap" in parts:
            self.write_snapshot(medium, MEDIUM)
        self.write_snapshot(large, KEYS)
        self.write_events(events, EVENTS)
        log.info("data written in %.1f s", time.monotonic() - started)
        if "throughput" in parts:
            self.throughput_runs(events, small, large)
        if "bootstrap" in parts:
            self.bootstrap_and_refresh(medium, large)
        if "restart" in parts:
            self.restart(self.topic("restart-events"), large)
        if "latency" in parts:
            self.latency(large)
        self.print()

    def print(self) -> None:
        width = max(len(r[0]) for r in self.rows)
        print(f"\nstream_join benchmark: local[2], {EVENTS:,} events in micro-batches of {BATCH:,}, {KEYS:,} keys")
        for name, value, note in self.rows:
            print(f"  {name:<{width}}  {value:>16}  {note}")
        print(
            json.dumps(
                {"benchmark": "stream_join", "keys": KEYS, "events": EVENTS, "batch": BATCH, **self.results},
                default=float,
            )
        )

    def close(self) -> None:
        self.spark.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("THREES_BENCH_LOG", "INFO"), format="%(asctime)s %(name)s %(message)s")
    for noisy in ("py4j", "stream_app.lookup"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    bench = Bench()
    try:
        bench.main(set(os.environ.get("THREES_BENCH_PARTS", "throughput,bootstrap,restart,latency").split(",")))
    finally:
        bench.close()
