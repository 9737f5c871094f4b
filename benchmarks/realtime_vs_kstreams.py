"""Real-time mode against Kafka Streams' GlobalKTable join, side by side on the same topics (issue #42).

Run: ``python benchmarks/realtime_vs_kstreams.py`` (the local stack's Kafka must be up; Maven and a
JDK 17 build the peer on first use). Prints a table, then one JSON line with:

* ``latency_p99_ms_realtime_20k`` (target <= 100 ms), ``latency_p50_ms_realtime_{5k,20k}``,
  ``latency_p99_ms_realtime_5k``, the same for Kafka Streams (``latency_p99_ms_kafka_streams_20k``...),
  and ``latency_p99_ratio_vs_kafka_streams_20k`` (and ``_5k``) = Kafka Streams' p99 / the job's
  (target >= 0.25);
* ``throughput_ratio_vs_kafka_streams`` (= ``_10k``; ``_1m`` when 1M keys ran) = the job's sustained
  events/s in real-time mode / Kafka Streams' (target >= 0.8).

**The peer** is the Kafka Streams reference application of ``../shared/anchors/kstreams-ref``
(Kafka Streams 4.3.1: ``events.leftJoin(GlobalKTable(ref), fk)``, at-least-once, 2 stream threads,
heap -Xms2g -Xmx2g as its run.sh), run from its own jar: built when missing with its own Maven
command into ``THREES_KSTREAMS_BUILD`` (default ``.threes/kstreams-ref``, the folder
``stream_join.py`` uses), with ``-Dmaven.repo.local=$THREES_BENCH_M2`` when that is set (the local
stack's ``.threes/m2`` reuses the jars it downloaded). Its code is never copied here.

**The topics.** Per size (``THREES_BENCH_RT_KEYS``, default ``10000``; ``10000,1000000`` adds 1M), the
reference's own loader (``ref.Main load``) writes a compacted reference topic of N keys (plain
UTF-8 keys ``k<i>``, values ``bench.Ref`` in Avro single-object encoding) and
``THREES_BENCH_RT_EVENTS`` events (default 2,000,000, ``fk`` uniform over 1.1 N keys). The job reads
them as they are (``key_format: string``, ``on: {fk: key}``; the reference's writer schemas are
registered in threes' schema topic, as ``stream_join.py`` part 6 does).

**Throughput.** Kafka Streams: ``ref.Main app --expect=E`` (exits once E events were joined) into an
output topic with LogAppendTime. The job: ``stream.mode: realtime`` (checkpoint interval 30 s,
local[2], driver 4 GB, lookups in the JVM store), from the earliest offset into its own
LogAppendTime topic, stopped once E records are there. Each side's figure is
``(count - 1) / (last - first append time)`` of its output (``peers.measure_output``; start-up and
the stores' loading are outside it), with every row checked (the reference's name for ``fk``, or
null outside it; no duplicates).

**Latency** at 5k and 20k events/s (``THREES_BENCH_RT_RATES``) for ``THREES_BENCH_RT_LATENCY_S``
(30 s) each, against the first size's reference topic, one side at a time, each on a new events
topic and output topic. The side is started; this script sends a probe event every 100 ms until
one comes out (the stores are loaded and the query runs), waits 3 s, then produces at the fixed
rate from one Python producer (linger 5 ms, acks all). Latency = the output record's broker append
time - the event's CreateTime (set by this script at ``produce()``), both on this machine's clock;
the first ``THREES_BENCH_RT_WARMUP_S`` (5 s) of events are left out, as the reference's own
latency probe does. The same probe measures both sides. ``max_ms_by_second`` lists the worst
latency of the events sent in each second: one or two high seconds are a stall (in real-time mode,
a checkpoint boundary every ``THREES_BENCH_RT_CHECKPOINT_INTERVAL``), a rising line a side that
cannot keep up.

Bounds: each run waits at most ``THREES_BENCH_RT_TIMEOUT_S`` (540 s); a size whose throughput run
does not finish in it is reported as ``error_<size>`` in the JSON, the other sizes stand.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
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

from peers import PeerTopics, end_offsets, load_note, measure_output, percentile, run_bench, size_label, wait_for_count  # noqa: E402
from stream_join import (  # noqa: E402
    KS_EVENT,
    KS_REF,
    ks_enriched,
    ks_ref_category,
    ks_ref_name,
    parse_results,
    value_rows,
)

KEYS = [int(n) for n in os.environ.get("THREES_BENCH_RT_KEYS", "10000").split(",")]
EVENTS = int(os.environ.get("THREES_BENCH_RT_EVENTS", "2000000"))
RATES = [int(n) for n in os.environ.get("THREES_BENCH_RT_RATES", "5000,20000").split(",")]
LATENCY_S = float(os.environ.get("THREES_BENCH_RT_LATENCY_S", "30"))
WARMUP_S = float(os.environ.get("THREES_BENCH_RT_WARMUP_S", "5"))
CHECKPOINT_INTERVAL = os.environ.get("THREES_BENCH_RT_CHECKPOINT_INTERVAL", "30 seconds")
KS_HEAP = os.environ.get("THREES_BENCH_KS_HEAP", "-Xms2g -Xmx2g").split()
KS_ANCHOR = Path(os.environ.get("THREES_KSTREAMS_REF", str(ROOT.parent / "shared" / "anchors" / "kstreams-ref")))
KS_BUILD = Path(os.environ.get("THREES_KSTREAMS_BUILD", str(ROOT / ".threes" / "kstreams-ref")))
M2 = os.environ.get("THREES_BENCH_M2", "")
RUN_TIMEOUT_S = float(os.environ.get("THREES_BENCH_RT_TIMEOUT_S", "540"))
LOOKUP = ROOT / "stream_app" / "jars" / "threes-lookup.jar"
PROBE_BASE = 10**12
log = logging.getLogger("realtime_vs_kstreams")

KS_ENRICHED = ks_enriched()  # Schemas.ENRICHED of the reference


def right(fk: str, name: str | None, category: str | None, keys: int) -> bool:
    """Whether a row carries the reference loader's name and category for ``fk`` (null outside the reference)."""
    i = int(fk[1:])
    if i >= keys:
        return name is None
    return name == ks_ref_name(i) and category == ks_ref_category(i)


