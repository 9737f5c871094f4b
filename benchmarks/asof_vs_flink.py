"""As-of lookups against Flink SQL's event-time temporal join, side by side on the same topics (issue #39).

Run: ``python benchmarks/asof_vs_flink.py`` (the local stack's Kafka must be up). Prints a table,
then one JSON line with ``ratio_asof_vs_flink_10k`` / ``_1m`` = the threes job's sustained events/s
over Flink's, both measured on their own output topics by broker append time (target >= 1.0).

**Set-up of the peer** (once per machine; PyFlink never goes into the project's virtualenv)::

    python3.11 -m venv /work/venv-flink
    /work/venv-flink/bin/pip install apache-flink==2.3.0 confluent-kafka
    mkdir -p /work/venv-flink/jars && for a in flink-sql-connector-kafka:5.0.0-2.2 flink-sql-avro:2.3.0; do
        mvn -q dependency:copy -Dartifact=org.apache.flink:$a -DoutputDirectory=/work/venv-flink/jars; done

``flink-sql-connector-kafka`` has no build for Flink 2.3 on Maven Central; the 2.2 one runs on 2.3.0
(as in ``../shared/anchors/flink-temporal-join``). PyFlink bundles no Avro format, hence
``flink-sql-avro``. ``THREES_FLINK_VENV`` points at another virtualenv (default
``/work/venv-flink``), whose ``jars/`` folder holds the two jars (or ``THREES_FLINK_JARS``, comma
separated). Flink runs in its local mini-cluster (parallelism 2, heap state, no checkpointing) on
JDK 17 (``THREES_FLINK_JAVA_HOME``, default ``/usr/lib/jvm/java-17-openjdk-amd64``).

**Data** (written once per size by this script, read by both sides): a compacted reference topic
of ``N`` keys (``THREES_BENCH_FLINK_KEYS``, default ``10000,1000000``) x 5 versions
(``THREES_BENCH_FLINK_VERSIONS``), key ``k<i>`` as a plain UTF-8 string, value the Kafka Streams
reference's ``bench.Ref`` {name, category, score, updated_ms} in Avro single-object encoding;
version ``v`` of every key has ``updated_ms`` = record timestamp = ``T0 + v`` days (``T0`` = now
- 6 days), so it is valid from day ``v`` and the last one from day 4 on; name ``name-<i>-v<v>``.
An events topic of ``E`` events (``THREES_BENCH_FLINK_EVENTS``, default 2,000,000) of
``bench.Event`` {eid, fk, amount, ts}, ``fk`` uniform over 1.1 N keys (~9 % misses), ``ts``
rising from ``T0`` to ``T0 + 5`` days in production order (so no event is late for Flink's
watermark). 2 partitions each.

**The two sides**, one after the other (``THREES_BENCH_FLINK_ROUNDS`` rounds, default 1):

a. Flink SQL: ``benchmarks/flink_temporal_join.py`` run by the PyFlink virtualenv's Python:
   ``ev LEFT JOIN ref FOR SYSTEM_TIME AS OF ev.ts_time`` (the reference as an ``upsert-kafka``
   versioned table, its row time ``updated_ms``), output in Flink's ``avro`` format; it reads the
   single-object records with Flink's own Avro decoder (how: that script's docstring).
b. threes: the stream job (local[2], micro-batches of ``THREES_BENCH_FLINK_BATCH`` = 100,000,
   ``availableNow``) with a versioned snapshot (``retention: 30 days``, key_format string) and
   ``lookups: [{snapshot: refs, on: {fk: key}, as_of: ts_time}]``, ``ts_time`` derived as
   ``timestamp_millis(ts)``; the version time is the Kafka record timestamp (no
   ``threes.source_ts`` header), i.e. ``updated_ms``.

Each side's figure is ``(count - 1) / (last - first append time)`` of its output topic (created
with LogAppendTime; ``peers.measure_output``), so the start-up, the snapshot's readiness gate and
Flink's wait for the idle reference source (``table.exec.source.idle-timeout`` 5 s) are outside
both; the p10-p90 rate is printed beside it. Every output row is checked: the name is the version
valid at the event's ``ts`` (or null for a key outside the reference), no duplicates, every
event once. Flink's submit-to-last rate and the threes job's Spark progress figure are printed too.

Bounds: Flink's run ends after ``THREES_BENCH_FLINK_MAX_S`` (540 s), the job's after
``THREES_BENCH_FLINK_THREES_MAX_S`` (600 s, its snapshot's loading included); a size whose run does
not finish in its bound is reported as ``error_<size>`` in the JSON, the other sizes stand.
"""

