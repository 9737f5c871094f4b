"""The Iceberg sink against pyiceberg's own ``append`` of the same Arrow batches, in one run.

Run: ``python benchmarks/iceberg_sink.py`` with the local stack up and ``source`` of its
environment (``THREES_POSTGRES_URL``, ``THREES_S3_*``); a smoke run:
``THREES_BENCH_BATCHES=3 THREES_BENCH_ROWS=2000 THREES_BENCH_ROUNDS=1``.

Both paths write ``THREES_BENCH_BATCHES`` (20) batches of ``THREES_BENCH_ROWS`` (10,000) rows
into their own new table of the same catalog (pyiceberg's SQL catalog in PostgreSQL) and
warehouse (s3proxy), one commit per batch:

* ``raw``: ``Table.append(arrow_table)`` of each batch (the values and a ``_version`` column);
* ``sink``: :meth:`IcebergSink.write` in ``mode: append`` of a :class:`SinkBatch` holding the same
  Arrow table as the sync service's columnar decoder leaves it (``SinkBatch.tables``): what the
  sink adds is the offsets read from the snapshot, the version column, the schema alignment and
  the offsets in the snapshot summary;
* ``sink_upsert``: the same batches in ``mode: upsert``, half the keys of each batch already in
  the table (the version lookup, a copy-on-write delete and the append in one transaction):
  reported, not part of the ratio.

Rounds alternate the order of ``raw`` and ``sink``. Ends with one JSON line:
``rows_per_s_raw``, ``rows_per_s_sink``, ``rows_per_s_sink_upsert`` (medians),
``ratio_iceberg_vs_raw`` (sink / raw, target at least 0.9) and the load averages before and after.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa

from connectors.api.sink_records import SinkBatch, records_from_columns
from connectors.iceberg import table_schema
from connectors.iceberg.config import IcebergSinkConfig
from connectors.iceberg.connection import IcebergConnection, load_catalog
from connectors.iceberg.sink import IcebergSink
from threes.testing.sink import FP, PARSED

BATCHES = int(os.environ.get("THREES_BENCH_BATCHES", "20"))
ROWS = int(os.environ.get("THREES_BENCH_ROWS", "10000"))
ROUNDS = int(os.environ.get("THREES_BENCH_ROUNDS", "3"))
TOPIC = "updates.bench"


def connection() -> IcebergConnection:
    """The local stack's catalog and warehouse, from the stack's environment."""
    return IcebergConnection.model_validate(
        {
            "type": "iceberg",
            "uri": os.environ["THREES_POSTGRES_URL"],
            "create_bucket": True,
            "warehouse": "s3://threes-iceberg-bench/warehouse",
            "storage": {
                "endpoint_url": os.environ["THREES_S3_ENDPOINT_URL"],
                "access_key_id": os.environ.get("THREES_S3_ACCESS_KEY_ID", "threes"),
                "secret_access_key": os.environ.get("THREES_S3_SECRET_ACCESS_KEY", "threes-secret-key"),
            },
        }
    )


def values(n: int, first_key: int) -> pa.Table:
    """``n`` rows of the contract kit's ``Item`` values, typed as the columnar decoder types them."""
    base = datetime(2024, 5, 1, tzinfo=UTC)
    keys = range(first_key, first_key + n)
    return pa.table(
        {
            "id": pa.array(keys, pa.int64()),
            "name": pa.array([f"item-{k}" for k in keys], pa.string()),
            "qty": pa.array([k % 1000 for k in keys], pa.int32()),
            "updated_at": pa.array([base + timedelta(seconds=k) for k in keys], pa.timestamp("us", "UTC")),
            "note": pa.array([None if k % 2 else f"n{k}" for k in keys], pa.string()),
        }
    )


def sink_batch(table: pa.Table, first_offset: int) -> SinkBatch:
    """A batch of one partition whose records' values are the rows of ``table``."""
    n = table.num_rows
    offsets = range(first_offset, first_offset + n)
    records = records_from_columns(
        TOPIC,
        0,
        offsets,
        table.column("id").to_pylist(),
        offsets,
        [0] * n,
        [100] * n,
        [PARSED] * n,
        [FP] * n,
        [b""] * n,
    )
    for i, record in enumerate(records):
        record.row = i
    return SinkBatch(TOPIC, 0, first_offset, first_offset + n - 1, records, {FP: table})


