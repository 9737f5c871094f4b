"""The example YAML agrees with the oracle and with the schemas the stream job derives."""

from __future__ import annotations

from pathlib import Path

from schemas import load_schema
from stream_app.plan import build_plan
from threes.config import load_pipeline
from threes.demo import oracle

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "nycflights13" / "pipeline.yaml"
SNAPSHOT_TABLE = {"airlines": "airlines", "airports": "airports", "planes": "planes", "weather": "weather"}


def _fields(schema: dict) -> list[tuple[str, object]]:
    return [(f["name"], f["type"]) for f in schema["fields"]]


def test_example_validates_and_its_lookups_are_the_oracle_s() -> None:
    pipeline = load_pipeline(EXAMPLE, environ={})
    lookups = pipeline.stream.lookups
    assert [(lk.prefix, SNAPSHOT_TABLE[lk.snapshot], dict(lk.on), tuple(lk.fields or ())) for lk in lookups] == [
        (lk.prefix, lk.table, dict(lk.on), lk.fields) for lk in oracle.LOOKUPS
    ]
    assert all(lk.how == "left" for lk in lookups)
    assert {s.name for s in pipeline.sources} == set(SNAPSHOT_TABLE)
    projection = next(u for u in pipeline.stream.updates if u.kind == "projection")
    assert tuple(projection.key) == oracle.FLIGHT_KEY
    aggregation = next(u for u in pipeline.stream.updates if u.kind == "aggregation")
    assert tuple(aggregation.group_by) == oracle.ROUTE_KEY
    assert tuple(aggregation.aggregations) == oracle.ROUTE_VALUES


def test_shipped_enriched_and_route_stats_schemas_are_what_the_job_writes() -> None:
    pipeline = load_pipeline(EXAMPLE, environ={})
    plan = build_plan(pipeline.stream, None, EXAMPLE.parent)
    assert _fields(plan.enriched.avro) == _fields(load_schema("nycflights13/enriched_flight"))
    by_topic = {u.config.topic: u for u in plan.updates}
    assert _fields(by_topic["updates.route_stats"].value.avro) == _fields(load_schema("nycflights13/route_stats"))
    assert [f["name"] for f in by_topic["updates.flights"].value.avro["fields"]] == oracle.enriched_columns()


def test_the_sink_keys_are_the_update_keys() -> None:
    pipeline = load_pipeline(EXAMPLE, environ={})
    plan = build_plan(pipeline.stream, None, EXAMPLE.parent)
    keys = {u.config.topic: [f["name"] for f in u.key.avro["fields"]] for u in plan.updates}
    route_sink = next(s for svc in pipeline.sync for s in svc.sinks if s.type == "rds_sink")
    assert route_sink.key == keys["updates.route_stats"]
    assert keys["updates.flights"] == list(oracle.FLIGHT_KEY)
