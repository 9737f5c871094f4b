"""Point lookups in hash-sorted, memory-mapped lookup files (the partitioned engine's per-event path)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from stream_app.snapshot import mapped
from stream_app.snapshot.arrow_tables import ipc_bytes
from stream_app.snapshot.mapped import MappedLookup, bucket_file, lookup_columns, probe_sorted


def test_probe_sorted_confirms_hash_hits_by_key_and_walks_shared_hashes():
    # sorted by __lh; "b" and "d" share hash 7 (adjacent), "x" has hash 7 too but is absent
    table = pa.table({"__lk": ["a", "b", "d", "c"], "__lh": pa.array([1, 7, 7, 9], pa.int64())})
    hashes_sorted = table.column("__lh").to_numpy()
    keys = pa.array(["d", "b", "x", "c", None, "a", "z"])
    hashes = np.array([7, 7, 7, 9, 0, 1, 99], dtype=np.int64)
    assert probe_sorted(table, hashes_sorted, keys, hashes).tolist() == [2, 1, -1, 3, -1, 0, -1]


def test_probe_sorted_of_an_empty_bucket():
    table = pa.table({"__lk": pa.array([], pa.string()), "__lh": pa.array([], pa.int64())})
    out = probe_sorted(table, table.column("__lh").to_numpy(), pa.array(["a"]), np.array([1], dtype=np.int64))
    assert out.tolist() == [-1]


def write_bucket(folder: Path, bucket: int, rows: list[tuple[str, int, str]]) -> None:
    rows = sorted(rows, key=lambda r: r[1])
    table = pa.table(
        {
            "__lk": pa.array([r[0] for r in rows], pa.string()),
            "__lh": pa.array([r[1] for r in rows], pa.int64()),
            "name": pa.array([r[2] for r in rows], pa.string()),
        }
    )
    mapped._write_ipc(bucket_file(str(folder), bucket), table)


def test_lookup_columns_across_buckets_in_event_order_with_the_overlay_on_top(tmp_path):
    write_bucket(tmp_path, 0, [("a", 10, "A"), ("c", 30, "C")])
    write_bucket(tmp_path, 1, [("b", 20, "B"), ("d", 40, "D")])
    overlay = pa.table(
        {
            "__lk": ["c", "d", "e"],
            "__lh": pa.array([30, 40, 50], pa.int64()),
            "__deleted": [False, True, False],
            "name": ["C2", None, "E"],
        }
    )
    lookup = MappedLookup(str(tmp_path), 2, ipc_bytes(overlay), ("name",), ("o_name",))
    keys = pa.array(["b", "a", "d", "c", "zz", "e", None, "a"])
    hashes = pa.array([20, 10, 40, 30, 77, 50, None, 10], pa.int64())
    buckets = np.array([1, 0, 1, 0, 1, 0, 0, 0])
    out = lookup_columns(lookup, keys, hashes, buckets).to_pydict()
    # d deleted by the overlay, c changed by it, e only in the overlay, zz absent, a null key never matches
    assert out["o_name"] == ["B", "A", None, "C2", None, "E", None, "A"]
    assert out["__matched"] == [True, True, False, True, False, True, False, True]


def test_lookup_columns_without_overlay_keeps_types(tmp_path):
    write_bucket(tmp_path, 0, [("a", 10, "A")])
    lookup = MappedLookup(str(tmp_path), 1, None, ("name",), ("o_name",))
    out = lookup_columns(lookup, pa.array(["a", "b"]), pa.array([10, 11], pa.int64()), np.array([0, 0]))
    assert out.schema.field("o_name").type == pa.string()
    assert out.to_pydict() == {"o_name": ["A", None], "__matched": [True, False]}


TYPES = (
    "id string, ts timestamp, ntz timestamp_ntz, day date, amount decimal(10,2), ok boolean, ratio double, "
    "tags array<int>, attrs map<string,int>, pos struct<a:int,b:string>, raw binary"
)


def _rows() -> list[tuple]:
    import datetime as dt
    from decimal import Decimal

    out = []
    for i in range(300):
        if i % 7 == 3:  # a row of nulls
            out.append((f"k{i}", None, None, None, None, None, None, None, None, None, None))
            continue
        out.append((
            f"k{i}",
            dt.datetime(2024, 1, 1, 12, 0, tzinfo=dt.UTC) + dt.timedelta(seconds=i * 3601),
            dt.datetime(2024, 6, 1, 8, 30) + dt.timedelta(minutes=i),
            dt.date(2020, 1, 1) + dt.timedelta(days=i),
            Decimal(i) / 4,
            i % 2 == 0,
            i / 3,
            [i, i + 1],
            {"a": i},
            (i, f"b{i}"),
            bytes([i % 256, 1]),
        ))
    return out


def test_lookup_files_return_what_the_sort_merge_join_returns_for_every_spark_type(spark, tmp_path):
    """The lookup path (files read by pyarrow, values back through pandas) equals Spark's own join, type by type."""
    from pyspark.sql import functions as f
    from pyspark.sql import types as T

    from stream_app.checkpoint import SnapshotCheckpoint
    from stream_app.checkpoint_fs import CheckpointFs
    from stream_app.config import LookupConfig
    from stream_app.enrich import BoundLookup, enrich
    from stream_app.snapshot.data import LH, LK, lookup_key
    from stream_app.snapshot.partitioned import PartitionedStore
    from stream_app.snapshot.view import SnapshotView
    from stream_app.spark_checkpoint import child

    rows = spark.createDataFrame(_rows(), TYPES)
    key_type = T.StructType([rows.schema["id"]])
    value_type = T.StructType([fld for fld in rows.schema.fields if fld.name != "id"])
    lk = lookup_key(f.struct("id"), key_type)
    latest = rows.select(lk.alias(LK), f.xxhash64(lk).alias(LH), *value_type.fieldNames())
    checkpoint = tmp_path / "cp"
    versions = SnapshotCheckpoint(
        CheckpointFs(str(checkpoint)), "types", "x", spark_folder=child(str(checkpoint), "snapshots", "types")
    )
    store = PartitionedStore(spark, "types", 3, latest.columns, versions, lookup_files=True)
    store.build(latest)
    assert store.lookup_folder is not None and store.rows == 300
    events = spark.createDataFrame([(f"k{i}", i) for i in range(-5, 305, 2)], "id string, n int")
    config = LookupConfig(snapshot="types", on={"id": "id"}, prefix="t_")
    out = {}
    for folder in (store.lookup_folder, None):
        view = SnapshotView("types", key_type, value_type, {}, "partitioned", 300, base_df=store.df,
                            lookup_files=folder, partitions=3)
        out[folder is None] = sorted(enrich(events, [BoundLookup(config, view)]).collect(), key=lambda r: r["n"])
    looked_up, joined = out[False], out[True]
    assert len(joined) == 155 and sum(r["t_day"] is not None for r in joined) > 100
    assert [r.asDict(recursive=True) for r in looked_up] == [r.asDict(recursive=True) for r in joined]
    # an inner lookup: the files are read once per batch (its filter is not pushed below the UDF's projection)
    view = SnapshotView("types", key_type, value_type, {}, "partitioned", 300, base_df=store.df,
                        lookup_files=store.lookup_folder, partitions=3)
    inner = enrich(events, [BoundLookup(LookupConfig(snapshot="types", on={"id": "id"}, prefix="t_", how="inner"), view)])
    assert inner._jdf.queryExecution().executedPlan().toString().count("ArrowEvalPython") == 1
    found = {r["n"] for r in inner.collect()}
    assert found and found < {r["n"] for r in looked_up}
    store.release()


def test_bucket_of_a_spark_bucket_file_name():
    assert mapped._bucket_of("part-00001-3f0c9a2e-1b7d-4c1e-9c55-0d5f3a3f4b10_00003.c000.snappy.parquet") == 3
    assert mapped._bucket_of("part-00000-3f0c9a2e_00000.parquet") == 0
    assert mapped._bucket_of("part-00000-3f0c9a2e.c000.snappy.parquet") is None  # not bucketed
    assert mapped._bucket_of("_SUCCESS") is None
