"""The job's plan: config checked against its Avro schemas, all problems at once, derived output schemas."""

from __future__ import annotations

import json

import pytest

from kernel.exceptions import ConfigError
from stream_app.config import StreamJobConfig
from stream_app.plan import build_plan
from stream_app.plan.model import Aggregate
from stream_app.plan.writer_match import writers_for

FLIGHT = {
    "type": "record",
    "name": "Flight",
    "namespace": "threes.test",
    "fields": [
        {"name": "flight_id", "type": "long"},
        {"name": "origin", "type": "string"},
        {"name": "dep_delay", "type": ["null", "double"], "default": None},
        {"name": "carrier", "type": "string"},
        {"name": "time_hour", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    ],
}


def config(tmp_path, **overrides):
    (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
    data = {
        "events": {"topic": "flights", "value_schema": "flight.avsc"},
        "snapshots": [{"name": "airports", "topics": ["state.airports"], "key_schema": "nycflights13/airport_key",
                       "value_schema": "nycflights13/airport"}],
        "lookups": [{"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_"}],
        "enriched_topic": "flights.enriched",
        "dead_letter_topic": "flights.dlq",
        "checkpoint_location": str(tmp_path / "cp"),
        "updates": [
            {"topic": "updates.flights", "kind": "projection", "key": ["flight_id"], "fields": ["flight_id", "origin_name"]},
            {"topic": "updates.delays", "kind": "aggregation", "group_by": ["origin", "origin_tz"], "event_time": "time_hour",
             "aggregations": {"flights": "count", "mean_delay": "mean(dep_delay)", "total": "sum(dep_delay)"}},
        ],
    }
    data.update(overrides)
    return StreamJobConfig.model_validate(data)


def test_plan_derives_enriched_and_update_schemas(tmp_path):
    plan = build_plan(config(tmp_path), None, tmp_path)
    names = [f["name"] for f in plan.enriched.avro["fields"]]
    assert names[:5] == ["flight_id", "origin", "dep_delay", "carrier", "time_hour"]
    assert names[5:] == ["origin_faa", "origin_name", "origin_lat", "origin_lon", "origin_alt", "origin_tz", "origin_dst", "origin_tzone"]
    projection, aggregation = plan.updates
    assert [f["name"] for f in projection.key.avro["fields"]] == ["flight_id"]
    assert [f["name"] for f in projection.value.avro["fields"]] == ["flight_id", "origin_name"]
    assert [f["name"] for f in aggregation.key.avro["fields"]] == ["origin", "origin_tz", "window_start"]
    value = {f["name"]: f["type"] for f in aggregation.value.avro["fields"]}
    assert value["flights"] == "long" and value["mean_delay"] == ["null", "double"] and value["total"] == ["null", "double"]
    assert aggregation.aggregations == [
        Aggregate("flights", "count", None), Aggregate("mean_delay", "mean", "dep_delay"), Aggregate("total", "sum", "dep_delay")
    ]


def test_every_schema_problem_is_reported_with_its_path(tmp_path):
    cfg = config(
        tmp_path,
        lookups=[
            {"snapshot": "airports", "on": {"origin_code": "faa"}, "prefix": "o_"},
            {"snapshot": "airports", "on": {"origin": "code"}, "prefix": "d_", "fields": ["name", "nope"]},
        ],
        updates=[],
    )
    with pytest.raises(ConfigError) as exc:
        build_plan(cfg, None, tmp_path)
    got = {(p.path, p.message.split(" (")[0]) for p in exc.value.problems}
    assert any(path == "stream.lookups[0].on.origin_code"
               and msg.startswith("no column 'origin_code' in the event, the derive columns or an earlier lookup")
               for path, msg in got)
    assert ("stream.lookups[1].on.origin", "no field 'code' in the key schema of snapshot airports") in got
    assert any(p == "stream.lookups[1].on" and "missing ['faa']" in m for p, m in got)
    assert ("stream.lookups[1].fields", "no field 'nope' in the value schema of snapshot airports") in got


def test_update_fields_are_checked_against_the_enriched_event(tmp_path):
    cfg = config(tmp_path, updates=[
        {"topic": "u1", "kind": "projection", "key": ["id"], "version": "carrier"},
        {"topic": "u2", "kind": "aggregation", "group_by": ["origin"], "event_time": "carrier",
         "aggregations": {"m": "mean(carrier)"}},
    ])
    with pytest.raises(ConfigError) as exc:
        build_plan(cfg, None, tmp_path)
    paths = {p.path: p.message for p in exc.value.problems}
    assert "no field 'id'" in paths["stream.updates[0].key"]
    assert "not numeric" in paths["stream.updates[0].version"]
    assert "not an Avro timestamp" in paths["stream.updates[1].event_time"]
    assert "not numeric" in paths["stream.updates[1].aggregations.m"]


def test_missing_schema_file_is_a_config_problem(tmp_path):
    cfg = config(tmp_path, events={"topic": "flights", "value_schema": "missing.avsc"})
    with pytest.raises(ConfigError) as exc:
        build_plan(cfg, None, tmp_path)
    assert exc.value.problems[0].path == "stream.events.value_schema"


def test_config_model_rejects_inconsistent_updates(tmp_path):
    with pytest.raises(ValueError, match="needs `key`"):
        config(tmp_path, updates=[{"topic": "u", "kind": "projection"}])
    with pytest.raises(ValueError, match="needs group_by, aggregations, event_time"):
        config(tmp_path, updates=[{"topic": "u", "kind": "aggregation"}])
    with pytest.raises(ValueError, match="not count, mean"):
        config(tmp_path, updates=[{"topic": "u", "kind": "aggregation", "group_by": ["a"], "event_time": "t",
                                   "aggregations": {"x": "median(a)"}}])
    with pytest.raises(ValueError, match="own prefix"):
        config(tmp_path, lookups=[{"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "p_"}] * 2)


def test_writers_for_keeps_the_entity_and_its_aliases():
    reader = {"type": "record", "name": "Flight", "namespace": "a", "aliases": ["OldFlight"], "fields": []}
    writers = {
        b"1" * 8: json.dumps({"type": "record", "name": "a.Flight", "fields": []}),
        b"2" * 8: json.dumps({"type": "record", "name": "OldFlight", "namespace": "a", "fields": []}),
        b"3" * 8: json.dumps({"type": "record", "name": "Airport", "namespace": "a", "fields": []}),
    }
    assert sorted(writers_for(writers, reader)) == [b"1" * 8, b"2" * 8]
