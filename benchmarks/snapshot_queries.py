"""Interactive queries while the job runs: p50/p99 latency at a fixed rate (issue #39).

Run: ``python benchmarks/snapshot_queries.py`` (starts Kafka from the local stack if needed).

A job with a ``THREES_BENCH_QUERY_KEYS``-key snapshot (default 10,000; ``retention`` set, so
its versions are written too) enriches ``THREES_BENCH_EVENTS`` events (default 500,000, in
micro-batches of ``THREES_BENCH_BATCH``) while a client in another process (no shared GIL)
sends ``GET /snapshots/airports/{key}`` at ``THREES_BENCH_QUERY_RATE`` queries/s (default
1,000) for ``THREES_BENCH_QUERY_S`` seconds (default 20), random keys, on up to 64
keep-alive connections (:func:`client`). Each query's latency
counts from the time it was *scheduled* (no coordinated omission: a slow answer delays the
next ones and they count it). Target: p99 <= 20 ms. The last line is the JSON of the figures.
"""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import os
import random
import socket
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))

from peers import open_loop_queries, size_label  # noqa: E402 - the issue's JSON keys name sizes alike (iq_p99_ms_10k)

KEYS = int(os.environ.get("THREES_BENCH_QUERY_KEYS", "10000"))
RATE = int(os.environ.get("THREES_BENCH_QUERY_RATE", "1000"))
SECONDS = float(os.environ.get("THREES_BENCH_QUERY_S", "20"))
EVENTS = int(os.environ.get("THREES_BENCH_EVENTS", "500000"))
log = logging.getLogger("snapshot_queries")


def client(port: int, keys: int, rate: int, seconds: float, out: Any) -> None:
    """Query random keys at ``rate``/s for ``seconds`` (:func:`peers.open_loop_queries`), each answer checked."""
    rng = random.Random(7)
    keys_sent = [f"K{rng.randrange(keys):07d}" for _ in range(int(rate * seconds))]
    open_loop_queries(port, [f"/snapshots/airports/{k}" for k in keys_sent], rate, out, "faa", keys_sent)


def main() -> None:
    import tempfile
    import uuid

    from stream_join import EVENT, KEY, VALUE, write_events_topic, write_snapshot_topic

    from kernel.config.models import KafkaConfig
    from schemas.store import SchemaStore
    from stream_app.config import StreamJobConfig
    from stream_app.job import StreamJob
    from stream_app.session import spark_session
    from stream_app.spark_settings import SparkSettings
    from threes.local import LocalStack

    stack = LocalStack()  # Kafka must be running (threes local up): nothing is started here
    kafka = KafkaConfig(bootstrap_servers=stack.endpoints().kafka_bootstrap)
    spark = spark_session(SparkSettings(master="local[2]", app_name="threes-bench-queries", driver_memory="2g"),
                          stack.spark_jars())
    tmp = Path(tempfile.mkdtemp(prefix="threes-bench-queries-"))
    store = SchemaStore(kafka.librdkafka_config(), kafka.schema_topic)
    for schema, name in ((KEY, "key"), (VALUE, "value"), (EVENT, "event")):
        store.register(schema)
        (tmp / f"{name}.avsc").write_text(json.dumps(schema))
    run = uuid.uuid4().hex[:8]
    snapshot_topic, events_topic = f"bench.qsnap.{run}", f"bench.qevents.{run}"
    write_snapshot_topic(spark, kafka, snapshot_topic, KEYS)
    write_events_topic(spark, kafka, events_topic, EVENTS, stride=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    config = StreamJobConfig.model_validate({
        "name": f"bench-queries-{run}",
        "events": {"topic": events_topic, "value_schema": "event.avsc", "starting_offsets": "earliest",
                   "max_offsets_per_trigger": 20_000},
        "snapshots": [{"name": "airports", "topics": [snapshot_topic], "key_schema": "key.avsc",
                       "value_schema": "value.avsc", "retention": "7 days"}],
        "lookups": [{"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_"}],
        "enriched_topic": f"bench.qenriched.{run}", "dead_letter_topic": f"bench.qdlq.{run}",
        "trigger_interval_s": 1, "checkpoint_location": str(tmp / "checkpoint"), "metrics_port": port,
    })
    job = StreamJob(config, kafka, spark, base_dir=tmp)
    job.start()
    # the job's process serves the queries: its garbage collector's pauses stop the server's loop too
    pauses: list[tuple[int, float]] = []
    began: list[float] = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses.append((info["generation"], (time.perf_counter() - began[0]) * 1000))

    gc.callbacks.append(timed)
    batches_before = job.batches
    out: Any = multiprocessing.get_context("spawn").Queue()
    proc = multiprocessing.get_context("spawn").Process(target=client, args=(port, KEYS, RATE, SECONDS, out))
    proc.start()
    latencies, errors, slow = out.get(timeout=SECONDS * 10 + 120)
    proc.join()
    gc.callbacks.remove(timed)
    answered = dict(job.snapshot_queries.answered) if job.snapshot_queries is not None else {}
    batches = job.batches - batches_before
    job.stop(checkpoint=False)
    spark.stop()
    from kernel.kafka import clients

    topics = [snapshot_topic, events_topic, config.enriched_topic, config.dead_letter_topic]
    for future in clients.kafka_admin(kafka).delete_topics(topics).values():
        try:
            future.result(30)
        except Exception as exc:  # a topic never created: nothing to delete
            log.debug("topic not deleted: %s", exc)
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))]

    # the stretches (due times, s into the run) whose queries waited over 100 ms: one stall shows as one stretch
    stalls: list[list[float]] = []
    for due in sorted(slow):
        if stalls and due - stalls[-1][1] <= 0.05:
            stalls[-1][1] = due
        else:
            stalls.append([due, due])
    figures = {"benchmark": "snapshot_queries", "keys": KEYS, "rate_per_s": RATE, "seconds": SECONDS,
               "stalls_over_100ms_s": stalls[:20],
               "answered_on": answered,
               "gc_pauses": len(pauses), "gc_max_pause_ms": round(max((ms for _g, ms in pauses), default=0.0), 1),
               "gc_gen2_pauses_ms": [round(ms, 1) for g, ms in pauses if g == 2][:20],
               "queries": len(latencies), "errors": errors, "batches_meanwhile": batches,
               "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": latencies[-1]}
    figures[f"iq_p99_ms_{size_label(KEYS)}"] = figures["p99_ms"]
    print(f"\nsnapshot_queries benchmark: {KEYS:,} keys, {RATE:,} queries/s for {SECONDS:.0f} s while the job "
          f"ran {batches} micro-batches: p50 {figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms "
          f"(target <= 20 ms), {errors} errors")
    print(json.dumps(figures))


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("THREES_BENCH_LOG", "WARNING"), format="%(asctime)s %(name)s %(message)s")
    main()
