"""As-of lookups: the config's checks (no JVM) and the versions table's intervals (small frames, local Spark)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from stream_app.config import StreamJobConfig
from stream_app.snapshot.as_of_join import VersionsView, join_as_of
from stream_app.snapshot.version_intervals import FROM, TO, merge_versions
from stream_app.stages import DeriveStep, LookupStep

from .test_stream_language import plan_of, problems, stream

VERSIONED = [{"name": "orders", "topics": ["state.orders"], "key_schema": "order_key.avsc",
              "value_schema": "order.avsc", "retention": "7 days"}]


def test_as_of_needs_a_snapshot_with_retention(tmp_path):
    data = stream(tmp_path, where=None, derive={}, updates=[], lookups=[
        {"snapshot": "orders", "on": {"order_id": "order_id"}, "as_of": "ts", "prefix": "order_"}])
    data["snapshots"] = [{k: v for k, v in VERSIONED[0].items() if k != "retention"}]
    with pytest.raises(ValidationError) as exc:
        StreamJobConfig.model_validate(data)
    assert "lookups[0].as_of: snapshot 'orders' keeps no versions: give it a `retention`" in str(exc.value)


def test_retention_is_a_duration_and_its_ms(tmp_path):
    data = stream(tmp_path, where=None, derive={}, updates=[], lookups=[])
    data["snapshots"] = [{**VERSIONED[0], "retention": "7 days"}]
    assert StreamJobConfig.model_validate(data).snapshots[0].retention_ms == 7 * 86_400_000
    data["snapshots"] = [{**VERSIONED[0], "retention": "a week"}]
    with pytest.raises(ValidationError, match="expected '<n> second"):
        StreamJobConfig.model_validate(data)


def test_as_of_names_a_timestamp_or_date_column_and_orders_the_lookup_after_it(tmp_path):
    found = problems(tmp_path, where=None, derive={}, updates=[], snapshots=VERSIONED, lookups=[
        {"snapshot": "orders", "on": {"order_id": "order_id"}, "as_of": "sku", "prefix": "order_"}])
    assert any(p.startswith("stream.lookups[0].as_of: column 'sku' is not a timestamp or a date") for p in found)
    found = problems(tmp_path, where=None, derive={}, updates=[], snapshots=VERSIONED, lookups=[
        {"snapshot": "orders", "on": {"order_id": "order_id"}, "as_of": "nosuch", "prefix": "order_"}])
    assert any(p.startswith("stream.lookups[0].as_of: no column 'nosuch'") for p in found), found
    # a derive column (a date) is a valid event time: the lookup waits for it
    plan = plan_of(tmp_path, where=None, derive={"day": "to_date(ts)"}, updates=[], snapshots=VERSIONED, lookups=[
        {"snapshot": "orders", "on": {"order_id": "order_id"}, "as_of": "day", "prefix": "order_"}])
    assert plan.steps == [DeriveStep((("day", "to_date(ts)"),)), LookupStep((0,))]


def test_wait_for_reference_is_a_duration_of_an_as_of_lookup_on_an_event_field(tmp_path):
    lookup = {"snapshot": "orders", "on": {"order_id": "order_id"}, "as_of": "ts", "prefix": "order_",
              "wait_for_reference": "30 seconds"}
    data = stream(tmp_path, where=None, derive={}, updates=[], lookups=[lookup])
    data["snapshots"] = VERSIONED
    assert StreamJobConfig.model_validate(data).lookups[0].wait_for_reference_s == 30.0
    data["lookups"] = [{k: v for k, v in lookup.items() if k != "as_of"}]
    with pytest.raises(ValidationError, match=r"lookups\[0\].wait_for_reference: applies to a lookup with as_of"):
        StreamJobConfig.model_validate(data)
    data["lookups"] = [{**lookup, "wait_for_reference": "0 seconds"}]
    with pytest.raises(ValidationError, match="a wait lasts more than 0 seconds"):
        StreamJobConfig.model_validate(data)
    # the wait reads the event's own time, before derive columns exist
    found = problems(tmp_path, where=None, derive={"day": "to_date(ts)"}, updates=[], snapshots=VERSIONED,
                     lookups=[{**lookup, "as_of": "day"}])
    assert any(p.startswith("stream.lookups[0].wait_for_reference: as_of 'day' is not an event field") for p in found)
    plan_of(tmp_path, where=None, derive={}, updates=[], snapshots=VERSIONED, lookups=[lookup])  # no problem


ROW = "__lk string, __ts long, __deleted boolean, __rank int, __partition int, __offset long, name string"


def versions(spark: Any, stored: Any, records: list[tuple], horizon: int | None = None) -> list[tuple]:
    frame = spark.createDataFrame(records, ROW)
    merged = merge_versions(stored, frame, ["name"], horizon)
    return merged, sorted((r["__lk"], r[FROM], r[TO], r["name"]) for r in merged.collect())


def test_intervals_by_source_time_tombstones_end_them_ties_go_to_the_later_offset(spark):
    _, rows = versions(spark, None, [
        ("k", 30, False, 0, 0, 1, "C"),  # read first, but the newest by source time
        ("k", 10, False, 0, 0, 2, "A"),
        ("k", 20, False, 0, 0, 3, "B"),
        ("d", 5, False, 0, 0, 4, "x"),
        ("d", 15, True, 0, 0, 5, None),  # deleted at 15
        ("d", 25, False, 0, 0, 6, "y"),  # back at 25
        ("t", 7, False, 0, 0, 7, "first"),
        ("t", 7, False, 0, 0, 8, "second"),  # same time: the later offset wins, the other lasts no time
    ])
    assert rows == [
        ("d", 5, 15, "x"), ("d", 25, None, "y"),
        ("k", 10, 20, "A"), ("k", 20, 30, "B"), ("k", 30, None, "C"),
        ("t", 7, None, "second"),
    ]


def test_a_merge_touches_only_the_new_records_keys_keeps_tombstone_ends_and_drops_what_retention_passed(spark):
    stored, _ = versions(spark, None, [
        ("a", 10, False, 0, 0, 1, "a1"), ("a", 20, True, 0, 0, 2, None),
        ("b", 10, False, 0, 0, 3, "b1"),
    ])
    _, rows = versions(spark, stored, [
        ("a", 30, False, 0, 0, 4, "a2"),  # after the delete: a stays deleted in [20, 30)
        ("b", 10, False, 0, 0, 5, "b1'"),  # same time as the stored version: the new record wins
        ("b", 40, False, 0, 0, 6, "b2"),
    ])
    assert rows == [("a", 10, 20, "a1"), ("a", 30, None, "a2"), ("b", 10, 40, "b1'"), ("b", 40, None, "b2")]
    _, rows = versions(spark, stored, [("c", 50, False, 0, 0, 7, "c1")], horizon=25)
    assert rows == [("b", 10, None, "b1"), ("c", 50, None, "c1")]  # a's versions ended at 20 <= 25


def test_join_as_of_gives_the_version_valid_at_the_event_time_and_nothing_before_the_horizon(spark):
    from pyspark.sql import functions as f

    stored, _ = versions(spark, None, [
        ("k", 10, False, 0, 0, 1, "A"), ("k", 20, False, 0, 0, 2, "B"), ("k", 30, True, 0, 0, 3, None),
    ])
    events = spark.createDataFrame([(1, "k", 9), (2, "k", 10), (3, "k", 19), (4, "k", 20), (5, "k", 35),
                                    (6, "z", 15), (7, "k", None), (8, "k", 4)], "id int, key string, t long")
    for broadcast in (True, False):
        view = VersionsView(stored, 2, 5, broadcast)
        joined, cols = join_as_of(events, 0, "key", f.col("t"), view, ["name"], "left", None)
        got = {r["id"]: r["name"] for r in joined.select("id", cols[0].alias("name")).collect()}
        assert got == {1: None, 2: "A", 3: "A", 4: "B", 5: None, 6: None, 7: None, 8: None}
        inner, cols = join_as_of(events, 0, "key", f.col("t"), view, ["name"], "inner", None)
        assert sorted(r["id"] for r in inner.collect()) == [2, 3, 4]
