"""A partitioned snapshot lives on the executors: the driver never receives its rows.

Bootstrap, small refreshes (the driver's overlay), a large delta merged by the
executors, checkpoint versions and a restart from them, with a guard on every
way a DataFrame reaches the driver (``collect``, ``toArrow``, ``toPandas``,
``toLocalIterator``): no call during the snapshot's own work may bring more
than a handful of rows. The 10M-key run with ``driver_memory: 1g`` is in
``benchmarks/stream_join.py`` (part ``scale``).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import pytest

from stream_app.checkpoint import SnapshotCheckpoint
from stream_app.checkpoint_fs import CheckpointFs
from stream_app.config import LookupConfig
from stream_app.enrich import BoundLookup, enrich
from stream_app.kafka_io import TopicWatermarks, offsets_json
from stream_app.plan import build_plan
from stream_app.snapshot.engines import DeadLetterProducer
from stream_app.snapshot.runtime import Snapshot
from stream_app.spark_checkpoint import child
from stream_app.writers import WriterSchemas

pytestmark = pytest.mark.spark

KEYS = 20_000
MAX_ROWS_TO_DRIVER = 10  # a manifest's counts and offsets, a dead letter or two: never the base


def code(i: int) -> str:
    return f"K{i:05d}"


def value(i: int, name: str) -> dict[str, Any]:
    return {"faa": code(i), "name": name, "lat": 1.0, "lon": 2.0, "alt": i, "tz": -5, "dst": "A", "tzone": None}


@contextlib.contextmanager
def driver_guard(spark: Any) -> Iterator[list[int]]:
    """Record the rows every DataFrame action brings to the driver while the block runs."""
    cls = type(spark.range(1))
    seen: list[int] = []
    originals = {name: getattr(cls, name) for name in ("collect", "toArrow", "toPandas", "toLocalIterator")}

    def wrap(name: str, fn: Any) -> Any:
        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = fn(self, *args, **kwargs)
            if name == "toLocalIterator":
                out = list(out)
            seen.append(out.num_rows if name == "toArrow" else len(out))
            return iter(out) if name == "toLocalIterator" else out

        return counted

    for name, fn in originals.items():
        setattr(cls, name, wrap(name, fn))
    try:
        yield seen
    finally:
        for name, fn in originals.items():
            setattr(cls, name, fn)


class Fixture:
    def __init__(self, spark: Any, env: Any, join: str = "lookup"):
        self.spark, self.env, self.join = spark, env, join
        self.checkpoint = env.tmp / "checkpoint"

    def put(self, items: list[tuple[int, str | None]]) -> None:
        env = self.env
        for i, name in items:
            record = None if name is None else env.airport_ser(value(i, name))
            env.producer.produce(env.airports, key=env.key_ser({"faa": code(i)}), value=record)
        assert env.producer.flush(30) == 0

    def snapshot(self) -> Snapshot:
        env = self.env
        snapshots = [
            {
                **env.config().model_dump()["snapshots"][0],
                "broadcast_max_rows": 1000,
                "overlay_max_rows": 500,
                "partitions": 4,
                "partitioned_join": self.join,
            }
        ]
        config = env.config(snapshots=snapshots)
        plan = build_plan(config, self.spark, env.tmp).snapshots["airports"]
        watermarks = TopicWatermarks(env.kafka)
        spark_folder = child(str(self.checkpoint), "snapshots", "airports")
        checkpoint = SnapshotCheckpoint(
            CheckpointFs(str(self.checkpoint)), "airports", plan.schema_id, spark_folder=spark_folder
        )
        return Snapshot(
            self.spark,
            env.kafka,
            plan,
            WriterSchemas(env.kafka, watermarks),
            watermarks,
            checkpoint,
            DeadLetterProducer(env.kafka, env.dlq, "test"),
            "test",
        )

    def names(self, snap: Snapshot, indices: list[int]) -> dict[int, str | None]:
        events = self.spark.createDataFrame([(code(i),) for i in indices], "origin string")
        lookup = LookupConfig(snapshot="airports", on={"origin": "faa"}, prefix="o_", fields=["name"])
        rows = enrich(events, [BoundLookup(lookup, snap.view())]).collect()
        return {int(r["origin"][1:]): r["o_name"] for r in rows}

    def versions(self) -> dict[str, dict[str, Any]]:
        folder = self.checkpoint / "snapshots" / "airports"
        return {
            v.name: json.loads((v / "_manifest.json").read_text())
            for v in sorted(folder.iterdir())
            if (v / "_manifest.json").exists()
        }


def lookup_files(fx: Fixture, version: str) -> dict[str, float]:
    """The lookup files of a version and their modification times."""
    folder = fx.checkpoint / "snapshots" / "airports" / version / "lookup"
    return {p.name: p.stat().st_mtime_ns for p in sorted(folder.glob("b*.arrow"))}


@pytest.mark.parametrize("join", ["lookup", "sort_merge"])
def test_partitioned_snapshot_stays_on_the_executors_and_restarts_from_its_version(spark, env, join):
    fx = Fixture(spark, env, join)
    fx.put([(i, f"n{i}") for i in range(KEYS)])
    snap = fx.snapshot()
    with driver_guard(spark) as seen:
        stats = snap.bootstrap()
    assert max(seen, default=0) <= MAX_ROWS_TO_DRIVER, seen
    assert snap.mode == "partitioned" and stats["source"] == "topics" and snap.base_rows == KEYS
    first = fx.versions()
    assert len(first) == 1 and next(iter(first.values()))["rows"] == KEYS  # written by the executors
    version = next(iter(first))
    data = fx.checkpoint / "snapshots" / "airports" / version / "data"
    assert len(list(data.glob("part-*.parquet"))) == 4  # one file per bucket: nothing was reshuffled to write it
    if join == "lookup":  # one hash-sorted file per bucket, written with the version; micro-batches search them
        assert list(lookup_files(fx, version)) == [f"b{b:05d}.arrow" for b in range(4)]
        assert snap.view().lookup_files == str(data.parent / "lookup")
    else:
        assert lookup_files(fx, version) == {} and snap.view().lookup_files is None

    # a small refresh goes to the driver's overlay (the changes, not the base)
    fx.put([(1, "updated"), (2, None), (99_999, "new")])
    with driver_guard(spark) as seen:
        snap.catch_up()
    assert max(seen, default=0) <= MAX_ROWS_TO_DRIVER and snap.overlay_rows == 3
    assert fx.names(snap, [1, 2, 3, 99_999]) == {1: "updated", 2: None, 3: "n3", 99_999: "new"}

    # a large delta (more than overlay_max_rows) is read, decoded and merged by the executors, overlay folded in
    fx.put([(i, f"big{i}") for i in range(10_000, 10_600)] + [(3, None)])
    with driver_guard(spark) as seen:
        snap.catch_up()
    assert max(seen, default=0) <= MAX_ROWS_TO_DRIVER, seen
    assert snap.overlay_rows == 0 and snap.base.version != version
    expected = {1: "updated", 2: None, 3: None, 4: "n4", 10_000: "big10000", 10_599: "big10599", 99_999: "new"}
    assert fx.names(snap, list(expected)) == expected
    assert snap.base_rows == KEYS - 2 + 1
    merged = fx.versions()
    assert merged[snap.base.version]["offsets"] == json.loads(offsets_json(snap.offsets))  # the manifest: offsets
    # and the columns exactly as the files hold them: a restart registers the version without reading a footer
    files = fx.checkpoint / "snapshots" / "airports" / snap.base.version / "data"
    assert merged[snap.base.version]["columns"] == spark.read.parquet(str(files)).schema.toDDL()
    written = lookup_files(fx, snap.base.version)
    assert len(written) == (4 if join == "lookup" else 0)
    snap.close()

    # a restart, as on another driver: the newest version is registered and cached, nothing re-read but the tail
    fx.put([(4, "after restart")])
    again = fx.snapshot()
    with driver_guard(spark) as seen:
        stats = again.bootstrap()
    assert max(seen, default=0) <= MAX_ROWS_TO_DRIVER, seen
    assert stats["source"] == "checkpoint" and stats["records"] == 1  # the tail only
    assert again.mode == "partitioned" and again.base_rows == KEYS - 1
    assert fx.names(again, list(expected)) == {**expected, 4: "after restart"}
    assert lookup_files(fx, again.base.version) == written  # found beside the version, not written again
    assert (again.view().lookup_files is not None) == (join == "lookup")
    again.close()
