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
5. p50/p99 event -> enriched latency at a fixed input rate (``THREES_BENCH_RATE``) and
   at a fixed 20k events/s (``latency_p99_s_20k``, target p99 <= 2 s), both against the
   ``THREES_BENCH_KEYS``-key snapshot, the events referencing 10k of its keys
   (the labels say so);
6. **Kafka Streams side by side** (part ``kstreams``), on the SAME topics, at 10k and
   1M keys (``THREES_BENCH_KS_KEYS``, default ``10000,1000000``) with
   ``THREES_BENCH_KS_EVENTS`` events (default 2,000,000: the E of the reference's own
   figures, ``RESULTS.md``; a longer run also weighs each side's JIT warm-up as a job
   that runs for hours does). The Kafka Streams GlobalKTable
   reference application (``../shared/anchors/kstreams-ref``, built when its jar is
   missing into ``.threes/kstreams-ref`` with its own Maven command; never copied
   here) loads its topics with its own loader (``ref.Main load``: a compacted
   reference topic keyed by plain UTF-8 strings, values Avro single-object
   ``bench.Ref``; an events topic of ``bench.Event`` {eid, fk, amount, ts}; 2
   partitions each; new topic names per run). The job reads those topics as they
   are: its snapshot has ``key_format: string`` (the option users of existing Kafka
   Streams topics need), the lookup is ``on: {fk: key}``, and the reference's
   writer schemas (the same JSON as ``Schemas.java``; their CRC-64-AVRO
   fingerprints are checked against bytes 2..10 of a loaded record) are
   registered in threes' schema topic. Then, one after the other:

   a. Kafka Streams: ``ref.Main app`` with a fresh application id and
      ``--expect=E`` (exits once E events were joined), 2 stream threads,
      at-least-once, heap ``THREES_BENCH_KS_HEAP`` (-Xms2g -Xmx2g as in its
      run.sh). Measured the anchor's way: its ``ref.Main measure`` on its output
      topic (created by the loader with ``message.timestamp.type=LogAppendTime``):
      (count - 1) / (last - first broker append time), with its correctness
      checks (distinct eids, dups, misses, wrong joins). It runs
      ``THREES_BENCH_KS_ROUNDS`` times (default 2), alternating with the job's runs
      (a: Kafka Streams, b: the job cold, a again, c: the job warm), each with a new
      application id and output topic; its figure is the **median** of its runs (all
      printed), since one run of either side varies by tens of percent here;
   b. the threes job (local[2], micro-batches of ``THREES_BENCH_BATCH``,
      ``availableNow``) writing its own enriched topic, created beforehand with
      LogAppendTime and 2 partitions. Measured the same way, by this script
      (the anchor's ``measure`` decodes only its own ``bench.Enriched`` schema):
      (count - 1) / (last - first append time) on the job's output topic, with
      the same checks (values decoded through threes' schema topic, a consumed chunk
      of one writer schema in columns by ``schemas.columnar``). Spark's own
      progress figure (gate left out, as in part 1) is printed beside it.
      Its snapshot engine is the config's default (broadcast below 100k keys);
      ``THREES_BENCH_KS_BROADCAST_MAX_ROWS=0`` makes it partitioned at every size,
      ``THREES_BENCH_KS_INDEX_MIN_ROWS`` the opt-in indexed engine.

   Loading is excluded on both sides: the topics are written before either
   starts, and each side's figure starts at its first output record, so the
   Kafka Streams global store restore and the job's snapshot bootstrap
   (readiness gate) are outside it (both are printed). Note the first
   output record of the job is appended at the end of its first micro-batch,
   so the span leaves that batch's processing out (as it leaves out Kafka
   Streams' first poll/process); the p10..p90 append-time rate is printed too.
   ``ratio_vs_kafka_streams_10k`` / ``_1m`` = job events/s / Kafka Streams
   events/s, both by append time (targets >= 0.8 and >= 1.0).
   c. the threes job once more on the same topics, in the same (now warm) driver
      JVM, into another output topic (``THREES_BENCH_KS_WARM=0`` skips it):
      ``ratio_vs_kafka_streams_10k_warm`` / ``_1m_warm``. On a 2-core machine the
      first run's JIT compilation alone takes ~17 CPU s of the driver JVM for 500k
      events; a job runs for days, Kafka Streams gets no such second run (its JVM
      warms up faster: it runs far less code per record), so this ratio favours
      the job and is printed beside the cold one, never instead of it.

Sizes: ``THREES_BENCH_KEYS`` (default 1000000), ``THREES_BENCH_EVENTS`` (500000,
in micro-batches of ``THREES_BENCH_BATCH`` = 50000), ``THREES_BENCH_RATE``
(events/s for the latency run, 2000) and ``THREES_BENCH_LATENCY_S`` (30);
``THREES_BENCH_DRIVER_JAVA_OPTIONS`` gives the driver's JVM flags
(``spark.driver.extraJavaOptions``; none by default). ``THREES_BENCH_PARTS`` picks parts (default: all of
``throughput,bootstrap,restart,latency,latency20k,kstreams,scale``, so one run prints every key
the issues name; ``latency20k`` is the 20k events/s latency run; ``scale`` the 10M-key run of
``benchmarks/snapshot_scale.py`` on the standalone cluster: ``ratio_10m_vs_10k``,
``driver_peak_rss_mb_10m``, ``bootstrap_10m_keys_per_s``, ``ratio_restart_vs_bootstrap_10m``);
throughput configurations run ``THREES_BENCH_ROUNDS`` (2) times in turn and the best
run of each counts, as the machine is shared.
Prints a table, then one JSON line with every figure.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_topics import BenchTopics  # noqa: E402

from kernel.config.models import KafkaConfig  # noqa: E402
from kernel.kafka.topics import ensure_compacted_topic  # noqa: E402
from schemas.serde import AvroSerializer, fingerprint, schema_json  # noqa: E402
from schemas.store import SchemaStore  # noqa: E402
from stream_app.config import StreamJobConfig  # noqa: E402
from stream_app.spark_settings import SparkSettings  # noqa: E402

KEYS = int(os.environ.get("THREES_BENCH_KEYS", "1000000"))
EVENTS = int(os.environ.get("THREES_BENCH_EVENTS", "500000"))
BATCH = int(os.environ.get("THREES_BENCH_BATCH", "50000"))
RATE = int(os.environ.get("THREES_BENCH_RATE", "2000"))
LATENCY_S = float(os.environ.get("THREES_BENCH_LATENCY_S", "30"))
ROUNDS = int(os.environ.get("THREES_BENCH_ROUNDS", "2"))
# part 1's configurations to run, comma-separated (no_join, job_10k, job_1m, plain_broadcast_10k,
# plain_broadcast_1m, job_10k_indexed); empty: all of them
THROUGHPUT_RUNS = {n for n in os.environ.get("THREES_BENCH_THROUGHPUT_RUNS", "").split(",") if n}
SMALL, MEDIUM = 10_000, 100_000
KS_EVENTS = int(os.environ.get("THREES_BENCH_KS_EVENTS", "2000000"))  # the anchor's E (its RESULTS.md)
KS_KEYS = [int(n) for n in os.environ.get("THREES_BENCH_KS_KEYS", "10000,1000000").split(",")]
KS_HEAP = os.environ.get("THREES_BENCH_KS_HEAP", "-Xms2g -Xmx2g").split()
# the job's snapshot engine in the side by side: unset = the config's default (broadcast below 100k keys)
KS_INDEX_MIN_ROWS = os.environ.get("THREES_BENCH_KS_INDEX_MIN_ROWS")
# or the snapshot's broadcast_max_rows (0: the partitioned engine at every size)
KS_BROADCAST_MAX_ROWS = os.environ.get("THREES_BENCH_KS_BROADCAST_MAX_ROWS")
KS_WARM = os.environ.get("THREES_BENCH_KS_WARM", "1") != "0"
KS_ROUNDS = max(1, int(os.environ.get("THREES_BENCH_KS_ROUNDS", "2")))
# the driver's own JVM flags (spark.driver.extraJavaOptions), for side-by-side runs of JVM settings
DRIVER_JAVA_OPTIONS = os.environ.get("THREES_BENCH_DRIVER_JAVA_OPTIONS", "")
KS_ANCHOR = Path(os.environ.get("THREES_KSTREAMS_REF", str(ROOT.parent / "shared" / "anchors" / "kstreams-ref")))
KS_DIR = ROOT / ".threes" / "kstreams-ref"
LATENCY_20K = 20_000
LOOKUP = ROOT / "stream_app" / "jars" / "threes-lookup.jar"
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

# the Kafka Streams reference's schemas: the same JSON as its Schemas.java (SchemaBuilder, required fields)
KS_REF = {
    "type": "record",
    "name": "Ref",
    "namespace": "bench",
    "fields": [
        {"name": "name", "type": "string"},
        {"name": "category", "type": "string"},
        {"name": "score", "type": "double"},
        {"name": "updated_ms", "type": "long"},
    ],
}
KS_EVENT = {
    "type": "record",
    "name": "Event",
    "namespace": "bench",
    "fields": [
        {"name": "eid", "type": "long"},
        {"name": "fk", "type": "string"},
        {"name": "amount", "type": "double"},
        {"name": "ts", "type": "long"},
    ],
}


def ks_enriched(name: str = "Enriched", namespace: str = "bench") -> dict[str, Any]:
    """The enriched record of the Kafka Streams reference (``Schemas.ENRICHED``): the event's fields, then
    each reference field as ``ref_<field>``, optional (a union with null first, default null).

    A peer that writes the same columns under its own record name (Flink's ``avro`` format) passes it.
    """
    refs = [{"name": f"ref_{fld['name']}", "type": ["null", fld["type"]], "default": None} for fld in KS_REF["fields"]]
    return {"type": "record", "name": name, "namespace": namespace, "fields": [*KS_EVENT["fields"], *refs]}


log = logging.getLogger("bench")


def ks_ref_name(i: int) -> str:
    """The name the reference's loader gives key ``k<i>`` (``Load.refName``)."""
    return f"customer-{i:010d}-abcdefghijklmnopqrst"


def ks_ref_category(i: int) -> str:
    """The category the reference's loader gives key ``k<i>`` (``Load.refCategory``)."""
    return f"segment-{i % 997:03d}"


def append_rates(stamps: list[int]) -> dict[str, float]:
    """Records/s of an output topic from its records' broker append times (ms; sorted here, in place).

    ``span_s``: first to last append; ``rate_eps``: (count - 1) / span, as the Kafka Streams reference's
    ``Measure.java``; ``p10_p90_rate_eps``: the same between the 10th and the 90th percentile record
    (start-up and tail left out), 0 with 100 records or fewer.
    """
    count = len(stamps)
    stamps.sort()
    span = (stamps[-1] - stamps[0]) / 1000 if count else 0.0
    mid = 0.0
    if count > 100:
        i10, i90 = int(count * 0.1), int(count * 0.9)
        mid_span = (stamps[i90] - stamps[i10]) / 1000
        mid = (i90 - i10) / mid_span if mid_span > 0 else 0.0
    return {"span_s": span, "rate_eps": (count - 1) / span if span > 0 else 0.0, "p10_p90_rate_eps": mid}


ENRICHED_FIELDS = ("eid", "fk", "ref_name", "ref_category", "ref_score")  # what a check reads of an output value


def value_rows(values: list[bytes], des: Any, columnar: Any, names: tuple[str, ...]) -> Iterator[tuple[Any, ...]]:
    """The fields ``names`` of single-object Avro values, a tuple per value (``None`` for a field a writer lacks).

    A chunk of one writer schema is decoded in columns (``schemas.columnar``: 2M records in seconds), record by
    record otherwise (``des``, an ``AvroDeserializer``); the rows come grouped by writer schema.
    """
    by_schema: dict[bytes, list[bytes]] = {}
    for v in values:
        by_schema.setdefault(v[2:10], []).append(v)
    for fp, group in by_schema.items():
        if columnar.supports(fp):
            t = columnar.decode(fp, [v[10:] for v in group])
            cols = [t.column(n).to_pylist() if n in t.column_names else [None] * t.num_rows for n in names]
            yield from zip(*cols, strict=True)
        else:
            for d in map(des, group):
                yield tuple(d.get(n) for n in names)


def parse_results(text: str) -> dict[str, dict[str, Any]]:
    """``RESULT <kind> k=v ...`` lines of the reference's tools, by kind (numbers as floats)."""
    out: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if not line.startswith("RESULT "):
            continue
        kind, *pairs = line.split()[1:]
        values: dict[str, Any] = {}
        for pair in pairs:
            if "=" not in pair:
                continue
            k, v = pair.split("=", 1)
            try:
                values[k] = float(v)
            except ValueError:
                values[k] = v
        out[kind] = values
    return out


def faa(i: Any) -> Any:
    """The key of airport ``i`` (a Spark column expression)."""
    from pyspark.sql import functions as f

    return f.format_string("K%07d", i)


def _write(kafka: KafkaConfig, df: Any, topic: str) -> None:
    from pyspark.sql import functions as f

    from stream_app.records import write_records
    from stream_app.spark_kafka_options import spark_kafka_options

    write_records(df.withColumn("topic", f.lit(topic)), spark_kafka_options(kafka))


def write_snapshot_topic(
    spark: Any, kafka: KafkaConfig, topic: str, keys: int, start: int = 0, name: str = "airport %d", stride: int = 1
) -> None:
    """Write ``keys`` airports with ids ``(start + i) * stride`` (stride: the keys the events reference)."""
    from pyspark.sql import functions as f

    from stream_app.avro import encode_avro

    ensure_compacted_topic(kafka.librdkafka_config(), topic, partitions=2)
    ids = spark.range(start, start + keys, numPartitions=4).select((f.col("id") * stride).alias("id"))
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
    _write(kafka, df, topic)


def write_events_topic(
    spark: Any, kafka: KafkaConfig, topic: str, n: int, partitions: int = 2, stride: int = STRIDE
) -> None:
    """Write ``n`` flights whose origin and destination are among keys ``0, stride, 2 * stride...`` (10k of them)."""
    from confluent_kafka.admin import AdminClient, NewTopic
    from pyspark.sql import functions as f

    from stream_app.avro import encode_avro

    admin = AdminClient(kafka.librdkafka_config())
    for fut in admin.create_topics([NewTopic(topic, num_partitions=partitions)]).values():
        fut.result(30)
    ids = spark.range(0, n, numPartitions=4)
    event = f.struct(
        f.col("id").alias("flight_id"),
        faa((f.col("id") * 7919 % SMALL) * stride).alias("origin"),
        faa((f.col("id") * 104729 % SMALL) * stride).alias("dest"),
        (f.col("id") % 60).cast("double").alias("dep_delay"),
        f.timestamp_seconds(f.lit(1357020000) + f.col("id") % 86400).alias("time_hour"),
    )
    df = ids.select(
        f.col("id").cast("string").cast("binary").alias("key"),
        encode_avro(event, schema_json(EVENT), fingerprint(EVENT)).alias("value"),
    )
    _write(kafka, df, topic)


class Bench:
    def __init__(self) -> None:
        from stream_app.session import spark_session
        from threes.local import LocalStack

        stack = LocalStack()
        # the standalone cluster only for part scale (its 10M keys run there)
        scale = "scale" in os.environ.get("THREES_BENCH_PARTS", DEFAULT_PARTS).split(",")
        stack.up(["kafka", *(["spark"] if scale else [])])
        self.kafka = KafkaConfig(bootstrap_servers=stack.endpoints().kafka_bootstrap)
        self.conf = self.kafka.librdkafka_config()
        self.topics = BenchTopics(self.conf)
        self.spark = spark_session(
            SparkSettings(
                master="local[2]",
                app_name="threes-bench",
                driver_memory="4g",
                conf={"spark.driver.extraJavaOptions": DRIVER_JAVA_OPTIONS} if DRIVER_JAVA_OPTIONS else {},
            ),
            stack.spark_jars(),
            # real-time mode's JVM lookups (parts latency_rt*), when `make jvm` built them
            extra_jars=[LOOKUP] if LOOKUP.is_file() else None,
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

    def write_snapshot(self, topic: str, keys: int, start: int = 0, name: str = "airport %d", stride: int = 1) -> None:
        """Write ``keys`` airports with ids ``(start + i) * stride`` (stride: the keys the events reference)."""
        write_snapshot_topic(self.spark, self.kafka, topic, keys, start, name, stride)

    def write_events(self, topic: str, n: int, partitions: int = 2) -> None:
        write_events_topic(self.spark, self.kafka, topic, n, partitions)

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
            # where a steady micro-batch's time goes (Spark's phases: latestOffset, walCommit, addBatch = the
            # job's foreachBatch, commitOffsets, ...), median ms
            "steady_duration_ms": {
                phase: statistics.median(p["durationMs"].get(phase, 0) for p in steady)
                for phase in steady[0]["durationMs"]
            },
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
        from stream_app.spark_kafka_options import spark_kafka_options

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
        if THROUGHPUT_RUNS:  # a subset, by name (THREES_BENCH_THROUGHPUT_RUNS)
            runs = {name: run for name, run in runs.items() if name in THROUGHPUT_RUNS}
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
        ratios = {
            "ratio_1m_vs_plain": ("job_1m", "plain_broadcast_1m"),
            "ratio_1m_vs_10k": ("job_1m", "job_10k"),
            "ratio_1m_vs_10k_indexed": ("job_1m", "job_10k_indexed"),
        }
        for key, (a, b) in ratios.items():
            if a in r and b in r:  # both configurations ran (THREES_BENCH_THROUGHPUT_RUNS)
                r[key] = r[a]["events_per_s"] / r[b]["events_per_s"]
                r[f"{key}_steady"] = r[a]["steady_events_per_s"] / r[b]["steady_events_per_s"]
        for label, key, note in (
            ("job 1M / plain broadcast 1M", "ratio_1m_vs_plain", "target >= 1.0"),
            ("job 1M / job 10k", "ratio_1m_vs_10k", "target >= 0.7"),
            ("job 1M / job 10k, both indexed", "ratio_1m_vs_10k_indexed", "the index engine alone"),
        ):
            if key not in r:
                continue
            self.rows.append(
                (label, f"{r[key]:.2f}x", f"{note}; steady state (first batch excluded) {r[key + '_steady']:.2f}x")
            )

    def snapshot(self, topic: str, checkpoint: Path | None = None) -> Any:
        from stream_app.checkpoint import SnapshotCheckpoint
        from stream_app.checkpoint_fs import CheckpointFs
        from stream_app.kafka_io import TopicWatermarks
        from stream_app.plan import build_plan
        from stream_app.snapshot.engines import DeadLetterProducer
        from stream_app.snapshot.runtime import Snapshot
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

    def latency(self, large: str, rate: int, mode: str = "microbatch") -> None:
        """p50/p99 of enriched.timestamp - event.timestamp (both CreateTime, this machine's clock).

        The job joins the ``KEYS``-key snapshot ``large``; the events reference
        ``SMALL`` of its keys (every ``STRIDE``-th). The label names both. ``mode``
        ``realtime`` runs the same job in Spark's real-time mode (``stream.mode: realtime``,
        checkpoint interval 30 s, lookups in the executors' JVM stores; parts ``latency_rt5k``,
        ``latency_rt20k``), beside micro-batch mode at the same rates (``latency5k``, ``latency20k``).
        """
        from confluent_kafka import Consumer, Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        events = self.topic(f"latency.{mode}.{rate}")
        admin = AdminClient(self.conf)
        for fut in admin.create_topics([NewTopic(events, num_partitions=2)]).values():
            fut.result(30)
        config = self.config(events, large, self.tmp / f"latency-{mode}-{rate}")
        if mode == "realtime":
            config = realtime_config(config)
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
            due = int((time.monotonic() - started) * rate)
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
        name = "latency" if rate == RATE else f"latency_{rate // 1000}k"
        if mode == "realtime":
            name = f"latency_realtime_{rate // 1000}k"
            self.results[f"latency_p50_ms_realtime_{rate // 1000}k"] = round(p50 * 1000, 1)
            self.results[f"latency_p99_ms_realtime_{rate // 1000}k"] = round(p99 * 1000, 1)
        elif rate != RATE:
            self.results[f"latency_p50_ms_microbatch_{rate // 1000}k"] = round(p50 * 1000, 1)
            self.results[f"latency_p99_ms_microbatch_{rate // 1000}k"] = round(p99 * 1000, 1)
        self.results[name] = {
            "mode": mode,
            "snapshot_keys": KEYS,
            "keys_referenced": SMALL,
            "rate_per_s": rate,
            "events": sent,
            "enriched": len(seen),
            "p50_s": p50,
            "p99_s": p99,
            "trigger_s": config.trigger_interval_s,
        }
        if rate == LATENCY_20K and mode == "microbatch":
            self.results["latency_p99_s_20k"] = p99
        realtime = mode == "realtime"
        target = " (target <= 100 ms)" if realtime and rate == LATENCY_20K else ""
        target = " (target <= 2 s)" if not realtime and rate == LATENCY_20K else target
        self.rows.append(
            (
                f"latency {mode} at {rate:,}/s, snapshot of {KEYS:,} keys ({SMALL:,} referenced)",
                f"p50 {p50 * 1000:.0f} ms",
                f"p99 {p99 * 1000:.0f} ms{target}, {'checkpoint 30 s' if realtime else 'trigger 1 s'}, "
                f"{len(seen)}/{sent} enriched",
            )
        )

    def freshness(self, large: str, rate: int = 5_000, changes: int = 30) -> None:
        """Real-time mode: a reference change -> the first event joined with it, p50/p99 (part ``freshness``).

        The job runs over the ``KEYS``-key snapshot ``large`` with events at ``rate``/s (as in
        :meth:`latency`) plus a probe event every 2 ms whose key is ``K0000000``; once a second that
        key's name changes (``changes`` times, after 5 s of warm-up). A change's freshness is the
        append time of the first enriched event carrying the new name minus the change's own
        CreateTime (one clock, this machine's); the probes bound it to 2 ms of resolution.
        """
        from confluent_kafka import Consumer, Producer

        from schemas.serde import AvroDeserializer

        events = self.topic("freshness")
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient(self.conf)  # held: a collected client fails its futures (_DESTROY)
        for fut in admin.create_topics([NewTopic(events, num_partitions=2)]).values():
            fut.result(30)
        config = realtime_config(self.config(events, large, self.tmp / "freshness"))
        job = self.job(config)
        job.start()
        key_ser, value_ser, event_ser = AvroSerializer(KEY, self.store), AvroSerializer(VALUE, self.store), \
            AvroSerializer(EVENT)
        producer = Producer({**self.conf, "linger.ms": 0})
        written: dict[str, int] = {}
        probe = {"flight_id": 0, "origin": "K0000000", "dest": "K0000000", "dep_delay": 1.0, "time_hour": 0}
        sent = probes = changed = 0
        started = time.monotonic()
        next_change = started + 5
        while changed < changes:
            now = time.monotonic()
            while sent < int((now - started) * rate):
                origin = f"K{(sent % SMALL) * STRIDE:07d}"
                producer.produce(events, value=event_ser({**probe, "flight_id": sent, "origin": origin}))
                sent += 1
            while probes < int((now - started) * 500):
                producer.produce(events, value=event_ser({**probe, "flight_id": 10**12 + probes}))
                probes += 1
            if now >= next_change:
                name = f"fresh-{self.run_id}-{changed}"
                producer.produce(
                    large, key=key_ser({"faa": "K0000000"}),
                    value=value_ser({"faa": "K0000000", "name": name, "lat": 0.0, "lon": 0.0, "alt": 0, "tz": -5}),
                    on_delivery=lambda err, msg, name=name: written.__setitem__(name, msg.timestamp()[1]),
                )
                changed += 1
                next_change += 1.0
            producer.poll(0)
            time.sleep(0.001)
        producer.flush(30)
        des = AvroDeserializer(self.store)
        consumer = Consumer({**self.conf, "group.id": uuid.uuid4().hex, "auto.offset.reset": "earliest"})
        consumer.subscribe([config.enriched_topic])
        first: dict[str, int] = {}
        marker = f"fresh-{self.run_id}-".encode()
        deadline = time.monotonic() + 120
        while len(first) < len(written) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None or msg.error() or marker not in (msg.value() or b""):
                continue
            name = des(msg.value())["origin_name"]
            first[name] = min(first.get(name, msg.timestamp()[1]), msg.timestamp()[1])
        consumer.close()
        job.stop(checkpoint=False)
        fresh = sorted(first[n] - written[n] for n in written if n in first)
        p50, p99 = fresh[len(fresh) // 2], fresh[min(len(fresh) - 1, int(len(fresh) * 0.99))]
        self.results["freshness_realtime"] = {"changes": len(written), "seen": len(fresh), "rate_per_s": rate,
                                              "p50_ms": p50, "p99_ms": p99, "max_ms": fresh[-1]}
        self.results["freshness_p50_ms_realtime"], self.results["freshness_p99_ms_realtime"] = p50, p99
        self.rows.append((
            f"freshness realtime at {rate:,}/s: reference change -> first event joined with it",
            f"p50 {p50} ms", f"p99 {p99} ms, max {fresh[-1]} ms, {len(fresh)}/{len(written)} changes seen",
        ))

    # -- Kafka Streams side by side (part 6) --------------------------------------------------------

    def ks_classpath(self) -> str:
        """The reference's classpath; builds it into .threes/kstreams-ref with its own Maven command when missing."""
        target = KS_DIR / "target"
        jar = target / "kstreams-ref-1.0.jar"
        if not jar.exists():
            log.info("building the Kafka Streams reference from %s into %s", KS_ANCHOR, target)
            subprocess.run(
                ["mvn", "-B", "-q", "package", "-DskipTests", f"-Dref.build.dir={target}"], cwd=KS_ANCHOR, check=True
            )
        return f"{jar}:{target}/lib/*"

    def ks_run(self, name: str, tool: str, *args: str) -> dict[str, dict[str, Any]]:
        """Run one tool of the reference (``ref.Main <tool>``) on the local stack's broker; its RESULT lines."""
        logs = KS_DIR / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        cmd = [
            "java",
            *KS_HEAP,
            f"-Dlog4j2.configurationFile={KS_ANCHOR / 'conf' / 'log4j2-app.properties'}",
            f"-Dref.log.file={logs / f'{self.run_id}-{name}.log'}",
            "-cp",
            self.ks_classpath(),
            "ref.Main",
            tool,
            *args,
            f"--bootstrap={self.kafka.bootstrap_servers}",
        ]
        started = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        (logs / f"{self.run_id}-{name}.out").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"kstreams-ref {tool} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
        results = parse_results(proc.stdout)
        log.info("kstreams-ref %s done in %.1f s: %s", tool, time.monotonic() - started, results)
        return results

    def ks_check_fingerprints(self, ref_topic: str, events_topic: str) -> None:
        """The loaded records' fingerprints (bytes 2..10) are threes' ``fingerprint()`` of KS_REF / KS_EVENT."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({**self.conf, "group.id": uuid.uuid4().hex, "enable.auto.commit": False})
        try:
            for topic, schema in ((ref_topic, KS_REF), (events_topic, KS_EVENT)):
                consumer.assign([TopicPartition(topic, 0, 0)])
                msg = None
                deadline = time.monotonic() + 30
                while (msg is None or msg.error()) and time.monotonic() < deadline:
                    msg = consumer.poll(1)
                if msg is None or msg.error():
                    raise RuntimeError(f"{topic}: no record to check the fingerprint of")
                if msg.value()[2:10] != fingerprint(schema):
                    raise RuntimeError(
                        f"{topic}: record fingerprint {msg.value()[2:10].hex()} != threes' "
                        f"{fingerprint(schema).hex()} of {schema['namespace']}.{schema['name']}"
                    )
        finally:
            consumer.close()

    def measure_output(self, topic: str, keys: int) -> dict[str, Any]:
        """The anchor's ``measure``, for the job's output: rate by broker append time, and its checks.

        ``rate_eps`` = (count - 1) / (last - first append time); ``p10_p90_rate_eps``
        = records between the 10th and 90th percentile of append time / that span
        (as ``Measure.java``); dups, misses and wrong joins as it counts them.
        """
        from confluent_kafka import Consumer, TopicPartition

        from schemas.columnar import ColumnarDecoder
        from schemas.serde import AvroDeserializer

        des, columnar = AvroDeserializer(self.store), ColumnarDecoder(self.store)
        consumer = Consumer({**self.conf, "group.id": uuid.uuid4().hex, "enable.auto.commit": False})
        parts = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in parts}
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        stamps: list[int] = []
        ts_types: set[int] = set()
        seen: set[int] = set()
        dups = misses = wrong = 0
        positions = dict.fromkeys(parts, 0)
        deadline = time.monotonic() + 600

        while any(positions[p] < ends[p] for p in parts) and time.monotonic() < deadline:
            values: list[bytes] = []
            for msg in consumer.consume(10000, 1.0):
                if msg.error():
                    continue
                positions[msg.partition()] = msg.offset() + 1
                ts_type, ts = msg.timestamp()
                ts_types.add(ts_type)
                stamps.append(ts)
                values.append(msg.value())
            for eid, fk, name, category, score in value_rows(values, des, columnar, ENRICHED_FIELDS):
                if eid in seen:
                    dups += 1
                seen.add(eid)
                misses += name is None
                idx = int(fk[1:])
                ok = (
                    name == ks_ref_name(idx) and category == ks_ref_category(idx)
                    if idx < keys
                    else name is None and score is None
                )
                wrong += not ok
        consumer.close()
        from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

        return {
            "count": len(stamps),
            "distinct_eids": len(seen),
            "dups": dups,
            "misses": misses,
            "wrong_joins": wrong,
            "log_append_time": ts_types == {TIMESTAMP_LOG_APPEND_TIME},
            **append_rates(stamps),
        }

    def ks_output_topic(self, what: str) -> str:
        """A new output topic as the reference's loader makes its own: 2 partitions, broker append time."""
        from confluent_kafka.admin import AdminClient, NewTopic

        out = self.topic(what)
        admin = AdminClient(self.conf)
        new = NewTopic(out, num_partitions=2, config={"message.timestamp.type": "LogAppendTime"})
        for fut in admin.create_topics([new]).values():
            fut.result(30)
        return out

    def ks_threes_job(self, ref_topic: str, events_topic: str, keys: int, run: str = "") -> dict[str, Any]:
        """The threes job on the reference's topics (string-key snapshot), measured on its own output topic."""
        out = self.ks_output_topic(f"ks.threes.enriched.{keys}{run}")
        (self.tmp / "ks_ref.avsc").write_text(json.dumps(KS_REF))
        (self.tmp / "ks_event.avsc").write_text(json.dumps(KS_EVENT))
        config = StreamJobConfig.model_validate(
            {
                "name": f"bench-ks-{uuid.uuid4().hex[:6]}",
                "events": {
                    "topic": events_topic,
                    "value_schema": "ks_event.avsc",
                    "starting_offsets": "earliest",
                    "max_offsets_per_trigger": BATCH,
                },
                "snapshots": [
                    {
                        "name": "refs",
                        "topics": [ref_topic],
                        "key_format": "string",
                        "key_field": "key",
                        "value_schema": "ks_ref.avsc",
                        # the opt-in Python-worker index, up to 2M keys (the engine default before 100k/partitioned)
                        **(
                            {"index_min_rows": int(KS_INDEX_MIN_ROWS), "broadcast_max_rows": 2_000_000}
                            if KS_INDEX_MIN_ROWS
                            else {"broadcast_max_rows": int(KS_BROADCAST_MAX_ROWS)}
                            if KS_BROADCAST_MAX_ROWS
                            else {}
                        ),
                    }
                ],
                "lookups": [{"snapshot": "refs", "on": {"fk": "key"}, "prefix": "ref_"}],
                "enriched_topic": out,
                "dead_letter_topic": self.topic("ks.dlq"),
                "trigger_interval_s": 1,
                "checkpoint_location": str(self.tmp / f"cp-ks-{uuid.uuid4().hex[:6]}"),
            }
        )
        job = self.job(config)
        job.start(available_now=True)
        job.await_termination()
        stats = self.throughput(job.queries[0], job.gate_wait_s)
        stats["engine"] = job.snapshots["refs"].mode
        stats["ready_s"] = sum(r["elapsed_s"] for r in job.readiness.values())
        stats["snapshot_keys"] = job.snapshots["refs"].base_rows
        job.stop(checkpoint=False)
        return {"spark": stats, "measure": self.measure_output(out, keys)}

    def ks_app_run(
        self, label: str, i: int, ref_topic: str, events_topic: str, out: str, keys: int
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Run ``i`` of the reference app (a new application id) into ``out``: its app and measure RESULTs."""
        app = self.ks_run(
            f"app-{label}-r{i}",
            "app",
            f"--app-id=threes-bench-{self.run_id}-{label}-r{i}",
            f"--state-dir={self.tmp / f'ks-state-{i}'}",
            f"--expect={KS_EVENTS}",
            f"--ref-topic={ref_topic}",
            f"--events-topic={events_topic}",
            f"--out-topic={out}",
        )
        measured = self.ks_run(
            f"measure-{label}-r{i}", "measure", f"--topic={out}", f"--n={keys}", "--isolation=read_uncommitted"
        )["measure"]
        return app, measured

    def kafka_streams(self) -> None:
        """Kafka Streams and the job side by side on the same topics (see the module docstring, part 6)."""
        for schema in (KS_REF, KS_EVENT):
            self.store.register(schema)
        for keys in KS_KEYS:
            label = f"{keys // 1_000_000}m" if keys >= 1_000_000 and keys % 1_000_000 == 0 else f"{keys // 1000}k"
            ref_topic, events_topic = self.topic(f"ks.ref.{label}"), self.topic(f"ks.events.{label}")
            ks_out = self.topic(f"ks.enriched.{label}")
            topics = [f"--ref-topic={ref_topic}", f"--events-topic={events_topic}", f"--out-topic={ks_out}"]
            loaded = self.ks_run(f"load-{label}", "load", f"--n={keys}", f"--e={KS_EVENTS}", *topics)["load"]
            self.ks_check_fingerprints(ref_topic, events_topic)
            time.sleep(5)  # let the broker settle after the bulk load (as the reference's run.sh does)
            # Kafka Streams runs KS_ROUNDS times, alternating with the job's runs (a new application id and
            # output topic each); its figure is the median of its runs, so one slow or fast run on this shared
            # machine does not make the ratio
            ks_runs = [self.ks_app_run(label, 0, ref_topic, events_topic, ks_out, keys)]
            threes = self.ks_threes_job(ref_topic, events_topic, keys)
            warm = None
            for i in range(1, max(KS_ROUNDS, 2)):  # the warm run follows Kafka Streams' second run, if any
                if i < KS_ROUNDS:
                    out = self.ks_output_topic(f"ks.enriched.{label}.r{i}")
                    ks_runs.append(self.ks_app_run(label, i, ref_topic, events_topic, out, keys))
                if i == 1 and KS_WARM:
                    warm = self.ks_threes_job(ref_topic, events_topic, keys, run=".warm")
            app = ks_runs[0][0]
            ks = {
                "rate_eps": statistics.median(m["rate_eps"] for _a, m in ks_runs),
                "p10_p90_rate_eps": statistics.median(m["p10_p90_rate_eps"] for _a, m in ks_runs),
                "count": min(m["count"] for _a, m in ks_runs),
                "wrong_joins": max(m["wrong_joins"] for _a, m in ks_runs),
                "dups": max(m["dups"] for _a, m in ks_runs),
                "runs": [m for _a, m in ks_runs],
                "runs_rate_eps": [m["rate_eps"] for _a, m in ks_runs],
            }
            job, spark = threes["measure"], threes["spark"]
            ratio = job["rate_eps"] / ks["rate_eps"]
            self.results[f"kafka_streams_{label}"] = {
                "keys": keys,
                "events": KS_EVENTS,
                "expected_misses": loaded.get("expected_misses"),
                "kafka_streams": {
                    "measure": ks,
                    "startup": app.get("startup"),
                    "throughput": app.get("throughput"),
                    "runs_startup": [a.get("startup") for a, _m in ks_runs],
                },
                "job": threes,
            }
            self.results[f"ratio_vs_kafka_streams_{label}"] = ratio
            self.results[f"ratio_vs_kafka_streams_{label}_p10_p90"] = job["p10_p90_rate_eps"] / ks["p10_p90_rate_eps"]
            startup = app.get("startup", {})
            self.rows.append(
                (
                    f"Kafka Streams {label} keys, events/s",
                    f"{ks['rate_eps']:,.0f}",
                    f"median of {len(ks_runs)} runs ("
                    + ", ".join(f"{r:,.0f}" for r in ks["runs_rate_eps"])
                    + f"), first->last append, {ks['count']:,.0f} out, p10-p90 {ks['p10_p90_rate_eps']:,.0f}/s, "
                    f"wrong {ks['wrong_joins']:.0f}, dups {ks['dups']:.0f}; global restore "
                    f"{startup.get('restore_s', 0):.1f} s, start->RUNNING {startup.get('start_to_running_s', 0):.1f} s",
                )
            )
            self.rows.append(
                (
                    f"job {label} keys (same topics), events/s",
                    f"{job['rate_eps']:,.0f}",
                    f"first->last append, {job['count']:,} out, p10-p90 {job['p10_p90_rate_eps']:,.0f}/s, "
                    f"wrong {job['wrong_joins']}, dups {job['dups']}; Spark progress {spark['events_per_s']:,.0f}/s "
                    f"({spark['batches']} batches), engine {spark['engine']}, snapshot ready {spark['ready_s']:.1f} s",
                )
            )
            target = 0.8 if keys <= SMALL else 1.0
            self.rows.append(
                (
                    f"job / Kafka Streams, {label} keys",
                    f"{ratio:.2f}x",
                    f"target >= {target}; p10-p90 rates {self.results[f'ratio_vs_kafka_streams_{label}_p10_p90']:.2f}x",
                )
            )
            if warm is not None:
                job_warm = warm["measure"]
                self.results[f"kafka_streams_{label}"]["job_warm"] = warm
                self.results[f"ratio_vs_kafka_streams_{label}_warm"] = job_warm["rate_eps"] / ks["rate_eps"]
                self.rows.append(
                    (
                        f"job {label} keys, second run (warm JVM), events/s",
                        f"{job_warm['rate_eps']:,.0f}",
                        f"{job_warm['rate_eps'] / ks['rate_eps']:.2f}x Kafka Streams' median; p10-p90 "
                        f"{job_warm['p10_p90_rate_eps']:,.0f}/s, wrong {job_warm['wrong_joins']}, "
                        f"dups {job_warm['dups']}, {job_warm['count']:,} out",
                    )
                )

    def main(self, parts: set[str]) -> None:
        small, medium, large = self.topic("snap10k"), self.topic("snap100k"), self.topic("snap1m")
        events = self.topic("events")
        started = time.monotonic()
        if "throughput" in parts:
            self.write_snapshot(small, SMALL, stride=STRIDE)  # exactly the keys the events reference
        if "bootstrap" in parts:
            self.write_snapshot(medium, MEDIUM)
        if parts & {"throughput", "bootstrap", "restart", "latency", "latency20k", "freshness", *LATENCY_PARTS}:
            self.write_snapshot(large, KEYS)
        if "throughput" in parts:
            self.write_events(events, EVENTS)
        log.info("data written in %.1f s", time.monotonic() - started)
        if "kstreams" in parts:  # first: its topics are loaded by the reference's own loader
            self.kafka_streams()
        if "throughput" in parts:
            self.throughput_runs(events, small, large)
        if "bootstrap" in parts:
            self.bootstrap_and_refresh(medium, large)
        if "restart" in parts:
            self.restart(self.topic("restart-events"), large)
        if "latency" in parts:
            self.latency(large, RATE)
        if "latency20k" in parts:
            self.latency(large, LATENCY_20K)
        for part, (rate, mode) in LATENCY_PARTS.items():  # real-time mode beside micro-batch mode
            if part in parts:
                self.latency(large, rate, mode)
        if "freshness" in parts:
            self.freshness(large)
        if "scale" in parts:  # 10M keys on the standalone cluster, each driver a 1 GB child process
            from snapshot_scale import run_scale

            results, rows = run_scale(self.kafka)
            self.results.update(results)
            self.rows.extend(rows)
        self.print()

    def print(self) -> None:
        width = max(len(r[0]) for r in self.rows)
        ks_keys = ", ".join(f"{k:,}" for k in KS_KEYS)
        print(
            f"\nstream_join benchmark: local[2], micro-batches of {BATCH:,}; parts 1-5: {EVENTS:,} events, "
            f"{KEYS:,} keys; Kafka Streams side by side: {KS_EVENTS:,} events at {ks_keys} keys"
        )
        for name, value, note in self.rows:
            print(f"  {name:<{width}}  {value:>16}  {note}")
        print(
            json.dumps(
                {
                    "benchmark": "stream_join",
                    "keys": KEYS,
                    "events": EVENTS,
                    "batch": BATCH,
                    "kafka_streams_events": KS_EVENTS,
                    "kafka_streams_keys": KS_KEYS,
                    **self.results,
                },
                default=float,
            )
        )

    def close(self) -> None:
        self.spark.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.topics.drop()


def realtime_config(config: StreamJobConfig) -> StreamJobConfig:
    """The same job in real-time mode (checkpoint interval 30 s; no micro-batches to bound)."""
    data = config.model_dump()
    data["events"]["max_offsets_per_trigger"] = None
    return StreamJobConfig.model_validate({**data, "mode": "realtime", "checkpoint_interval": "30 seconds"})


LATENCY_PARTS = {
    "latency5k": (5_000, "microbatch"),
    "latency_rt5k": (5_000, "realtime"),
    "latency_rt20k": (LATENCY_20K, "realtime"),
}
DEFAULT_PARTS = "throughput,bootstrap,restart,latency,latency20k,kstreams,scale"


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("THREES_BENCH_LOG", "INFO"), format="%(asctime)s %(name)s %(message)s")
    for noisy in ("py4j", "stream_app.snapshot.indexed"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    bench = Bench()
    try:
        bench.main(set(os.environ.get("THREES_BENCH_PARTS", DEFAULT_PARTS).split(",")))
    finally:
        bench.close()
