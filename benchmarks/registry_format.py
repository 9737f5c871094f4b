"""Registry-format topics against single-object ones: the stream job's events/s on the same data (issue #43).

Run: ``python benchmarks/registry_format.py`` (``THREES_BENCH_REG_EVENTS`` events per batch, default
100,000; ``THREES_BENCH_REG_KEYS`` snapshot keys, default 2,000; ``THREES_BENCH_REG_ROUNDS``, default 3;
``THREES_BENCH_REG_MASTER``, default ``local[2]``).

The same flights and airports are encoded twice with fastavro: in the single-object form (writer
schemas by fingerprint) and in Confluent's wire format (a ``mock://`` registry's ids, two writer
versions of each subject). Both run through the job's own code: the snapshot's
:func:`~stream_app.snapshot.decoding.record_decoder` and :func:`~stream_app.snapshot.data.latest_per_key`
(a bootstrap), then the micro-batch plan (:class:`stream_app.batch.BatchPlan`: decode, two lookups
into the snapshot, encode) over Kafka-shaped rows, into Spark's ``noop`` sink. The registry path is
the single-object one after a ``CASE`` over the known ids swaps the 5-byte prefix (schemas cached:
no registry request during a batch). Rounds alternate the formats; the best of each counts. Target:
registry >= 0.95x single-object. The last line is the JSON of the figures.
"""

from __future__ import annotations

import io
import json
import logging
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EVENTS = int(os.environ.get("THREES_BENCH_REG_EVENTS", "100000"))
KEYS = int(os.environ.get("THREES_BENCH_REG_KEYS", "2000"))
ROUNDS = int(os.environ.get("THREES_BENCH_REG_ROUNDS", "3"))
MASTER = os.environ.get("THREES_BENCH_REG_MASTER", "local[2]")
log = logging.getLogger("registry_format")


def _encoded(schema: dict[str, Any], records: list[dict[str, Any]]) -> list[bytes]:
    import fastavro

    parsed = fastavro.parse_schema(schema)
    out = []
    for record in records:
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, record)
        out.append(buf.getvalue())
    return out