def batches(upsert: bool) -> list[pa.Table]:
    """The batches: new keys each, or (upsert) half of them the previous batch's keys."""
    step = ROWS // 2 if upsert else ROWS
    return [values(ROWS, i * step) for i in range(BATCHES)]


def run_raw(conn: IcebergConnection, tables: list[pa.Table]) -> float:
    catalog = load_catalog(conn)
    catalog.create_namespace_if_not_exists("bench")
    offset = 0
    with_version = []
    for t in tables:
        with_version.append(t.append_column("_version", pa.array(range(offset, offset + t.num_rows), pa.int64())))
        offset += t.num_rows
    table = catalog.create_table(f"bench.raw_{uuid.uuid4().hex[:8]}", schema=with_version[0].schema)
    started = time.perf_counter()
    for t in with_version:
        table.append(t)
    return sum(t.num_rows for t in tables) / (time.perf_counter() - started)


def run_sink(conn: IcebergConnection, tables: list[pa.Table], mode: str) -> float:
    config = IcebergSinkConfig.model_validate(
        {
            "name": "bench",
            "type": "iceberg_sink",
            "connection": "lake",
            "topics": [TOPIC],
            "mode": mode,
            "table": f"bench.{mode}_{uuid.uuid4().hex[:8]}",
            "key": ["id"] if mode == "upsert" else [],
        }
    )
    sink = IcebergSink(config, conn)
    sink.open()
    # the table exists before the clock starts, as the raw path's does
    schema = tables[0].append_column("_version", pa.array([0] * tables[0].num_rows, pa.int64())).schema
    sink.table = table_schema.create(sink.catalog, config.table, schema, [])
    prepared, offset = [], 0
    for t in tables:
        prepared.append(sink_batch(t, offset))
        offset += t.num_rows
    started = time.perf_counter()
    for b in prepared:
        sink.write(b)
    elapsed = time.perf_counter() - started
    sink.close()
    return sum(t.num_rows for t in tables) / elapsed


def main() -> None:
    load_before = os.getloadavg()
    conn = connection()
    IcebergSink(
        IcebergSinkConfig.model_validate(
            {
                "name": "bench",
                "type": "iceberg_sink",
                "connection": "lake",
                "topics": [TOPIC],
                "table": "bench.warmup",
                "mode": "append",
            }
        ),
        conn,
    ).open()  # creates the bucket
    plain, upserts = batches(upsert=False), batches(upsert=True)
    rates: dict[str, list[float]] = {"raw": [], "sink": [], "sink_upsert": []}
    for round_ in range(ROUNDS):
        order = ["raw", "sink"] if round_ % 2 == 0 else ["sink", "raw"]
        for name in order:
            rate = run_raw(conn, plain) if name == "raw" else run_sink(conn, plain, "append")
            rates[name].append(rate)
        rates["sink_upsert"].append(run_sink(conn, upserts, "upsert"))
    figures: dict[str, Any] = {
        "batches": BATCHES,
        "rows_per_batch": ROWS,
        "rounds": ROUNDS,
        "rows_per_s_raw": statistics.median(rates["raw"]),
        "rows_per_s_sink": statistics.median(rates["sink"]),
        "rows_per_s_sink_upsert": statistics.median(rates["sink_upsert"]),
        "runs_rows_per_s": rates,
    }
    figures["ratio_iceberg_vs_raw"] = figures["rows_per_s_sink"] / figures["rows_per_s_raw"]
    figures["load_average_before"] = [round(x, 2) for x in load_before]
    figures["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(f"\niceberg_sink benchmark: {BATCHES} batches of {ROWS:,} rows, one commit each, {ROUNDS} round(s)")
    for name in ("raw", "sink", "sink_upsert"):
        runs = ", ".join(f"{r:,.0f}" for r in rates[name])
        print(f"  {name:<12} {figures[f'rows_per_s_{name}']:>10,.0f} rows/s (runs {runs})")
    print(f"  sink / raw append: {figures['ratio_iceberg_vs_raw']:.2f}")
    print(json.dumps({"benchmark": "iceberg_sink", **figures}))


if __name__ == "__main__":
    main()