class Bench:
    """One run: per size, throughput of both sides; then latency of both sides at each rate."""

    def __init__(self) -> None:
        from kernel.config.models import KafkaConfig
        from schemas.store import SchemaStore
        from threes.local import LocalStack

        self.kafka = KafkaConfig(bootstrap_servers=LocalStack().endpoints().kafka_bootstrap)
        self.conf = self.kafka.librdkafka_config()
        self.topics = PeerTopics(self.conf)
        self.store = SchemaStore(self.conf, self.kafka.schema_topic)
        for schema in (KS_REF, KS_EVENT, KS_ENRICHED):
            self.store.register(schema)
        self.tmp = Path(tempfile.mkdtemp(prefix="threes-bench-rt-"))
        (self.tmp / "ref.avsc").write_text(json.dumps(KS_REF))
        (self.tmp / "event.avsc").write_text(json.dumps(KS_EVENT))
        self.spark: Any = None
        self.results: dict[str, Any] = {}
        self.rows: list[tuple[str, str, str]] = []

    # -- the peer -----------------------------------------------------------------------------------

    def ks_classpath(self) -> str:
        """The reference's classpath; built with its own Maven command when its jar is missing."""
        target = KS_BUILD / "target"
        jar = target / "kstreams-ref-1.0.jar"
        if not jar.exists():
            log.info("building the Kafka Streams reference from %s into %s", KS_ANCHOR, target)
            cmd = ["mvn", "-B", "-q", "package", "-DskipTests", f"-Dref.build.dir={target}"]
            subprocess.run(cmd + ([f"-Dmaven.repo.local={M2}"] if M2 else []), cwd=KS_ANCHOR, check=True)
        return f"{jar}:{target}/lib/*"

    def ks_cmd(self, name: str, tool: str, *args: str) -> list[str]:
        logs = self.tmp / "ks-logs"
        logs.mkdir(exist_ok=True)
        return ["java", *KS_HEAP, f"-Dlog4j2.configurationFile={KS_ANCHOR / 'conf' / 'log4j2-app.properties'}",
                f"-Dref.log.file={logs / f'{name}.log'}", "-cp", self.ks_classpath(), "ref.Main", tool, *args,
                f"--bootstrap={self.kafka.bootstrap_servers}"]

    def ks_run(self, name: str, tool: str, *args: str) -> dict[str, dict[str, Any]]:
        """Run one tool of the reference to its end; its ``RESULT`` lines.

        Raises:
            RuntimeError: the tool exited non-zero.
        """
        proc = subprocess.run(self.ks_cmd(name, tool, *args), capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
        (self.tmp / f"ks-{name}.out").write_text(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise RuntimeError(f"kstreams-ref {tool} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
        return parse_results(proc.stdout)

    def ks_app_args(self, app: str, ref: str, events: str, out: str) -> list[str]:
        self.topics.groups.append(app)
        return [f"--app-id={app}", f"--state-dir={self.tmp / 'ks-state'}", "--close-leave-group=true",
                f"--ref-topic={ref}", f"--events-topic={events}", f"--out-topic={out}"]

    # -- checks -------------------------------------------------------------------------------------

    def ks_check(self, keys: int) -> Any:
        """Decodes the reference's output (single-object ``bench.Enriched``) and checks each row."""
        import io

        from fastavro import parse_schema, schemaless_reader

        schema = parse_schema(KS_ENRICHED)

        def check(values: list[bytes]) -> Iterator[tuple[Any, bool, bool]]:
            for v in values:
                d = schemaless_reader(io.BytesIO(v[10:]), schema, None)
                yield d["eid"], d["ref_name"] is None, right(d["fk"], d["ref_name"], d["ref_category"], keys)

        return check

    def threes_check(self, keys: int) -> Any:
        """Decodes the job's output through threes' schema topic (in columns) and checks each row."""
        from schemas.columnar import ColumnarDecoder
        from schemas.serde import AvroDeserializer

        des, columnar = AvroDeserializer(self.store), ColumnarDecoder(self.store)

        def check(values: list[bytes]) -> Iterator[tuple[Any, bool, bool]]:
            for eid, fk, name, category in value_rows(values, des, columnar, ("eid", "fk", "ref_name", "ref_category")):
                yield eid, name is None, right(fk, name, category, keys)

        return check

    # -- the job ------------------------------------------------------------------------------------

    def session(self) -> Any:
        if self.spark is None:
            from stream_app.session import spark_session
            from stream_app.spark_settings import SparkSettings
            from threes.local import LocalStack

            self.spark = spark_session(
                SparkSettings(master="local[2]", app_name="threes-bench-realtime-vs-kstreams", driver_memory="4g"),
                LocalStack().spark_jars(),
                extra_jars=[LOOKUP],
            )
        return self.spark

    def job(self, ref: str, events: str, out: str) -> Any:
        """The job in real-time mode on the reference's topics (not started)."""
        from stream_app.config import StreamJobConfig
        from stream_app.job import StreamJob

        dlq = self.topics.name("dlq")
        self.topics.adopt(dlq)
        config = StreamJobConfig.model_validate({
            "name": f"bench-peers-rt-{uuid.uuid4().hex[:6]}",
            "mode": "realtime",
            "checkpoint_interval": CHECKPOINT_INTERVAL,
            "events": {"topic": events, "value_schema": "event.avsc", "starting_offsets": "earliest"},
            "snapshots": [{"name": "refs", "topics": [ref], "key_format": "string", "key_field": "key",
                           "value_schema": "ref.avsc"}],
            "lookups": [{"snapshot": "refs", "on": {"fk": "key"}, "prefix": "ref_"}],
            "enriched_topic": out,
            "dead_letter_topic": dlq,
            "checkpoint_location": str(self.tmp / f"cp-{uuid.uuid4().hex[:6]}"),
        })
        return StreamJob(config, self.kafka, self.session(), base_dir=self.tmp)

    @staticmethod
    def job_alive(job: Any) -> bool:
        failed = [q.exception() for q in job.queries if q.exception()]
        if failed:
            raise RuntimeError(f"the real-time query failed: {failed[0]}")
        return True

    # -- throughput ---------------------------------------------------------------------------------

    def throughput(self, keys: int) -> str:
        """Both sides' sustained events/s on one size's topics; returns the reference topic."""
        label = size_label(keys)
        ref, events, ks_out = (self.topics.name(f"ks_{w}_{label}") for w in ("ref", "events", "out"))
        self.topics.adopt(ref, events, ks_out)
        loaded = self.ks_run(f"load-{label}", "load", f"--n={keys}", f"--e={EVENTS}", f"--ref-topic={ref}",
                             f"--events-topic={events}", f"--out-topic={ks_out}")["load"]
        time.sleep(5)  # let the broker settle after the bulk load (as the reference's run.sh does)
        log.info("Kafka Streams throughput run, %s keys", label)
        app = self.ks_run(f"app-{label}", "app", f"--expect={EVENTS}",
                          *self.ks_app_args(self.topics.name(f"ks_app_{label}"), ref, events, ks_out))
        ks = measure_output(self.conf, ks_out, self.ks_check(keys))
        ks["startup"] = app.get("startup")

        log.info("threes real-time throughput run, %s keys", label)
        out = self.topics.output(f"rt_out_{label}")
        job = self.job(ref, events, out)
        started = time.monotonic()
        job.start()
        try:
            count = wait_for_count(self.conf, out, EVENTS, RUN_TIMEOUT_S, lambda: self.job_alive(job))
            wall = time.monotonic() - started
        finally:
            job.stop(checkpoint=False)
        if count < EVENTS:
            raise RuntimeError(f"the real-time job wrote {count:,} of {EVENTS:,} records within {RUN_TIMEOUT_S:.0f} s "
                               "(THREES_BENCH_RT_TIMEOUT_S)")
        ours = measure_output(self.conf, out, self.threes_check(keys))
        ours["start_to_last_s"] = wall

        ratio = ours["rate_eps"] / ks["rate_eps"] if ks["rate_eps"] else 0.0
        self.results[f"throughput_ratio_vs_kafka_streams_{label}"] = round(ratio, 3)
        if keys == KEYS[0]:
            self.results["throughput_ratio_vs_kafka_streams"] = round(ratio, 3)
        self.results[f"throughput_{label}"] = {"keys": keys, "events": EVENTS,
                                               "expected_misses": loaded.get("expected_misses"),
                                               "kafka_streams": ks, "realtime": ours}
        for name, m in (("Kafka Streams", ks), ("threes realtime", ours)):
            self.rows.append((
                f"{name}, {label} keys, events/s", f"{m['rate_eps']:,.0f}",
                f"first->last append; p10-p90 {m['p10_p90_rate_eps']:,.0f}/s; {m['count']:,} out of {EVENTS:,}, "
                f"{m['misses']:,} null, wrong {m['wrong']}, dups {m['dups']}",
            ))
        self.rows.append((f"realtime / Kafka Streams, {label} keys", f"{ratio:.2f}x", "target >= 0.8"))
        return ref

    # -- latency ------------------------------------------------------------------------------------

    def probe(self, events: str, out: str, alive: Any) -> None:
        """Send a probe event every 100 ms until one comes out (the side is up and its store loaded).

        Raises:
            RuntimeError: nothing came out within the run timeout.
        """
        from confluent_kafka import Producer

        from schemas.serde import AvroSerializer

        ser = AvroSerializer(KS_EVENT)
        producer = Producer({**self.conf, "linger.ms": 0})
        deadline = time.monotonic() + RUN_TIMEOUT_S
        n = 0
        while sum(end_offsets(self.conf, out).values()) == 0:
            if time.monotonic() > deadline or not alive():
                raise RuntimeError(f"no output on {out} within {RUN_TIMEOUT_S:.0f} s")
            producer.produce(events, key=f"p{n}".encode(),
                             value=ser({"eid": PROBE_BASE + n, "fk": "k0", "amount": 0.0, "ts": 0}))
            producer.flush(10)
            n += 1
            time.sleep(0.1)
        time.sleep(3)

    def drive(self, events: str, out: str, rate: int, keys: int) -> dict[str, Any]:
        """Produce at ``rate`` events/s for LATENCY_S; latency per event from the output's append time."""
        import random

        from confluent_kafka import Consumer, Producer, TopicPartition

        from schemas.serde import AvroSerializer

        ser = AvroSerializer(KS_EVENT)
        rnd = random.Random(7)
        fk_range = int(keys * 1.1)
        payloads = [ser({"eid": i, "fk": f"k{rnd.randrange(fk_range)}", "amount": 1.0, "ts": 0}) for i in range(4096)]
        start_offsets = end_offsets(self.conf, out)
        producer = Producer({**self.conf, "linger.ms": 5})
        sent_ms: list[int] = []
        started = time.monotonic()
        while time.monotonic() - started < LATENCY_S:
            due = int((time.monotonic() - started) * rate)
            while len(sent_ms) < due:
                now_ms = int(time.time() * 1000)
                producer.produce(events, key=str(len(sent_ms)).encode(), value=payloads[len(sent_ms) % 4096],
                                 timestamp=now_ms)
                sent_ms.append(now_ms)
                producer.poll(0)
            time.sleep(0.001)
        producer.flush(30)
        sent = len(sent_ms)
        consumer = Consumer({**self.conf, "group.id": f"bench_peers_lat_{uuid.uuid4().hex[:6]}",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(out, p, o) for p, o in start_offsets.items()])
        lat: dict[int, int] = {}
        deadline = time.monotonic() + 90
        while len(lat) < sent and time.monotonic() < deadline:
            for msg in consumer.consume(10000, 0.5):
                if msg.error() or msg.key() is None or msg.key()[:1] == b"p":
                    continue
                seq = int(msg.key())
                lat.setdefault(seq, msg.timestamp()[1] - sent_ms[seq])
        consumer.close()
        skip = int(WARMUP_S * rate)
        steady = sorted(v for seq, v in lat.items() if seq >= skip)
        every = sorted(lat.values())
        figures = {"rate_per_s": rate, "seconds": LATENCY_S, "sent": sent, "received": len(lat),
                   "produce_rate_eps": sent / LATENCY_S}
        # the worst latency of the events sent in each second: a stall (a checkpoint boundary of real-time mode,
        # a rebalance, a GC pause) shows as one or two high seconds, a side that cannot keep up as a rising line
        by_second = [0] * (int(LATENCY_S) + 1)
        for seq, v in lat.items():
            second = min(len(by_second) - 1, (sent_ms[seq] - sent_ms[0]) // 1000)
            by_second[second] = max(by_second[second], v)
        figures["max_ms_by_second"] = by_second
        if steady:
            figures |= {"p50_ms": percentile(steady, 0.5), "p90_ms": percentile(steady, 0.9),
                        "p99_ms": percentile(steady, 0.99), "p999_ms": percentile(steady, 0.999),
                        "max_ms": steady[-1], "all_p99_ms": percentile(every, 0.99)}
        return figures

    def latency(self, ref: str, keys: int, rate: int) -> None:
        """Both sides at ``rate`` events/s, one after the other, each on new events and output topics."""
        label = f"{rate // 1000}k"
        # Kafka Streams: a fresh application id (auto.offset.reset earliest on an empty events topic)
        events, out = self.topics.create(f"ks_lat_events_{label}"), self.topics.output(f"ks_lat_out_{label}")
        log.info("Kafka Streams latency run at %d/s", rate)
        app = self.topics.name(f"ks_lat_app_{label}")
        proc = subprocess.Popen(self.ks_cmd(f"lat-{label}", "app", *self.ks_app_args(app, ref, events, out)),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            self.probe(events, out, lambda: proc.poll() is None)
            ks = self.drive(events, out, rate, keys)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                output, _ = proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                output, _ = proc.communicate()
            (self.tmp / f"ks-lat-{label}.out").write_text(output or "")
        # the job in real-time mode
        events, out = self.topics.create(f"rt_lat_events_{label}"), self.topics.output(f"rt_lat_out_{label}")
        log.info("threes real-time latency run at %d/s", rate)
        job = self.job(ref, events, out)
        job.start()
        try:
            self.probe(events, out, lambda: self.job_alive(job))
            ours = self.drive(events, out, rate, keys)
        finally:
            job.stop(checkpoint=False)
        self.results[f"latency_{label}"] = {"keys": keys, "kafka_streams": ks, "realtime": ours,
                                            "checkpoint_interval": CHECKPOINT_INTERVAL}
        for side, m in (("realtime", ours), ("kafka_streams", ks)):
            if "p99_ms" in m:
                self.results[f"latency_p50_ms_{side}_{label}"] = m["p50_ms"]
                self.results[f"latency_p99_ms_{side}_{label}"] = m["p99_ms"]
        if "p99_ms" in ks and "p99_ms" in ours:
            ratio = ks["p99_ms"] / ours["p99_ms"] if ours["p99_ms"] else 0.0
            self.results[f"latency_p99_ratio_vs_kafka_streams_{label}"] = round(ratio, 3)
            target = "; target p99 <= 100 ms, KS/ours >= 0.25" if rate == 20_000 else ""
            self.rows.append((f"latency p99 at {rate:,}/s, KS / realtime", f"{ratio:.2f}x", target.lstrip("; ")))
        for name, m in (("Kafka Streams", ks), ("threes realtime", ours)):
            self.rows.append((
                f"{name} latency at {rate:,}/s, {size_label(keys)} keys",
                f"p50 {m.get('p50_ms', '-')} ms",
                f"p99 {m.get('p99_ms', '-')} ms, p99.9 {m.get('p999_ms', '-')} ms, max {m.get('max_ms', '-')} ms "
                f"(after {WARMUP_S:.0f} s; whole run p99 {m.get('all_p99_ms', '-')} ms); "
                f"{m['received']:,}/{m['sent']:,} received, produced at {m['produce_rate_eps']:,.0f}/s",
            ))

    # -- the run ------------------------------------------------------------------------------------

    def main(self) -> None:
        if not LOOKUP.is_file():
            raise FileNotFoundError(f"{LOOKUP} is missing: build it with `make jvm`")
        refs: list[str] = []
        for keys in KEYS:
            try:
                refs.append(self.throughput(keys))
            except Exception as exc:  # a size that cannot run here is reported, the others stand
                log.exception("%s keys failed", f"{keys:,}")
                self.results[f"error_{size_label(keys)}"] = f"{type(exc).__name__}: {str(exc)[-500:]}"
                self.rows.append((f"{size_label(keys)} keys", "failed", f"{type(exc).__name__}: {str(exc)[:200]}"))
        for rate in RATES if refs else []:
            self.latency(refs[0], KEYS[0], rate)
        self.print()

    def print(self) -> None:
        width = max(len(r[0]) for r in self.rows)
        print(f"\nrealtime_vs_kstreams benchmark: {EVENTS:,} events, keys {', '.join(f'{k:,}' for k in KEYS)}; "
              f"threes local[2] real-time mode (checkpoint {CHECKPOINT_INTERVAL}); Kafka Streams 4.3.1, 2 threads; "
              f"{load_note()}")
        for name, value, note in self.rows:
            print(f"  {name:<{width}}  {value:>14}  {note}")
        print(json.dumps({"benchmark": "realtime_vs_kstreams", "events": EVENTS, "keys": KEYS, "rates": RATES,
                          "latency_s": LATENCY_S, **self.results}, default=float))

    def close(self) -> None:
        if self.spark is not None:
            self.spark.stop()
        self.topics.drop()
        shutil.rmtree(self.tmp, ignore_errors=True)


if __name__ == "__main__":
    run_bench(Bench)
