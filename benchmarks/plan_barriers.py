"""A filter Spark pushes below expensive columns, against ``stream_app.columns.rows_where``.

Run: ``python benchmarks/plan_barriers.py`` (Spark only, local[2]; no other service).

Spark's optimizer pushes a filter below the projections under it and copies the
expressions the predicate reads into it. Side by side, in one Spark session, on
the same cached input, best of ``THREES_BENCH_ROUNDS`` (3) rounds each,
alternating:

1. **decode and drop** (the aggregation's input): ``THREES_BENCH_RECORDS``
   (2,000,000) single-object Avro records of a 6-field schema, decoded by
   ``decode_avro`` + ``corrupt_to_null``; undecodable ones dropped by a ``filter``
   (baseline) or by ``stream_app.updates.aggregation_input`` (``rows_where``).
   ``from_avro`` calls in each optimized plan are printed;
2. **inner lookup in Python** (indexed engine): ``THREES_BENCH_EVENTS``
   (400,000) events against a 10k-key snapshot, 12k distinct keys referenced: a
   left lookup then a ``filter`` on a looked-up field (baseline: what an inner
   lookup built on a filter does) against the job's inner lookup
   (``stream_app.enrich``). ``ArrowEvalPython`` nodes (Python evaluations of the
   batch) in each physical plan are printed.

Each output is written to Spark's ``noop`` sink. Prints a table, then one JSON
line: ``decode_filter_s``, ``decode_rows_where_s``, ``ratio_decode_filter_vs_rows_where``,
``inner_filter_s``, ``inner_rows_where_s``, ``ratio_inner_filter_vs_rows_where`` and the
plan counts.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECORDS = int(os.environ.get("THREES_BENCH_RECORDS", "2000000"))
EVENTS = int(os.environ.get("THREES_BENCH_EVENTS", "400000"))
ROUNDS = int(os.environ.get("THREES_BENCH_ROUNDS", "3"))
SCHEMA = {
    "type": "record",
    "name": "E",
    "namespace": "bench",
    "fields": [*({"name": n, "type": "long"} for n in "abcde"), {"name": "s", "type": "string"}],
}


def _seconds(df: Any) -> float:
    started = time.monotonic()
    df.write.format("noop").mode("overwrite").save()
    return time.monotonic() - started


def _best(builds: dict[str, Any]) -> dict[str, float]:
    best = {name: float("inf") for name in builds}
    for _ in range(ROUNDS):
        for name, build in builds.items():
            best[name] = min(best[name], _seconds(build()))
    return best


def _side_by_side(measure: str, with_filter: Any, with_rows_where: Any, counted: str, count: Any) -> dict[str, Any]:
    """Best times of both builds, their ratio and ``count`` of each one's plan, as ``<measure>_...`` figures."""
    builds = {"filter": with_filter, "rows_where": with_rows_where}
    best = _best(builds)
    return {
        f"{measure}_filter_s": best["filter"],
        f"{measure}_rows_where_s": best["rows_where"],
        f"ratio_{measure}_filter_vs_rows_where": best["filter"] / best["rows_where"],
        **{f"{measure}_{name}_{counted}": count(build()) for name, build in builds.items()},
    }


def decode_and_drop(spark: Any) -> dict[str, Any]:
    from pyspark.sql import functions as f

    from schemas.serde import fingerprint, schema_json
    from stream_app.avro import decode_avro, encode_avro
    from stream_app.snapshot.decoding import corrupt_to_null
    from stream_app.updates import aggregation_input

    js, fp = schema_json(SCHEMA), fingerprint(SCHEMA)
    body = f.struct(*(f.col("id").alias(n) for n in "abcde"), f.col("id").cast("string").alias("s"))
    header = f.array(f.struct(f.lit("source").alias("key"), f.col("id").cast("string").cast("binary").alias("value")))
    records = spark.range(RECORDS).select(encode_avro(body, js, fp).alias("value"), header.alias("headers")).cache()
    records.count()

    def with_filter() -> Any:
        decoded = records.select(decode_avro(f.col("value"), {fp: js}, js).alias("e"), f.lit("x").alias("__source"))
        decoded = decoded.withColumn("e", corrupt_to_null(f.col("e"), js))
        return decoded.filter(f.col("e").isNotNull()).select("e.*", "__source")

    def with_rows_where() -> Any:
        return aggregation_input(records, {fp: js}, js, "source")

    figures = _side_by_side("decode", with_filter, with_rows_where, "from_avro_calls",
                            lambda df: df._jdf.queryExecution().optimizedPlan().toString().count("from_avro("))
    records.unpersist()
    return figures


def inner_lookup(spark: Any) -> dict[str, Any]:
    from pyspark.sql import functions as f

    from stream_app.config import LookupConfig
    from stream_app.enrich import BoundLookup, enrich
    from stream_app.snapshot.view import SnapshotView

    ref = spark.range(10_000).select(
        f.concat(f.lit("K"), f.col("id").cast("string")).alias("faa"),
        f.col("id").cast("string").alias("name"),
        f.lit(1.0).alias("lat"),
    )
    view = SnapshotView.from_dataframe(spark, "airports", ref, ["faa"], "indexed")
    events = spark.range(EVENTS).select(
        f.col("id"), f.concat(f.lit("K"), (f.col("id") % 12_000).cast("string")).alias("dest")
    ).cache()
    events.count()

    def lookup(how: str) -> Any:
        config = LookupConfig(snapshot="airports", on={"dest": "faa"}, prefix="dest_", how=how)
        return enrich(events, [BoundLookup(config, view)])

    def with_filter() -> Any:
        return lookup("left").filter(f.col("dest_name").isNotNull())

    def with_rows_where() -> Any:
        return lookup("inner")

    figures = _side_by_side("inner", with_filter, with_rows_where, "python_evaluations",
                            lambda df: df._jdf.queryExecution().executedPlan().toString().count("ArrowEvalPython"))
    events.unpersist()
    return figures


def main() -> None:
    from stream_app.session import spark_session
    from stream_app.spark_settings import SparkSettings
    from threes.local import LocalStack

    spark = spark_session(
        SparkSettings(master="local[2]", app_name="threes-bench-plan-barriers", driver_memory="2g"),
        LocalStack().spark_jars(),
    )
    try:
        figures = {"benchmark": "plan_barriers", "records": RECORDS, "events": EVENTS, "rounds": ROUNDS}
        figures |= decode_and_drop(spark)
        figures |= inner_lookup(spark)
    finally:
        spark.stop()
    print(f"{'measure':<44}{'filter':>10}{'rows_where':>12}{'ratio':>8}  plan")
    print(f"{'decode and drop, ' + format(RECORDS, ',') + ' records, s':<44}{figures['decode_filter_s']:>10.2f}"
          f"{figures['decode_rows_where_s']:>12.2f}{figures['ratio_decode_filter_vs_rows_where']:>8.2f}  "
          f"from_avro {figures['decode_filter_from_avro_calls']} vs {figures['decode_rows_where_from_avro_calls']}")
    print(f"{'inner lookup (indexed), ' + format(EVENTS, ',') + ' events, s':<44}{figures['inner_filter_s']:>10.2f}"
          f"{figures['inner_rows_where_s']:>12.2f}{figures['ratio_inner_filter_vs_rows_where']:>8.2f}  "
          f"ArrowEvalPython {figures['inner_filter_python_evaluations']} vs "
          f"{figures['inner_rows_where_python_evaluations']}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
