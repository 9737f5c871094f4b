"""The JVM state store against Kafka Streams' GlobalKTable store, side by side on the same topic (issue #48).

Run: ``python benchmarks/state_store.py`` (the local stack's Kafka must be up; the lookup jar built,
``make jvm``; Maven and a JDK 17 build the peer on first use). Run it alone on a quiet machine: the
JSON records the load average before and after.

Per size (``THREES_BENCH_STORE_KEYS``, default ``10000,1000000``), the reference's own loader
(``ref.Main load``) writes a compacted topic of N keys (``k<i>``, ``bench.Ref`` values in Avro
single-object encoding) and a few events. Then, one side at a time:

* **Restore** (empty state folder to ready): ``threes serve``'s JVM (``threes.store.ServeMain`` with
  the local stack's jars, 2 GB heap) and the reference app with ``--iq-port`` (its global store is
  RocksDB; heap 2 GB). Both are timed the same way, from process start until a query of the last
  key ``k<N-1>`` answers 200: keys/s = N / seconds. ``restore_ratio_vs_kafka_streams_<size>`` is ours
  / theirs (target >= 1.0). Kafka Streams' own ``restore_keys_per_s`` is reported beside it.
* **Restart after kill -9** (ours): the same folder, started again: ``restart_ready_s_<size>``
  (target <= 5 at 10M).
* **Interactive queries, idle**: an open-loop client in its own process (wrk2's model: query i is
  due at ``start + i / rate`` and its latency counts from then) sends ``THREES_BENCH_STORE_RATE``
  (2,000) queries/s of random keys for ``THREES_BENCH_STORE_QUERY_S`` (20 s) on up to 64 keep-alive
  connections, after a 5 s warm-up at the same rate: ``iq_idle_p99_ms_<size>`` for each side and
  ``iq_idle_p99_ratio_vs_kafka_streams_<size>`` = theirs / ours (target >= 1.0).

* **Interactive queries while processing** (the first size, unless ``THREES_BENCH_STORE_LOADED=0``):
  each side enriches events produced at ``THREES_BENCH_STORE_EVENT_RATE`` (20,000/s, one Python
  producer, as ``realtime_vs_kstreams.py`` drives its latency runs) while the same query client runs:
  the reference app with ``--iq-port``, and the job in real-time mode (local[2], driver 4 GB) with
  ``stream.query_port``, whose driver JVM holds the stores (local[*]: the executors' own).
  ``iq_p99_ms_<size>`` (target <= 5) and ``iq_p99_ratio_vs_kafka_streams_<size>`` = theirs / ours
  (target >= 1.0); each side's enrichment latency p99 is reported beside it.

Not measured here: the throughput ratios (``realtime_vs_kstreams.py``) and the 100M-key load.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from peers import load_note, open_loop_queries, percentile, size_label  # noqa: E402
from realtime_vs_kstreams import Bench as PeerBench  # noqa: E402
from stream_join import KS_REF  # noqa: E402

SIZES = [int(n) for n in os.environ.get("THREES_BENCH_STORE_KEYS", "10000,1000000").split(",")]
RATE = int(os.environ.get("THREES_BENCH_STORE_RATE", "2000"))
QUERY_S = float(os.environ.get("THREES_BENCH_STORE_QUERY_S", "20"))
WARMUP_S = float(os.environ.get("THREES_BENCH_STORE_WARMUP_S", "5"))
HEAP = os.environ.get("THREES_BENCH_STORE_HEAP", "2g")
LOADED = os.environ.get("THREES_BENCH_STORE_LOADED", "1") != "0"
EVENT_RATE = int(os.environ.get("THREES_BENCH_STORE_EVENT_RATE", "20000"))
READY_TIMEOUT_S = float(os.environ.get("THREES_BENCH_STORE_TIMEOUT_S", "900"))
log = logging.getLogger("state_store")


def client(port: int, prefix: str, keys: int, rate: int, seconds: float, out: Any) -> None:
    """Query ``{prefix}k<i>`` of random keys at ``rate``/s for ``seconds`` (:func:`peers.open_loop_queries`)."""
    rng = random.Random(7)
    open_loop_queries(port, [f"{prefix}k{rng.randrange(keys)}" for _ in range(int(rate * seconds))], rate, out)


def query_load(port: int, prefix: str, keys: int) -> dict[str, float]:
    """A warm-up, then the measured run: p50/p99/max ms and errors."""
    ctx = multiprocessing.get_context("spawn")
    figures: dict[str, float] = {}
    for seconds, measured in ((WARMUP_S, False), (QUERY_S, True)):
        out: Any = ctx.Queue()
        proc = ctx.Process(target=client, args=(port, prefix, keys, RATE, seconds, out))
        proc.start()
        latencies, errors, _slow = out.get(timeout=seconds * 10 + 120)
        proc.join()
        if measured:
            latencies.sort()
            figures = {
                "p50_ms": round(percentile(latencies, 0.50), 2),
                "p99_ms": round(percentile(latencies, 0.99), 2),
                "max_ms": round(latencies[-1], 1),
                "errors": errors,
                "queries": len(latencies),
            }
    return figures


def wait_answer(url: str, deadline: float, proc: subprocess.Popen[Any]) -> float:
    """Poll ``url`` until it answers 200; the monotonic time it did."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} ended ({proc.returncode}) before answering {url}")
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                if resp.status == 200:
                    return time.monotonic()
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.02)
    raise RuntimeError(f"{url} did not answer 200 in time")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class StoreBench(PeerBench):
    """One run: per size, restore, restart and idle queries of both sides."""

    def ours(self, ref: str, state: Path, port: int) -> tuple[subprocess.Popen[Any], float]:
        """Start ``ServeMain`` on ``ref``; ``(process, monotonic start time)``."""
        from stream_app.realtime import consumer_properties
        from stream_app.serve import ServedSnapshot, java_command, write_specs
        from threes.local import LocalStack

        snap = ServedSnapshot("refs", (ref,), None, json.dumps(KS_REF), 256 << 20, None)
        spec = write_specs([snap], consumer_properties(self.conf), self.kafka.schema_topic, state)
        command = java_command(LocalStack().spark_jars(), HEAP)
        log_file = (self.tmp / "serve.log").open("ab")
        began = time.monotonic()
        proc = subprocess.Popen(
            [*command, str(spec), "127.0.0.1", str(port)], stdout=subprocess.DEVNULL, stderr=log_file
        )
        return proc, began

    def theirs(self, ref: str, events: str, port: int) -> tuple[subprocess.Popen[Any], float]:
        app = f"bench-store-{uuid.uuid4().hex[:6]}"
        out = self.topics.name("ks-out")
        self.topics.adopt(out)
        args = self.ks_app_args(app, ref, events, out)
        began = time.monotonic()
        proc = subprocess.Popen(
            self.ks_cmd(app, "app", *args, f"--iq-port={port}"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return proc, began

    def size(self, keys: int) -> None:
        label = size_label(keys)
        ref, events = self.topics.name("ref"), self.topics.name("events")
        self.topics.adopt(ref, events)
        self.ks_run(
            f"load-{label}", "load", f"--n={keys}", "--e=1000", f"--ref-topic={ref}", f"--events-topic={events}"
        )
        last = f"k{keys - 1}"

        state = self.tmp / f"state-{label}"
        port = free_port()
        proc, began = self.ours(ref, state, port)
        ready = wait_answer(f"http://127.0.0.1:{port}/snapshots/refs/{last}", began + READY_TIMEOUT_S, proc)
        ours_s = ready - began
        ours_q = query_load(port, "/snapshots/refs/", keys)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        disk = sum(p.stat().st_size for p in state.rglob("*") if p.is_file())
        proc, began = self.ours(ref, state, port)  # kill -9, then the same folder
        restart_s = wait_answer(f"http://127.0.0.1:{port}/snapshots/refs/{last}", began + READY_TIMEOUT_S, proc) - began
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)

        ks_port = free_port()
        ks, began = self.theirs(ref, events, ks_port)
        ks_s = wait_answer(f"http://127.0.0.1:{ks_port}/ref/{last}", began + READY_TIMEOUT_S, ks) - began
        ks_q = query_load(ks_port, "/ref/", keys)
        ks.send_signal(signal.SIGTERM)
        try:
            ks.wait(60)
        except subprocess.TimeoutExpired:
            ks.kill()
        shutil.rmtree(self.tmp / "ks-state", ignore_errors=True)

        r = self.results
        r[f"restore_keys_per_s_threes_{label}"] = round(keys / ours_s)
        r[f"restore_keys_per_s_kafka_streams_{label}"] = round(keys / ks_s)
        r[f"restore_ratio_vs_kafka_streams_{label}"] = round(ks_s / ours_s, 3)
        r[f"restart_ready_s_{label}"] = round(restart_s, 2)
        r[f"state_disk_bytes_{label}"] = disk
        r[f"iq_idle_p99_ms_{label}"] = ours_q["p99_ms"]
        r[f"iq_idle_p50_ms_{label}"] = ours_q["p50_ms"]
        r[f"iq_idle_errors_{label}"] = ours_q["errors"]
        r[f"iq_idle_p99_ms_kafka_streams_{label}"] = ks_q["p99_ms"]
        r[f"iq_idle_p50_ms_kafka_streams_{label}"] = ks_q["p50_ms"]
        r[f"iq_idle_errors_kafka_streams_{label}"] = ks_q["errors"]
        r[f"iq_idle_p99_ratio_vs_kafka_streams_{label}"] = round(ks_q["p99_ms"] / max(ours_q["p99_ms"], 0.01), 3)
        self.rows.append(
            (
                label,
                f"restore {keys / ours_s:,.0f} keys/s (ks {keys / ks_s:,.0f}); restart {restart_s:.1f} s",
                f"iq p99 {ours_q['p99_ms']} ms (ks {ks_q['p99_ms']} ms)",
            )
        )

    def loaded_queries(self, side: str, port: int, prefix: str, events: str, out: str, keys: int) -> dict[str, Any]:
        """The query client while this process produces ``EVENT_RATE`` events/s into ``events``."""
        import threading

        import realtime_vs_kstreams

        realtime_vs_kstreams.LATENCY_S = WARMUP_S + QUERY_S + 5
        driven: dict[str, Any] = {}
        producer = threading.Thread(target=lambda: driven.update(self.drive(events, out, EVENT_RATE, keys)))
        producer.start()
        time.sleep(2)
        figures = query_load(port, prefix, keys)
        producer.join()
        log.info("%s: queries %s; enrichment %s", side, figures, {k: driven.get(k) for k in ("p99_ms", "received")})
        return {
            **figures,
            "enrich_p99_ms": driven.get("p99_ms"),
            "enriched": driven.get("received"),
            "produced_per_s": round(driven.get("produce_rate_eps", 0)),
        }

    def under_load(self, keys: int) -> None:
        """Both sides' queries while each enriches ``EVENT_RATE`` events/s, one side at a time."""
        from stream_app.config import StreamJobConfig
        from stream_app.job import StreamJob

        label = size_label(keys)
        ref, loaded_events = self.topics.name("ref"), self.topics.name("unused")
        self.topics.adopt(ref, loaded_events)  # the loader writes one event there: dropped with the rest
        self.ks_run(
            f"load-loaded-{label}",
            "load",
            f"--n={keys}",
            "--e=1",
            f"--ref-topic={ref}",
            f"--events-topic={loaded_events}",
        )
        events, out = self.topics.create("ks_iq_events"), self.topics.output("ks_iq_out")
        port = free_port()
        app = self.topics.name("ks_iq_app")
        proc = subprocess.Popen(
            self.ks_cmd("iq-loaded", "app", *self.ks_app_args(app, ref, events, out), f"--iq-port={port}"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        try:
            self.probe(events, out, lambda: proc.poll() is None)
            ks = self.loaded_queries("kafka streams", port, "/ref/", events, out, keys)
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        events, out = self.topics.create("rt_iq_events"), self.topics.output("rt_iq_out")
        dlq = self.topics.name("iq_dlq")
        self.topics.adopt(dlq)
        port = free_port()
        config = StreamJobConfig.model_validate(
            {
                "name": f"bench-store-rt-{uuid.uuid4().hex[:6]}",
                "mode": "realtime",
                "checkpoint_interval": "30 seconds",
                "events": {"topic": events, "value_schema": "event.avsc", "starting_offsets": "earliest"},
                "snapshots": [
                    {
                        "name": "refs",
                        "topics": [ref],
                        "key_format": "string",
                        "key_field": "key",
                        "value_schema": "ref.avsc",
                    }
                ],
                "lookups": [{"snapshot": "refs", "on": {"fk": "key"}, "prefix": "ref_"}],
                "enriched_topic": out,
                "dead_letter_topic": dlq,
                "query_port": port,
                "checkpoint_location": str(self.tmp / f"cp-{uuid.uuid4().hex[:6]}"),
            }
        )
        job = StreamJob(config, self.kafka, self.session(), base_dir=self.tmp)
        job.start()
        try:
            self.probe(events, out, lambda: self.job_alive(job))
            ours = self.loaded_queries("threes realtime", port, "/snapshots/refs/", events, out, keys)
        finally:
            job.stop(checkpoint=False)
        r = self.results
        r[f"iq_loaded_{label}"] = {"event_rate": EVENT_RATE, "threes": ours, "kafka_streams": ks}
        r[f"iq_p99_ms_{label}"] = ours["p99_ms"]
        r[f"iq_p99_ms_kafka_streams_{label}"] = ks["p99_ms"]
        r[f"iq_p99_ratio_vs_kafka_streams_{label}"] = round(ks["p99_ms"] / max(ours["p99_ms"], 0.01), 3)
        self.rows.append(
            (
                label,
                f"iq p99 at {EVENT_RATE:,} events/s {ours['p99_ms']} ms (ks {ks['p99_ms']} ms)",
                f"enrich p99 {ours['enrich_p99_ms']} ms (ks {ks['enrich_p99_ms']} ms)",
            )
        )

    def main(self) -> None:  # type: ignore[override]
        self.results.update(
            {
                "benchmark": "state_store",
                "load_before": os.getloadavg()[0],
                "rate_per_s": RATE,
                "query_s": QUERY_S,
                "heap": HEAP,
                "note": load_note(),
            }
        )
        for keys in SIZES:
            try:
                self.size(keys)
            except Exception as exc:  # one size failing leaves the others' figures
                log.exception("size %d failed", keys)
                self.results[f"error_{size_label(keys)}"] = str(exc)[:500]
        if LOADED:
            try:
                self.under_load(SIZES[0])
            except Exception as exc:
                log.exception("queries under load failed")
                self.results["error_loaded"] = str(exc)[:500]
        self.results["load_after"] = os.getloadavg()[0]

    def print(self) -> None:
        for row in self.rows:
            print(" | ".join(row))
        print(json.dumps(self.results))


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("THREES_BENCH_LOG", "INFO"), format="%(asctime)s %(name)s %(message)s")
    bench = StoreBench()
    try:
        bench.main()
        bench.print()
    finally:
        bench.close()
