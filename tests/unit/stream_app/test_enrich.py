"""Join semantics of enrich(), the same for its three engines (Spark broadcast, worker index, partitioned)."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from stream_app.config import LookupConfig
from stream_app.enrich import BoundLookup, enrich
from stream_app.snapshot.data import lookup_key
from stream_app.snapshot.view import SnapshotView

pytestmark = pytest.mark.spark

MODES = ["broadcast", "indexed", "partitioned"]

AIRPORTS = [("EWR", "Newark", 18, -5), ("JFK", "Kennedy", 13, -5), ("LAX", "Los Angeles", 125, -8)]
AT = dt.datetime(2013, 1, 1, 6, 30, tzinfo=dt.UTC)
WEATHER = [(2013, 1, "EWR", 39.0, AT), (2013, 1, "JFK", 39.9, AT), (2013, 2, "EWR", 41.0, AT)]


def airports(spark, mode, rows=AIRPORTS):
    df = spark.createDataFrame(rows, "faa string, name string, alt int, tz int")
    return SnapshotView.from_dataframe(spark, "airports", df, ["faa"], mode)


def weather(spark, mode):
    df = spark.createDataFrame(WEATHER, "year int, month int, origin string, temp double, at timestamp")
    return SnapshotView.from_dataframe(spark, "weather", df, ["year", "month", "origin"], mode)


def flights(spark):
    return spark.createDataFrame(
        [(1, "EWR", "LAX", 2013, 1), (2, "JFK", "SFO", 2013, 2), (3, None, "EWR", 2013, 1)],
        "id long, origin string, dest string, year long, month int",
    )


def lookup(view, on, prefix, how="left", fields=None):
    return BoundLookup(LookupConfig(snapshot=view.name, on=on, prefix=prefix, how=how, fields=fields), view)


def by_id(df):
    return {r["id"]: r.asDict() for r in df.collect()}


def python_evaluations(df):
    """How many times the physical plan evaluates Python UDFs over the batch (``ArrowEvalPython`` nodes)."""
    return df._jdf.queryExecution().executedPlan().toString().count("ArrowEvalPython")


def test_an_inner_lookup_in_python_runs_once_per_batch(spark):
    """The inner lookup's filter is not pushed below the lookup with the UDF call copied into it."""
    view = airports(spark, "indexed")
    inner = enrich(flights(spark), [lookup(view, {"dest": "faa"}, "dest_", "inner")])
    assert python_evaluations(inner) == 1
    assert sorted(by_id(inner)) == [1, 3]


@pytest.mark.parametrize("mode", MODES)
def test_left_keeps_unmatched_with_nulls_inner_drops(spark, mode):
    view = airports(spark, mode)
    left = by_id(enrich(flights(spark), [lookup(view, {"dest": "faa"}, "dest_")]))
    assert left[1]["dest_name"] == "Los Angeles" and left[1]["dest_tz"] == -8
    assert left[2]["dest_name"] is None and left[2]["dest_alt"] is None  # SFO is not in the snapshot
    assert left[3]["dest_name"] == "Newark"
    inner = by_id(enrich(flights(spark), [lookup(view, {"dest": "faa"}, "dest_", "inner")]))
    assert sorted(inner) == [1, 3]


@pytest.mark.parametrize("mode", MODES)
def test_same_snapshot_twice_and_a_null_foreign_key(spark, mode):
    view = airports(spark, mode)
    out = enrich(
        flights(spark),
        [lookup(view, {"origin": "faa"}, "origin_", fields=["name"]), lookup(view, {"dest": "faa"}, "dest_")],
    )
    assert out.columns == ["id", "origin", "dest", "year", "month", "origin_name", "dest_name", "dest_alt", "dest_tz"]
    got = by_id(out)
    assert (got[1]["origin_name"], got[1]["dest_name"]) == ("Newark", "Los Angeles")
    assert (got[3]["origin_name"], got[3]["dest_name"]) == (None, "Newark")  # null origin matches nothing


@pytest.mark.parametrize("mode", MODES)
def test_composite_foreign_key(spark, mode):
    view = weather(spark, mode)
    got = by_id(enrich(flights(spark), [lookup(view, {"year": "year", "month": "month", "origin": "origin"}, "w_")]))
    assert got[1]["w_temp"] == 39.0 and got[2]["w_temp"] is None and got[3]["w_temp"] is None
    assert got[1]["w_at"].replace(tzinfo=dt.UTC) == AT  # timestamps survive every engine (session time zone UTC)


def overlay(spark, rows, deleted):
    """An overlay table (as the runtime builds it from Kafka) of airport rows."""
    df = spark.createDataFrame(rows, "faa string, name string, alt int, tz int")
    key_type = df.select("faa").schema
    lk = lookup_key(F.struct("faa"), key_type)
    arrow = df.select(lk.alias("__lk"), F.xxhash64(lk).alias("__lh"), "name", "alt", "tz").toArrow()
    return arrow.add_column(2, "__deleted", pa.array(deleted))


@pytest.mark.parametrize("mode", MODES)
def test_overlay_updates_deletes_and_inserts_win_over_the_base(spark, mode):
    view = airports(spark, mode)
    view.overlay = overlay(
        spark,
        [("LAX", "LAX renamed", 126, -8), ("EWR", None, None, None), ("SFO", "San Francisco", 13, -8)],
        [False, True, False],
    )
    out = enrich(flights(spark), [lookup(view, {"dest": "faa"}, "dest_"), lookup(view, {"origin": "faa"}, "origin_", "inner")])
    got = by_id(out)
    # flight 3 has no origin: dropped by the inner lookup; EWR is deleted: flight 1 dropped too
    assert sorted(got) == [2]
    assert got[2]["dest_name"] == "San Francisco" and got[2]["origin_name"] == "Kennedy"
    left = by_id(enrich(flights(spark), [lookup(view, {"dest": "faa"}, "dest_"), lookup(view, {"origin": "faa"}, "origin_")]))
    assert left[1]["dest_name"] == "LAX renamed" and left[1]["dest_alt"] == 126
    assert left[1]["origin_name"] is None  # EWR deleted in the overlay hides the base row
    assert left[3]["dest_name"] is None


@pytest.mark.parametrize("mode", MODES)
def test_passthrough_rows_survive_inner_lookups(spark, mode):
    view = airports(spark, mode)
    events = flights(spark).withColumn("__error", F.when(F.col("id") == 2, F.lit("bad record")))
    got = by_id(enrich(events, [lookup(view, {"dest": "faa"}, "dest_", "inner")], passthrough="__error"))
    assert sorted(got) == [1, 2, 3] and got[2]["__error"] == "bad record" and got[2]["dest_name"] is None


def test_prefix_collision_is_an_error(spark):
    view = airports(spark, "broadcast")
    events = flights(spark).withColumn("dest_name", F.lit("x"))
    with pytest.raises(ValueError, match="dest_name"):
        enrich(events, [lookup(view, {"dest": "faa"}, "dest_")])
