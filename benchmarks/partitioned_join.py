"""One micro-batch's join against a large partitioned snapshot base, strategy by strategy (issue #11).

Run: ``python benchmarks/partitioned_join.py`` (standalone cluster of the local
stack, started if needed; ``THREES_BENCH_JOIN_MASTER=local[2]`` for one JVM).

Why: at 10M keys the job's micro-batch is ~3 s against ~1 s at 10k keys
(``benchmarks/snapshot_scale.py``), because the partitioned engine's join scans
the whole base every batch. This benchmark isolates that join, outside the job,
on a base laid out exactly as the engine keeps it (``stream_app/snapshot/partitioned.py``:
Parquet bucketed by ``__lk`` into P buckets, one file per bucket, sorted by
``__lk``), and a batch of ``THREES_BENCH_BATCH`` (50k) events referencing 10k
keys spread over the whole key range, as in ``snapshot_scale.py``. Each
strategy joins the same batches and writes the joined rows (event id + the
six value fields) to Spark's ``noop`` sink; the best of ``THREES_BENCH_JOIN_ROUNDS``
(4, the first of each is cold) counts. Side by side, in one run:

1. ``sort_merge``: what the job does (``stream_app/enrich.py``): only the events are
   shuffled and sorted; the base is read in its bucket order;
2. ``shuffled_hash``: the events as the hash-join build side per bucket (no sort);
3. ``raw_value``: a base of ``__lk`` + the value's Avro body (one binary column),
   decoded by ``from_avro`` for the joined rows only;
4. ``scan_floor``: a scan of ``__lk`` alone, no join: the least any plan that
   reads the base costs per batch;
5. ``point_lookup``: a prototype of point lookups, not the job's code: each
   bucket also as an Arrow IPC file sorted by ``__lh`` (xxhash64 of the key),
   memory-mapped by the Python workers (the page cache holds it once per host,
   not once per worker), looked up with ``numpy.searchsorted`` for the events of
   that bucket (``mapInArrow``), the key compared on each hit. Its cost grows
   with the batch, not with the base.
6. ``lookup``: the job's engine (``partitioned_join: lookup``,
   ``stream_app/snapshot/mapped.py``): the same files written by the engine from
   the bucketed base, one per bucket, and the job's own ``enrich`` (a scalar pandas
   UDF sends each event's key, hash and bucket; no shuffle);
7. ``mmap_whole``: the same lookups without shuffling the events: the whole base
   as one Arrow IPC file sorted by ``__lh``, memory-mapped by every Python worker,
   each event looked up where it is (a host's page cache holds the file once);
8. ``broadcast_10k`` (the reference): the same batch joined to a cached table of
   only the 10k keys it references, by a broadcast hash join: what the job does
   with a 10k-key snapshot, so ``point_lookup`` / ``broadcast_10k`` bounds what
   point lookups could give ``ratio_10m_vs_10k``.

Prints a table (seconds per batch, ratio to ``sort_merge``) and one JSON line.
Sizes: ``THREES_BENCH_JOIN_KEYS`` (10,000,000), ``THREES_BENCH_BATCH`` (50,000),
buckets ``THREES_BENCH_JOIN_BUCKETS`` (4, the cluster's ``spark.sql.shuffle.partitions``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from stream_join import VALUE, faa  # noqa: E402

KEYS = int(os.environ.get("THREES_BENCH_JOIN_KEYS", "10000000"))
BATCH = int(os.environ.get("THREES_BENCH_BATCH", "50000"))
BUCKETS = int(os.environ.get("THREES_BENCH_JOIN_BUCKETS", "4"))
ROUNDS = int(os.environ.get("THREES_BENCH_JOIN_ROUNDS", "4"))
MASTER = os.environ.get("THREES_BENCH_JOIN_MASTER", "spark://127.0.0.1:7077")
REFERENCED = 10_000  # distinct keys a batch references, spread over the whole key range
VALUES = ["faa", "name", "lat", "lon", "alt", "tz"]
VALUE_AVSC = json.dumps(VALUE)  # the snapshot values of stream_join.py and snapshot_scale.py
log = logging.getLogger("partitioned_join")


def session() -> Any:
    from stream_app.session import spark_session
    from stream_app.spark_settings import SparkSettings
    from threes.local import LocalStack

    stack = LocalStack()
    stack.up(["spark"] if MASTER.startswith("spark://") else [])
    spark = spark_session(
        SparkSettings(master=MASTER, app_name="threes-bench-join", driver_memory="1g"), stack.spark_jars()
    )
    for key, value in {
        "spark.sql.shuffle.partitions": str(BUCKETS),
        "spark.sql.legacy.bucketedTableScan.outputOrdering": "true",  # as the partitioned store sets it
        "spark.sql.autoBroadcastJoinThreshold": "-1",
        "spark.sql.adaptive.enabled": "false",  # as in a streaming micro-batch's plan
    }.items():
        spark.conf.set(key, value)
    return spark


def build_bases(spark: Any, folder: Path) -> tuple[Any, Any, Path]:
    """The base as the engine writes it, its raw-value twin, and the prototype's IPC files (one per bucket)."""
    from pyspark.sql import functions as f
    from pyspark.sql.avro.functions import to_avro

    key = faa(f.col("id"))
    rows = spark.range(KEYS).select(
        key.alias("__lk"),
        f.xxhash64(key).alias("__lh"),
        key.alias("faa"),
        f.format_string("airport %d", f.col("id")).alias("name"),
        (f.col("id") % 90).cast("double").alias("lat"),
        (f.col("id") % 180).cast("double").alias("lon"),
        (f.col("id") % 1000).cast("int").alias("alt"),
        (f.col("id") % 24).cast("int").alias("tz"),
    )
    tables = {}
    for name, df in (
        ("base", rows),
        ("raw", rows.select("__lk", "__lh", to_avro(f.struct(*VALUES), VALUE_AVSC).alias("__v"))),
    ):
        path = folder / name
        (
            df.repartition(BUCKETS, "__lk")  # one file per bucket, as the engine's versions
            .write.mode("overwrite")
            .bucketBy(BUCKETS, "__lk")
            .sortBy("__lk")
            .format("parquet")
            .option("path", str(path))
            .saveAsTable(f"bench_join_{name}")
        )
        tables[name] = spark.table(f"bench_join_{name}")
    ipc = folder / "ipc"
    ipc.mkdir()
    files = sorted(str(p) for p in (folder / "base").glob("*.parquet"))

    def write_bucket(path: str) -> None:  # on an executor (one host: the folder is shared)
        import pyarrow.parquet as pq
        from pyarrow import ipc as pa_ipc

        bucket = int(path.rsplit("_", 1)[1].split(".", 1)[0])
        table = pq.read_table(path).sort_by("__lh")
        with pa_ipc.new_file(str(ipc / f"{bucket}.arrow"), table.schema) as out:
            out.write_table(table, max_chunksize=len(table) or 1)  # one chunk: zero-copy numpy views

    spark.sparkContext.parallelize(files, len(files)).foreach(write_bucket)

    def write_whole(_: int) -> None:  # the whole base as one file sorted by __lh (variant mmap_whole)
        import pyarrow as pa
        from pyarrow import ipc as pa_ipc

        parts = [pa_ipc.open_file(pa.memory_map(str(ipc / f"{b}.arrow"))).read_all() for b in range(BUCKETS)]
        table = pa.concat_tables(parts).sort_by("__lh")
        with pa_ipc.new_file(str(ipc / "whole.arrow"), table.schema) as out:
            out.write_table(table, max_chunksize=len(table) or 1)

    spark.sparkContext.parallelize([0], 1).foreach(write_whole)
    return tables["base"], tables["raw"], ipc