from __future__ import annotations

import json
import logging
import os
import random
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

from peers import PeerTopics, load_note, measure_output, run_bench, size_label  # noqa: E402
from stream_join import KS_EVENT, KS_REF, ks_enriched, value_rows  # noqa: E402

KEYS = [int(n) for n in os.environ.get("THREES_BENCH_FLINK_KEYS", "10000,1000000").split(",")]
VERSIONS = int(os.environ.get("THREES_BENCH_FLINK_VERSIONS", "5"))
EVENTS = int(os.environ.get("THREES_BENCH_FLINK_EVENTS", "2000000"))
BATCH = int(os.environ.get("THREES_BENCH_FLINK_BATCH", "100000"))
ROUNDS = max(1, int(os.environ.get("THREES_BENCH_FLINK_ROUNDS", "1")))
FLINK_VENV = Path(os.environ.get("THREES_FLINK_VENV", "/work/venv-flink"))
FLINK_JARS = os.environ.get("THREES_FLINK_JARS", "")
FLINK_JAVA_HOME = os.environ.get("THREES_FLINK_JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
FLINK_MAX_S = float(os.environ.get("THREES_BENCH_FLINK_MAX_S", "540"))
THREES_MAX_S = float(os.environ.get("THREES_BENCH_FLINK_THREES_MAX_S", "600"))  # the job's run, start-up included
DAY_MS = 86_400_000
log = logging.getLogger("asof_vs_flink")

# the Kafka Streams reference's schemas (the JSON of its Schemas.java), as stream_join.py part 6 uses them
REF, EVENT = KS_REF, KS_EVENT
# what Flink's `avro` format writes for flink_temporal_join.py's out_t (nullable columns: unions, null first)
FLINK_OUT = ks_enriched("record", "org.apache.flink.avro.generated")


def flink_jars() -> list[str]:
    """The Kafka SQL connector and ``flink-sql-avro`` jars (``THREES_FLINK_JARS`` or ``<venv>/jars/*.jar``).

    Raises:
        FileNotFoundError: PyFlink's virtualenv or the jars are missing (the set-up is in the module docstring).
    """
    python = FLINK_VENV / "bin" / "python"
    jars = [j for j in FLINK_JARS.split(",") if j] or sorted(str(p) for p in (FLINK_VENV / "jars").glob("*.jar"))
    names = " ".join(Path(j).name for j in jars)
    if not python.exists() or "flink-sql-connector-kafka" not in names or "flink-sql-avro" not in names:
        raise FileNotFoundError(
            f"PyFlink's virtualenv {FLINK_VENV} with jars/flink-sql-connector-kafka-*.jar and "
            f"jars/flink-sql-avro-*.jar is needed (found: {names or 'none'}); set it up as {__file__}'s docstring says"
        )
    return jars


def expected_name(fk: str, ts: int, keys: int, t0: int) -> str | None:
    """The reference name valid for key ``fk`` at event time ``ts`` (None: a key outside the reference)."""
    i = int(fk[1:])
    if i >= keys:
        return None
    return f"name-{i}-v{min(VERSIONS - 1, max(0, (ts - t0) // DAY_MS))}"


class Bench:
    """One run: the data per size, then Flink and the threes job on it, then the figures."""

    def __init__(self) -> None:
        from kernel.config.models import KafkaConfig
        from schemas.store import SchemaStore
        from threes.local import LocalStack

        self.kafka = KafkaConfig(bootstrap_servers=LocalStack().endpoints().kafka_bootstrap)
        self.conf = self.kafka.librdkafka_config()
        self.topics = PeerTopics(self.conf)
        self.store = SchemaStore(self.conf, self.kafka.schema_topic)
        for schema in (REF, EVENT):
            self.store.register(schema)
        self.tmp = Path(tempfile.mkdtemp(prefix="threes-bench-flink-"))
        (self.tmp / "ref.avsc").write_text(json.dumps(REF))
        (self.tmp / "event.avsc").write_text(json.dumps(EVENT))
        self.t0 = (int(time.time() * 1000) - 6 * DAY_MS) // DAY_MS * DAY_MS
        self.spark: Any = None
        self.wrong_logged = 0
        self.results: dict[str, Any] = {}
        self.rows: list[tuple[str, str, str]] = []

    # -- data ---------------------------------------------------------------------------------------

    def load(self, keys: int) -> tuple[str, str, dict[str, Any]]:
        """Write the reference versions and the events of one size; returns (ref topic, events topic, stats)."""
        from confluent_kafka import Producer

        from schemas.serde import AvroSerializer

        label = size_label(keys)
        ref = self.topics.create(f"ref_{label}", config={"cleanup.policy": "compact"})
        events = self.topics.create(f"events_{label}")
        producer = Producer({**self.conf, "linger.ms": 50, "batch.size": 1_000_000, "compression.type": "lz4",
                             "queue.buffering.max.messages": 2_000_000, "acks": "all"})
        started = time.monotonic()

        def send(topic: str, key: str, value: bytes, ts: int | None = None) -> None:
            while True:
                try:
                    if ts is None:
                        producer.produce(topic, key=key, value=value)
                    else:
                        producer.produce(topic, key=key, value=value, timestamp=ts)
                    return
                except BufferError:
                    producer.poll(0.05)

        ser_ref = AvroSerializer(REF)
        for v in range(VERSIONS):  # version by version: updated_ms rises in every partition (Flink's watermark)
            updated = self.t0 + v * DAY_MS
            for i in range(keys):
                value = {"name": f"name-{i}-v{v}", "category": f"c{i % 20}", "score": float(i % 1000),
                         "updated_ms": updated}
                send(ref, f"k{i}", ser_ref(value), updated)
                if i % 10000 == 0:
                    producer.poll(0)
        producer.flush(120)
        ref_s = time.monotonic() - started
        ser_ev = AvroSerializer(EVENT)
        rnd = random.Random(42)
        fk_range = int(keys * 1.1)
        span = VERSIONS * DAY_MS
        misses = 0
        for j in range(EVENTS):
            fk = rnd.randrange(fk_range)
            misses += fk >= keys
            value = {"eid": j, "fk": f"k{fk}", "amount": round(rnd.random() * 1000, 2),
                     "ts": self.t0 + j * span // EVENTS}
            send(events, f"e{j}", ser_ev(value))
            if j % 10000 == 0:
                producer.poll(0)
        producer.flush(120)
        stats = {"ref_records": keys * VERSIONS, "ref_load_s": ref_s, "events": EVENTS,
                 "events_load_s": time.monotonic() - started - ref_s, "expected_misses": misses}
        log.info("loaded %s: %s", label, stats)
        return ref, events, stats

    # -- checks -------------------------------------------------------------------------------------

    def right(self, eid: int, fk: str, ts: int, name: str | None, keys: int) -> bool:
        """Whether an output row joined the version valid at its event time; the first 10 wrong rows are logged."""
        expected = expected_name(fk, ts, keys, self.t0)
        if name == expected:
            return True
        self.wrong_logged += 1
        if self.wrong_logged <= 10:
            log.warning("wrong join: eid=%s fk=%s ts=%s (T0 + %.3f days) name=%s expected %s", eid, fk, ts,
                        (ts - self.t0) / DAY_MS, name, expected)
        return False

    def flink_check(self, keys: int) -> Any:
        """Decodes Flink's output chunks (bare Avro bodies of FLINK_OUT)."""
        import io

        from fastavro import parse_schema, schemaless_reader

        schema = parse_schema(FLINK_OUT)

        def check(values: list[bytes]) -> Iterator[tuple[Any, bool, bool]]:
            for v in values:
                d = schemaless_reader(io.BytesIO(v), schema, None)
                yield d["eid"], d["ref_name"] is None, self.right(d["eid"], d["fk"], d["ts"], d["ref_name"], keys)

        return check

    def threes_check(self, keys: int) -> Any:
        """Decodes the job's output chunks (single-object Avro through threes' schema topic, in columns)."""
        from schemas.columnar import ColumnarDecoder
        from schemas.serde import AvroDeserializer

        des, columnar = AvroDeserializer(self.store), ColumnarDecoder(self.store)

        def check(values: list[bytes]) -> Iterator[tuple[Any, bool, bool]]:
            for eid, fk, ts, name in value_rows(values, des, columnar, ("eid", "fk", "ts", "ref_name")):
                yield eid, name is None, self.right(eid, fk, ts, name, keys)

        return check

    # -- the two sides ------------------------------------------------------------------------------

    def flink(self, ref: str, events: str, keys: int, run: str) -> dict[str, Any]:
        """One run of Flink SQL's temporal join (a child process in PyFlink's virtualenv) into a new topic."""
        out = self.topics.output(f"flink_out_{size_label(keys)}{run}")
        group = self.topics.name(f"flink_{size_label(keys)}{run}")
        self.topics.groups += [f"{group}_ev", f"{group}_ref"]
        cmd = [str(FLINK_VENV / "bin" / "python"), str(Path(__file__).with_name("flink_temporal_join.py")),
               "--bootstrap", self.kafka.bootstrap_servers, "--ref", ref, "--events", events, "--out", out,
               "--expected", str(EVENTS), "--jars", ",".join(flink_jars()), "--group", group,
               "--max-s", str(FLINK_MAX_S)]
        env = {**os.environ, "JAVA_HOME": FLINK_JAVA_HOME,
               "PATH": f"{FLINK_JAVA_HOME}/bin:{os.environ.get('PATH', '')}"}
        for var in ("PYTHONPATH", "VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_PYTHON"):  # the project's, not PyFlink's
            env.pop(var, None)
        log.info("Flink run %s on %s", run or "0", events)
        started = time.monotonic()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=FLINK_MAX_S + 180)
        (self.tmp / f"flink{run}.log").write_text(proc.stdout + proc.stderr)
        wall = time.monotonic() - started
        try:
            driver = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            driver = {}
        if proc.returncode != 0 or not driver:
            raise RuntimeError(f"the Flink run failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-3000:]}")
        measured = measure_output(self.conf, out, self.flink_check(keys))
        measured["submit_to_last_s"] = measured["last_ms"] / 1000 - driver["t_submit"]
        measured["submit_to_first_s"] = measured["first_ms"] / 1000 - driver["t_submit"]
        measured["rate_submit_to_last_eps"] = measured["count"] / measured["submit_to_last_s"]
        measured["process_wall_s"] = wall
        return measured

    def session(self) -> Any:
        if self.spark is None:
            from stream_app.session import spark_session
            from stream_app.spark_settings import SparkSettings
            from threes.local import LocalStack

            self.spark = spark_session(
                SparkSettings(master="local[2]", app_name="threes-bench-asof-vs-flink", driver_memory="4g"),
                LocalStack().spark_jars(),
            )
        return self.spark

    def threes(self, ref: str, events: str, keys: int, run: str) -> dict[str, Any]:
        """One run of the threes job with the as-of lookup (micro-batches, availableNow) into a new topic."""
        from stream_app.config import StreamJobConfig
        from stream_app.job import StreamJob

        spark = self.session()
        out = self.topics.output(f"threes_out_{size_label(keys)}{run}")
        config = StreamJobConfig.model_validate({
            "name": f"bench-peers-asof-{uuid.uuid4().hex[:6]}",
            "events": {"topic": events, "value_schema": "event.avsc", "starting_offsets": "earliest",
                       "max_offsets_per_trigger": BATCH},
            "derive": {"ts_time": "timestamp_millis(ts)"},
            "snapshots": [{"name": "refs", "topics": [ref], "key_format": "string", "key_field": "key",
                           "value_schema": "ref.avsc", "retention": "30 days"}],
            "lookups": [{"snapshot": "refs", "on": {"fk": "key"}, "as_of": "ts_time", "prefix": "ref_"}],
            "enriched_topic": out,
            "dead_letter_topic": self.topics.name("dlq"),
            "checkpoint_location": str(self.tmp / f"cp-{uuid.uuid4().hex[:6]}"),
        })
        self.topics.adopt(self.topics.name("dlq"))
        log.info("threes run %s on %s", run or "0", events)
        job = StreamJob(config, self.kafka, spark, base_dir=self.tmp)
        job.start(available_now=True)
        finished = job.await_termination(THREES_MAX_S)
        progress = [p for p in job.queries[0].recentProgress if p["numInputRows"]]
        seconds = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000 - job.gate_wait_s
        spark_stats = {
            "events": sum(p["numInputRows"] for p in progress),
            "batches": len(progress),
            "events_per_s_gate_excluded": sum(p["numInputRows"] for p in progress) / seconds if seconds > 0 else 0.0,
            "gate_wait_s": job.gate_wait_s,
            "engine": job.snapshots["refs"].mode,
            "ready_s": sum(r["elapsed_s"] for r in job.readiness.values()),
            "finished": finished,
        }
        job.stop(checkpoint=False)
        if not finished:
            raise RuntimeError(f"the threes job had not read the {EVENTS:,} events after {THREES_MAX_S:.0f} s "
                               f"(THREES_BENCH_FLINK_THREES_MAX_S); snapshot ready in {spark_stats['ready_s']:.0f} s")
        measured = measure_output(self.conf, out, self.threes_check(keys))
        measured["spark"] = spark_stats
        return measured

    # -- the run ------------------------------------------------------------------------------------

    def size(self, keys: int) -> None:
        label = size_label(keys)
        ref, events, loaded = self.load(keys)
        flink_runs, threes_runs = [], []
        for r in range(ROUNDS):
            run = f"_r{r}" if r else ""
            flink_runs.append(self.flink(ref, events, keys, run))
            threes_runs.append(self.threes(ref, events, keys, run))
        flink = statistics.median(m["rate_eps"] for m in flink_runs)
        ours = statistics.median(m["rate_eps"] for m in threes_runs)
        ratio = ours / flink if flink else 0.0
        self.results[f"ratio_asof_vs_flink_{label}"] = round(ratio, 3)
        self.results[f"flink_{label}"] = {
            "keys": keys, "versions_per_key": VERSIONS, **loaded, "rate_eps": flink, "runs": flink_runs,
        }
        self.results[f"threes_asof_{label}"] = {"keys": keys, "rate_eps": ours, "runs": threes_runs}
        for name, runs in (("Flink SQL temporal join", flink_runs), ("threes as_of lookup", threes_runs)):
            m = runs[0]
            extra = (f"submit->first {m['submit_to_first_s']:.1f} s, submit->last {m['rate_submit_to_last_eps']:,.0f}/s"
                     if "submit_to_last_s" in m else
                     f"Spark progress {m['spark']['events_per_s_gate_excluded']:,.0f}/s over "
                     f"{m['spark']['batches']} batches, engine {m['spark']['engine']}, "
                     f"snapshot ready {m['spark']['ready_s']:.1f} s")
            self.rows.append((
                f"{name}, {label} keys x {VERSIONS}, events/s",
                f"{statistics.median(x['rate_eps'] for x in runs):,.0f}",
                f"first->last append, runs {', '.join(format(x['rate_eps'], ',.0f') for x in runs)}; p10-p90 "
                f"{m['p10_p90_rate_eps']:,.0f}/s; {m['count']:,} out, {m['misses']:,} null, wrong {m['wrong']}, "
                f"dups {m['dups']}; {extra}",
            ))
        self.rows.append((f"threes / Flink, {label} keys", f"{ratio:.2f}x", "target >= 1.0"))

    def main(self) -> None:
        flink_jars()  # fail before writing data when the peer is not set up
        for keys in KEYS:
            try:
                self.size(keys)
            except Exception as exc:  # a size that cannot run here is reported, the others stand
                log.exception("%s keys failed", f"{keys:,}")
                self.results[f"error_{size_label(keys)}"] = f"{type(exc).__name__}: {str(exc)[-500:]}"
                self.rows.append((f"{size_label(keys)} keys", "failed", f"{type(exc).__name__}: {str(exc)[:200]}"))
        self.print()

    def print(self) -> None:
        width = max(len(r[0]) for r in self.rows)
        print(f"\nasof_vs_flink benchmark: {EVENTS:,} events, keys {', '.join(f'{k:,}' for k in KEYS)} x {VERSIONS} "
              f"versions; threes local[2] batches of {BATCH:,}; Flink 2.3 mini-cluster parallelism 2; {load_note()}")
        for name, value, note in self.rows:
            print(f"  {name:<{width}}  {value:>12}  {note}")
        print(json.dumps({"benchmark": "asof_vs_flink", "events": EVENTS, "keys": KEYS, "versions_per_key": VERSIONS,
                          "batch": BATCH, "rounds": ROUNDS, **self.results}, default=float))

    def close(self) -> None:
        if self.spark is not None:
            self.spark.stop()
        self.topics.drop()
        shutil.rmtree(self.tmp, ignore_errors=True)


if __name__ == "__main__":
    run_bench(Bench)
