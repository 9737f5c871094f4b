"""Hopping and session windows, the aggregate functions beyond count/mean/sum/min/max: parsing, types, validation.

Every bad window or aggregation spec is reported by ``threes validate`` as ``file:line: key.path: message``.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kernel.exceptions import ConfigError
from stream_app.aggregation_specs import AggregationSpec, parse_aggregation
from stream_app.plan import build_plan
from stream_app.plan.model import Aggregate
from stream_app.update_config import UpdateConfig
from stream_app.updates import aggregation_input_fields, output_mode
from threes.cli import app

from .test_plan import FLIGHT, config

ORDER = {
    "type": "record", "name": "Order", "namespace": "threes.test",
    "fields": [
        {"name": "order_id", "type": "long"},
        {"name": "customer_id", "type": "int"},
        {"name": "country", "type": "string"},
        {"name": "quantity", "type": "int"},
        {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "price", "type": ["null", "float"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


def _order_plan(tmp_path, aggregations, **window):
    (tmp_path / "order.avsc").write_text(json.dumps(ORDER))
    update = {"topic": "updates.revenue", "kind": "aggregation", "group_by": ["country"], "event_time": "ts",
              "aggregations": aggregations, **window}
    cfg = config(tmp_path, events={"topic": "orders", "value_schema": "order.avsc"}, snapshots=[], lookups=[],
                 updates=[update])
    return build_plan(cfg, None, tmp_path)


def test_the_parser_reads_every_function_and_its_arguments():
    assert parse_aggregation("count") == AggregationSpec("count", None)
    assert parse_aggregation("count_distinct( customer_id )") == AggregationSpec("count_distinct", "customer_id")
    assert parse_aggregation("approx_count_distinct(x)") == AggregationSpec("approx_count_distinct", "x")
    assert parse_aggregation("first(x)").fn == "first" and parse_aggregation("last(x)").fn == "last"
    assert parse_aggregation("stddev(x)") == AggregationSpec("stddev", "x")
    assert parse_aggregation("percentile(amount, 0.95)") == AggregationSpec("percentile", "amount", 0.95)
    for bad, why in [
        ("median(x)", "is not count, mean"),
        ("count(x)", "count takes no field"),
        ("stddev", "stddev needs a field"),
        ("sum(x, 0.5)", "sum takes one field"),
        ("percentile(x)", "p in \\(0, 1\\)"),
        ("percentile(x, 1)", "p in \\(0, 1\\)"),
        ("percentile(x, 0)", "p in \\(0, 1\\)"),
        ("percentile(x, half)", "p in \\(0, 1\\)"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_aggregation(bad)


def test_each_new_function_has_its_output_type(tmp_path):
    plan = _order_plan(tmp_path, {
        "lines": "count", "customers": "count_distinct(customer_id)", "approx": "approx_count_distinct(country)",
        "first_amount": "first(amount)", "last_price": "last(price)", "sd": "stddev(quantity)",
        "p95": "percentile(quantity, 0.95)", "p50_amount": "percentile(amount, 0.5)", "p90_price": "percentile(price, 0.9)",
    })
    update = plan.updates[0]
    types = {f["name"]: f["type"] for f in update.value.avro["fields"]}
    decimal = {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}
    assert types["customers"] == "long" and types["approx"] == "long"  # never null: 0 distinct values at worst
    assert types["first_amount"] == ["null", decimal]  # the field's own type, null when the earliest event's is
    assert types["last_price"] == ["null", "float"]
    assert types["sd"] == ["null", "double"]  # sample stddev: null for a window of one event
    assert types["p95"] == ["null", "int"] and types["p50_amount"] == ["null", decimal]  # one of the values seen
    assert types["p90_price"] == ["null", "float"]
    assert Aggregate("p95", "percentile", "quantity", 0.95) in update.aggregations
    assert set(aggregation_input_fields(update)) == {"country", "ts", "customer_id", "amount", "price", "quantity"}


def test_windows_keep_the_update_key_and_sessions_are_appended(tmp_path):
    hopping = _order_plan(tmp_path, {"lines": "count"}, window="1 hour", slide="10 minutes").updates[0]
    session = _order_plan(tmp_path, {"lines": "count"}, window="session", gap="30 minutes").updates[0]
    tumbling = _order_plan(tmp_path, {"lines": "count"}, window="1 hour").updates[0]
    for plan in (hopping, session, tumbling):
        assert [f["name"] for f in plan.key.avro["fields"]] == ["country", "window_start"]
    assert [output_mode(p) for p in (hopping, session, tumbling)] == ["update", "append", "update"]
    assert (hopping.config.window, hopping.config.slide, hopping.config.gap) == ("1 hour", "10 minutes", None)
    assert (session.config.window, session.config.slide, session.config.gap) == ("session", None, "30 minutes")


def test_the_plan_rejects_fields_a_function_cannot_take(tmp_path):
    with pytest.raises(ConfigError) as exc:
        _order_plan(tmp_path, {"a": "stddev(country)", "b": "percentile(country, 0.5)", "c": "count_distinct(tags)",
                               "d": "first(tags)", "e": "last(nope)", "f": "approx_count_distinct(nope)"})
    got = {p.path: p.message for p in exc.value.problems}
    assert got["stream.updates[0].aggregations.a"].startswith("field 'country' is not numeric")
    assert got["stream.updates[0].aggregations.b"].startswith("field 'country' is not numeric")
    assert got["stream.updates[0].aggregations.c"].startswith("field 'tags' is a record, enum, fixed, array or map")
    assert got["stream.updates[0].aggregations.d"].startswith("field 'tags' is a record, enum, fixed, array or map")
    assert got["stream.updates[0].aggregations.e"].startswith("no field 'nope' in the enriched event")
    assert got["stream.updates[0].aggregations.f"].startswith("no field 'nope' in the enriched event")


def test_slide_and_gap_are_aggregation_keys():
    with pytest.raises(ValueError, match="slide not allowed for kind projection"):
        UpdateConfig.model_validate({"topic": "u", "key": ["k"], "slide": "1 minute"})
    with pytest.raises(ValueError, match="gap not allowed for kind projection"):
        UpdateConfig.model_validate({"topic": "u", "key": ["k"], "window": "session", "gap": "1 minute"})


PIPELINE = """\
version: 1
kafka:
  bootstrap_servers: 127.0.0.1:19092