def events(spark: Any, seed: int) -> Any:
    from pyspark.sql import functions as f

    stride = max(1, KEYS // REFERENCED)
    ids = spark.range(seed * BATCH, (seed + 1) * BATCH, numPartitions=2)
    return ids.select(
        f.col("id").alias("event_id"),
        faa((f.col("id") % REFERENCED) * stride).alias("origin"),
    )


def strategies(base: Any, raw: Any, ipc: Path) -> dict[str, Any]:
    from pyspark.sql import functions as f
    from pyspark.sql import types as T
    from pyspark.sql.avro.functions import from_avro

    flat = [f.col(v).alias(f"__b0_{j}") for j, v in enumerate(VALUES)]
    side = base.select(f.col("__lk").alias("__lk0"), f.col("__lk").alias("__bk0"), *flat)

    def joined_struct(df: Any) -> Any:
        fields = [f.col(f"__b0_{j}").alias(v) for j, v in enumerate(VALUES)]
        value = f.when(f.col("__bk0").isNotNull(), f.struct(*fields))
        return df.select("event_id", value.alias("v"))

    def sort_merge(ev: Any) -> Any:
        return joined_struct(ev.select("*", f.col("origin").alias("__lk0")).join(side, "__lk0", "left"))

    def shuffled_hash(ev: Any) -> Any:
        keyed = ev.select("*", f.col("origin").alias("__lk0")).hint("shuffle_hash")
        return joined_struct(keyed.join(side, "__lk0", "left"))

    raw_side = raw.select(f.col("__lk").alias("__lk0"), f.col("__v").alias("__bv0"))

    def raw_value(ev: Any) -> Any:
        j = ev.select("*", f.col("origin").alias("__lk0")).join(raw_side, "__lk0", "left")
        return j.select("event_id", from_avro(f.col("__bv0"), VALUE_AVSC).alias("v"))

    stride = max(1, KEYS // REFERENCED)
    small = (
        base.filter(f.substring("__lk", 2, 7).cast("long") % stride == 0)  # only the referenced keys
        .select(f.col("__lk").alias("__lk0"), f.col("__lk").alias("__bk0"),
                *[f.col(v).alias(f"__b0_{j}") for j, v in enumerate(VALUES)])
        .persist()
    )
    small.count()

    def broadcast_small(ev: Any) -> Any:
        keyed = ev.select("*", f.col("origin").alias("__lk0"))
        return joined_struct(keyed.join(small.hint("broadcast"), "__lk0", "left"))

    def scan_floor(_ev: Any) -> Any:
        return base.select(f.col("__lk").alias("v"), f.lit(0).alias("event_id"))

    value_type = T.StructType(
        [
            T.StructField("faa", T.StringType()),
            T.StructField("name", T.StringType()),
            T.StructField("lat", T.DoubleType()),
            T.StructField("lon", T.DoubleType()),
            T.StructField("alt", T.IntegerType()),
            T.StructField("tz", T.IntegerType()),
        ]
    )
    out_schema = T.StructType([T.StructField("event_id", T.LongType()), T.StructField("v", value_type)])
    folder = str(ipc)

    def lookup(batches: Any) -> Any:  # in a Python worker
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc
        from pyarrow import ipc as pa_ipc

        opened: dict[Any, Any] = {}
        for batch in batches:
            if batch.num_rows == 0:
                continue
            bucket = batch.column("__bucket")[0].as_py() if "__bucket" in batch.schema.names else "whole"
            table = opened.get(bucket)
            if table is None:
                source = pa.memory_map(f"{folder}/{bucket}.arrow")
                table = opened[bucket] = pa_ipc.open_file(source).read_all()
            hashes = table.column("__lh").chunk(0).to_numpy()  # a view of the mapped file
            wanted = batch.column("__lh0").to_numpy(zero_copy_only=False)
            at = np.minimum(np.searchsorted(hashes, wanted), len(hashes) - 1)
            rows = table.take(pa.array(at))
            same_hash = pc.equal(rows.column("__lh"), batch.column("__lh0"))
            hit = pc.and_(same_hash, pc.equal(rows.column("__lk"), batch.column("origin")))
            value = pa.StructArray.from_arrays(
                [rows.column(v).combine_chunks() for v in VALUES], names=VALUES, mask=pc.invert(hit).combine_chunks()
            )
            yield pa.RecordBatch.from_arrays([batch.column("event_id"), value], names=["event_id", "v"])

    def point_lookup(ev: Any) -> Any:
        keyed = ev.select(
            "event_id",
            "origin",
            f.xxhash64("origin").alias("__lh0"),
            f.expr(f"pmod(hash(origin), {BUCKETS})").alias("__bucket"),
        ).repartition(BUCKETS, "origin")  # Spark's hash partitioning = the bucket id: partition p holds bucket p
        return keyed.mapInArrow(lookup, out_schema)

    def mmap_whole(ev: Any) -> Any:  # no shuffle: every worker maps the one file of the whole base
        keyed = ev.select("event_id", "origin", f.xxhash64("origin").alias("__lh0"))
        return keyed.mapInArrow(lookup, out_schema)

    from stream_app.config import LookupConfig
    from stream_app.enrich import BoundLookup, enrich
    from stream_app.snapshot.mapped import write_lookup_files
    from stream_app.snapshot.view import SnapshotView

    lookup_folder = str(ipc / "engine")
    write_lookup_files(base.sparkSession, str(ipc.parent / "base"), lookup_folder, BUCKETS, base.schema)
    key_type = T.StructType([T.StructField("faa", T.StringType())])
    view = SnapshotView("bench", key_type, value_type, {}, "partitioned", KEYS, base_df=base,
                        lookup_files=lookup_folder, partitions=BUCKETS)
    bound = [BoundLookup(LookupConfig(snapshot="bench", on={"origin": "faa"}, prefix="o_"), view)]

    def engine_lookup(ev: Any) -> Any:  # the job's own code: stream_app.enrich with the lookup files
        out = enrich(ev, bound)
        value = f.struct(*[f.col(f"o_{v}").alias(v) for v in VALUES])
        return out.select("event_id", f.when(f.col("o_faa").isNotNull(), value).alias("v"))

    return {
        "lookup": engine_lookup,
        "sort_merge": sort_merge,
        "shuffled_hash": shuffled_hash,
        "raw_value": raw_value,
        "scan_floor": scan_floor,
        "point_lookup": point_lookup,
        "mmap_whole": mmap_whole,
        "broadcast_10k": broadcast_small,
    }


def check(spark: Any, plans: dict[str, Any]) -> dict[str, int]:
    """Every joining strategy gives the same rows on one batch (the prototype included)."""
    from pyspark.sql import functions as f

    digests = {}
    for name, plan in plans.items():
        if name == "scan_floor":
            continue
        df = plan(events(spark, 0)).select("event_id", f.to_json("v").alias("v"))
        digests[name] = df.select(f.bit_xor(f.xxhash64("event_id", "v")).alias("d")).first()["d"]
        matched = df.filter(f.col("v").isNotNull()).count()
        if matched != BATCH:
            raise AssertionError(f"{name}: {matched} of {BATCH} events matched")
    if len(set(digests.values())) != 1:
        raise AssertionError(f"the strategies disagree: {digests}")
    return {"matched_per_batch": BATCH}


def main() -> None:
    spark = session()
    folder = Path(tempfile.mkdtemp(prefix="threes-join-"))
    try:
        started = time.monotonic()
        base, raw, ipc = build_bases(spark, folder)
        build_s = time.monotonic() - started
        plans = strategies(base, raw, ipc)
        checked = check(spark, plans)
        seconds: dict[str, list[float]] = {name: [] for name in plans}
        for r in range(ROUNDS):
            for name, plan in plans.items():
                t = time.monotonic()
                plan(events(spark, r + 1)).write.format("noop").mode("overwrite").save()
                seconds[name].append(time.monotonic() - t)
                log.info("round %d %s %.2f s", r, name, seconds[name][-1])
        best = {name: min(s) for name, s in seconds.items()}
    finally:
        spark.stop()
        shutil.rmtree(folder, ignore_errors=True)
    print(f"\npartitioned_join benchmark: {MASTER}, {KEYS:,} keys in {BUCKETS} buckets, batches of {BATCH:,} events "
          f"({REFERENCED:,} keys referenced), best of {ROUNDS}; bases built in {build_s:.1f} s")
    for name, s in best.items():
        print(f"  {name:<14} {s:6.2f} s per batch  {s / best['sort_merge']:.2f}x sort_merge  rounds "
              + " ".join(f"{x:.2f}" for x in seconds[name]))
    print(json.dumps({"benchmark": "partitioned_join", "keys": KEYS, "batch": BATCH, "buckets": BUCKETS,
                      "master": MASTER, **checked, "seconds_per_batch": best,
                      "ratio_to_sort_merge": {n: s / best["sort_merge"] for n, s in best.items()}}))


if __name__ == "__main__":
    logging.basicConfig(level=os.environ.get("THREES_BENCH_LOG", "INFO"), format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    main()