def main() -> None:
    import datetime as dt

    import pyarrow as pa
    from pyspark.sql import functions as f

    from kernel.config.models import SchemaRegistryConfig
    from schemas import load_schema
    from schemas.serde import MARKER, fingerprint
    from stream_app.batch import BatchPlan
    from stream_app.config import StreamJobConfig
    from stream_app.enrich import BoundLookup
    from stream_app.plan import build_plan
    from stream_app.plan.writer_match import writers_for
    from stream_app.session import spark_session
    from stream_app.snapshot.data import latest_per_key
    from stream_app.snapshot.decoding import RecordFormats, record_decoder
    from stream_app.snapshot.view import SnapshotView
    from stream_app.spark_settings import SparkSettings
    from stream_app.writers import RegistryWriters
    from threes.local import LocalStack

    flight, airport, airport_key = (load_schema(f"nycflights13/{n}") for n in ("flight", "airport", "airport_key"))
    # a second writer version of each value subject: the reader resolves both
    airport2 = {**airport, "fields": [*airport["fields"], {"name": "runways", "type": "int", "default": 1}]}
    registry = SchemaRegistryConfig(url="mock://bench-registry-format")
    writers = RegistryWriters(registry, ["flights-value", "airports-key", "airports-value"])
    from schemas.registry import register_topic_schema

    ids = {
        "flight": register_topic_schema(writers.client, "flights", flight, is_key=False),
        "key": register_topic_schema(writers.client, "airports", airport_key, is_key=True),
        "airport": register_topic_schema(writers.client, "airports", airport, is_key=False),
        "airport2": register_topic_schema(writers.client, "airports", airport2, is_key=False),
    }
    writers.refresh()
    single = {fingerprint(s): json.dumps(s) for s in (flight, airport, airport_key, airport2)}

    codes = [f"A{i:04d}" for i in range(KEYS)]
    airports = [{"faa": c, "name": f"airport {c}", "lat": 40.0, "lon": -74.0, "alt": i % 1000, "tz": -5,
                 "dst": "A", "tzone": "America/New_York"} for i, c in enumerate(codes)]
    t0 = dt.datetime(2013, 1, 1, tzinfo=dt.UTC)
    fields = {fl["name"] for fl in flight["fields"]}
    sample = {"year": 2013, "month": 1, "day": 1, "dep_time": 517, "sched_dep_time": 515, "dep_delay": 2.0,
              "arr_time": 830, "sched_arr_time": 819, "arr_delay": 11.0, "carrier": "UA", "flight": 1545,
              "tailnum": "N14228", "air_time": 227.0, "distance": 1400.0, "hour": 5, "minute": 15, "time_hour": t0}
    flights = [{**{k: v for k, v in sample.items() if k in fields}, "flight_id": i,
                "origin": codes[i % KEYS], "dest": codes[(i * 7) % KEYS]} for i in range(EVENTS)]
    flights = [{k: v for k, v in fl.items() if k in fields} for fl in flights]

    def frame(key: str, value: str, single_ids: bool, bodies: list[bytes], schema_key: str) -> list[bytes]:
        prefix = MARKER + fingerprint(load_or(schema_key)) if single_ids else b"\x00" + struct.pack(">I", ids[key])
        return [prefix + b for b in bodies]

    schema_of = {"flight": flight, "key": airport_key, "airport": airport, "airport2": airport2}

    def load_or(name: str) -> dict[str, Any]:
        return schema_of[name]

    started = time.monotonic()
    bodies = {
        "flight": _encoded(flight, flights),
        "key": _encoded(airport_key, [{"faa": c} for c in codes]),
        "airport": _encoded(airport, airports[: KEYS // 2]),
        "airport2": _encoded(airport2, [{**a, "runways": 2} for a in airports[KEYS // 2:]]),
    }
    encode_s = time.monotonic() - started

    spark = spark_session(SparkSettings(master=MASTER, app_name="threes-bench-registry", driver_memory="1g"),
                          LocalStack().spark_jars())
    spark.conf.set("spark.sql.adaptive.enabled", "false")  # as in a streaming micro-batch's plan
    config = StreamJobConfig.model_validate({
        "events": {"topic": "flights", "value_schema": "nycflights13/flight", "value_format": "confluent_avro"},
        "snapshots": [{"name": "airports", "topics": ["airports"], "key_schema": "nycflights13/airport_key",
                       "value_schema": "nycflights13/airport"}],
        "lookups": [{"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_"},
                    {"snapshot": "airports", "on": {"dest": "faa"}, "prefix": "dest_", "fields": ["name"]}],
        "enriched_topic": "flights.enriched", "dead_letter_topic": "flights.dlq", "checkpoint_location": "/tmp/x",
    })
    single_cfg = config.model_copy(update={"events": config.events.model_copy(update={"value_format": "avro"})})
    plans = {"registry": build_plan(config, spark), "single_object": build_plan(single_cfg, spark)}
    snap_plan = plans["registry"].snapshots["airports"]
    all_writers = {**single, **writers.schemas_json()}
    headers = writers.headers()

    def kafka_rows(topic: str, keys: list[bytes], values: list[bytes]) -> Any:
        n = len(values)
        table = pa.table({
            "key": pa.array(keys, pa.binary()), "value": pa.array(values, pa.binary()),
            "topic": [topic] * n, "partition": pa.array([i % 4 for i in range(n)], pa.int32()),
            "offset": pa.array(range(n), pa.int64()),
            "timestamp": pa.array([0] * n, pa.timestamp("us", tz="UTC")),
            "headers": pa.array([None] * n, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        })
        return spark.createDataFrame(table).persist()

    data: dict[str, dict[str, Any]] = {}
    for fmt in plans:
        one = fmt == "single_object"
        snap_keys = frame("key", "", one, bodies["key"], "key")
        snap_values = (frame("airport", "", one, bodies["airport"], "airport")
                       + frame("airport2", "", one, bodies["airport2"], "airport2"))
        events = frame("flight", "", one, bodies["flight"], "flight")
        data[fmt] = {
            "snapshot": kafka_rows("airports", snap_keys, snap_values),
            "events": kafka_rows("flights", [str(i).encode() for i in range(EVENTS)], events),
        }
        data[fmt]["events"].count()
        data[fmt]["snapshot"].count()

    def snapshot_of(fmt: str) -> Any:
        relevant = {**writers_for(all_writers, snap_plan.key.avro), **writers_for(all_writers, snap_plan.value.avro)}
        formats = RecordFormats(value_format="confluent_avro" if fmt == "registry" else "avro",
                                headers=headers if fmt == "registry" else {})
        decode = record_decoder(relevant, snap_plan.key.json, snap_plan.value.json, snap_plan.key.spark_type,
                                {"airports": 0}, "confluent_avro" if fmt == "registry" else "avro", formats=formats)
        return latest_per_key(decode(data[fmt]["snapshot"]))

    def run_events(fmt: str, view: SnapshotView) -> None:
        batch = BatchPlan(plans[fmt])
        frame_ = batch.frame(data[fmt]["events"], all_writers, headers if fmt == "registry" else None)
        lookups = [BoundLookup(lk, view) for lk in config.lookups]
        batch.records(frame_, lookups, {"airports": view}).write.format("noop").mode("overwrite").save()

    seconds: dict[str, dict[str, list[float]]] = {"snapshot": {n: [] for n in plans}, "events": {n: [] for n in plans}}
    views: dict[str, SnapshotView] = {}
    checks: dict[str, Any] = {}
    try:
        for fmt in plans:  # correctness first: both formats give the same snapshot and the same enriched events
            rows = snapshot_of(fmt).cache()
            checks[fmt] = rows.count()
            # the view the job's broadcast engine joins: __lk, __lh and the value fields, one row per key
            views[fmt] = SnapshotView("airports", snap_plan.key.spark_type, snap_plan.value.spark_type, {},
                                      "broadcast", checks[fmt], base_df=rows)
        assert checks["registry"] == checks["single_object"] == KEYS, checks
        enriched = {fmt: BatchPlan(plans[fmt]).frame(data[fmt]["events"], all_writers, headers)
                    .filter(f.col("__error").isNull()).count() for fmt in plans}
        assert enriched["registry"] == enriched["single_object"] == EVENTS, enriched
        for r in range(ROUNDS):
            for fmt in (plans if r % 2 == 0 else reversed(list(plans))):
                t = time.monotonic()
                snapshot_of(fmt).write.format("noop").mode("overwrite").save()
                seconds["snapshot"][fmt].append(time.monotonic() - t)
                t = time.monotonic()
                run_events(fmt, views[fmt])
                seconds["events"][fmt].append(time.monotonic() - t)
                log.info("round %d %s snapshot %.2f s events %.2f s", r, fmt, seconds["snapshot"][fmt][-1],
                         seconds["events"][fmt][-1])
    finally:
        spark.stop()
    rate = {part: {fmt: (EVENTS if part == "events" else KEYS) / min(s) for fmt, s in by.items()}
            for part, by in seconds.items()}
    ratio = rate["events"]["registry"] / rate["events"]["single_object"]
    snapshot_ratio = rate["snapshot"]["registry"] / rate["snapshot"]["single_object"]
    load = os.getloadavg()
    print(f"\nregistry_format benchmark: {MASTER}, {EVENTS:,} events, {KEYS:,} snapshot keys, best of {ROUNDS}; "
          f"encoded in {encode_s:.1f} s; load average {load[0]:.1f}")
    for part, by in rate.items():
        for fmt, value in by.items():
            print(f"  {part:<8} {fmt:<13} {value:>12,.0f} records/s  rounds "
                  + " ".join(f"{x:.2f}" for x in seconds[part][fmt]))
    print(f"  registry / single-object: events {ratio:.2f}x (target >= 0.95x), snapshot {snapshot_ratio:.2f}x")
    print(json.dumps({"benchmark": "registry_format", "events": EVENTS, "keys": KEYS, "rounds": ROUNDS,
                      "master": MASTER, "load_average_1m": round(load[0], 1),
                      "events_per_s": {k: round(v) for k, v in rate["events"].items()},
                      "snapshot_records_per_s": {k: round(v) for k, v in rate["snapshot"].items()},
                      "ratio_registry_vs_single_object": round(ratio, 3),
                      "ratio_registry_vs_single_object_snapshot": round(snapshot_ratio, 3)}))


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("THREES_BENCH_LOG", "INFO"), format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    main()