stream:
  events: {topic: flights, value_schema: schemas/flight.avsc}
  enriched_topic: flights.enriched
  dead_letter_topic: flights.dlq
  updates:
    - topic: updates.hourly
      kind: aggregation
      group_by: [origin]
      event_time: time_hour
      window: 1 hour
      slide: 10 minutes
      aggregations:
        flights: count
        carriers: count_distinct(carrier)
        p90: percentile(dep_delay, 0.9)
    - topic: updates.sessions
      kind: aggregation
      group_by: [carrier]
      event_time: time_hour
      window: session
      gap: 30 minutes
      aggregations:
        legs: count
        first_origin: first(origin)
        spread: stddev(dep_delay)
  checkpoint_location: cp
"""


def _validate(tmp_path, text):
    (tmp_path / "schemas").mkdir(exist_ok=True)
    (tmp_path / "schemas" / "flight.avsc").write_text(json.dumps(FLIGHT))
    path = tmp_path / "pipeline.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["validate", str(path)])
    return path, result


def _line(path, text, after=0):
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line and i > after)


def test_hopping_and_session_windows_validate(tmp_path):
    _, result = _validate(tmp_path, PIPELINE)
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("old", "new", "key", "message"),
    [
        ("slide: 10 minutes", "slide: 2 hours", "stream.updates[0].slide",
         "slide '2 hours' is longer than window '1 hour': it must be at most the window"),
        ("slide: 10 minutes", "slide: 10 minutos", "stream.updates[0].slide", "expected '<n> second(s)|minute(s)"),
        ("window: 1 hour", "window: an hour", "stream.updates[0].window", "expected '<n> second(s)|minute(s)"),
        ("window: 1 hour", "window: 0 hours", "stream.updates[0].window", "a window lasts more than 0 seconds"),
        ("window: session\n      gap: 30 minutes", "window: session\n      gap: 30 minutes\n      slide: 5 minutes",
         "stream.updates[1].slide", "slide does not apply to window: session"),
        ("gap: 30 minutes", "gap: 30 mins", "stream.updates[1].gap", "expected '<n> second(s)|minute(s)"),
        ("slide: 10 minutes", "gap: 10 minutes", "stream.updates[0].gap", "gap applies to window: session only"),
        ("count_distinct(carrier)", "count_distinct(carrier, 0.5)", "stream.updates[0].aggregations.carriers",
         "count_distinct takes one field"),
        ("percentile(dep_delay, 0.9)", "percentile(dep_delay, 90)", "stream.updates[0].aggregations.p90",
         "percentile(f, p) needs p in (0, 1)"),
        ("stddev(dep_delay)", "std(dep_delay)", "stream.updates[1].aggregations.spread", "'std(dep_delay)' is not count"),
    ],
)
def test_a_bad_window_or_aggregation_is_reported_with_file_line_and_key_path(tmp_path, old, new, key, message):
    path, result = _validate(tmp_path, PIPELINE.replace(old, new))
    assert result.exit_code == 1
    line = _line(path, new.splitlines()[-1].strip())
    assert f"{path}:{line}: {key}: " in result.output and message in result.output, result.output


def test_a_session_without_gap_is_reported_at_its_update(tmp_path):
    path, result = _validate(tmp_path, PIPELINE.replace("      gap: 30 minutes\n", ""))
    assert result.exit_code == 1
    line = _line(path, "- topic: updates.sessions")
    assert f"{path}:{line}: stream.updates[1].gap: window: session needs a gap" in result.output, result.output


@pytest.mark.parametrize(
    ("old", "new", "key", "message"),
    [
        ("count_distinct(carrier)", "count_distinct(carier)", "stream.updates[0].aggregations.carriers",
         "no field 'carier' in the enriched event"),
        ("percentile(dep_delay, 0.9)", "percentile(carrier, 0.9)", "stream.updates[0].aggregations.p90",
         "field 'carrier' is not numeric"),
        ("stddev(dep_delay)", "stddev(origin)", "stream.updates[1].aggregations.spread", "field 'origin' is not numeric"),
        ("first(origin)", "first(origni)", "stream.updates[1].aggregations.first_origin", "no field 'origni'"),
    ],
)
def test_a_field_an_aggregation_cannot_take_is_reported_with_file_line_and_key_path(tmp_path, old, new, key, message):
    path, result = _validate(tmp_path, PIPELINE.replace(old, new))
    assert result.exit_code == 1
    line = _line(path, new)
    assert f"{path}:{line}: {key}: {message}" in result.output, result.output
