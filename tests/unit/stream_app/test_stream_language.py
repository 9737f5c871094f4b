"""where, derive, delete_when and chained lookups: parsed, typed and ordered without a JVM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kernel.exceptions import ConfigError
from stream_app.config import StreamJobConfig
from stream_app.expressions import ExpressionError, check, parse
from stream_app.plan import build_plan
from stream_app.stages import DeriveStep, LookupStep, WhereStep

DECIMAL = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
TS = {"type": "long", "logicalType": "timestamp-millis"}
LINE = {"type": "record", "name": "Line", "namespace": "shop", "fields": [
    {"name": "line_id", "type": "long"}, {"name": "order_id", "type": "long"},
    {"name": "sku", "type": "string"}, {"name": "price", "type": DECIMAL}, {"name": "qty", "type": "int"},
    {"name": "status", "type": "string"}, {"name": "ts", "type": TS}]}
ORDER_KEY = {"type": "record", "name": "OrderKey", "namespace": "shop", "fields": [{"name": "order_id", "type": "long"}]}
ORDER = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "long"}, {"name": "customer_id", "type": "long"}, {"name": "channel", "type": "string"}]}
CUSTOMER_KEY = {"type": "record", "name": "CustomerKey", "namespace": "shop",
                "fields": [{"name": "customer_id", "type": "long"}]}
CUSTOMER = {"type": "record", "name": "Customer", "namespace": "shop", "fields": [
    {"name": "customer_id", "type": "long"}, {"name": "name", "type": "string"}, {"name": "nation", "type": "string"}]}
NATION_KEY = {"type": "record", "name": "NationKey", "namespace": "shop", "fields": [{"name": "code", "type": "string"}]}
NATION = {"type": "record", "name": "Nation", "namespace": "shop", "fields": [
    {"name": "code", "type": "string"}, {"name": "region", "type": "string"}]}


def write_schemas(folder: Path) -> None:
    for name, schema in {"line": LINE, "order_key": ORDER_KEY, "order": ORDER, "customer_key": CUSTOMER_KEY,
                         "customer": CUSTOMER, "nation_key": NATION_KEY, "nation": NATION}.items():
        (folder / f"{name}.avsc").write_text(json.dumps(schema))


def stream(tmp_path: Path, **overrides) -> dict:
    write_schemas(tmp_path)
    data = {
        "events": {"topic": "lines", "value_schema": "line.avsc"},
        "where": "status <> 'test'",
        "derive": {"amount": "price * qty", "day": "to_date(ts)", "nation_code": "upper(customer_nation)"},
        "snapshots": [
            {"name": s, "topics": [f"state.{s}"], "key_schema": f"{k}_key.avsc", "value_schema": f"{k}.avsc"}
            for s, k in (("orders", "order"), ("customers", "customer"), ("nations", "nation"))
        ],
        "lookups": [
            {"snapshot": "orders", "on": {"order_id": "order_id"}, "prefix": "order_", "fields": ["customer_id", "channel"]},
            {"snapshot": "customers", "on": {"order_customer_id": "customer_id"}, "prefix": "customer_"},
            {"snapshot": "nations", "on": {"nation_code": "code"}, "prefix": "n_", "how": "inner"},
        ],
        "enriched_topic": "lines.enriched",
        "dead_letter_topic": "lines.dlq",
        "checkpoint_location": str(tmp_path / "cp"),
        "updates": [
            {"topic": "updates.lines", "kind": "projection", "key": ["line_id"], "version": "offset",
             "delete_when": "status = 'cancelled'", "where": "amount > 0"},
            {"topic": "updates.revenue", "kind": "aggregation", "group_by": ["n_region"], "event_time": "ts",
             "window": "1 hour", "aggregations": {"lines": "count", "revenue": "sum(amount)"}, "where": "day IS NOT NULL"},
        ],
    }
    data.update(overrides)
    return data


def plan_of(tmp_path: Path, **overrides):
    return build_plan(StreamJobConfig.model_validate(stream(tmp_path, **overrides)), None, tmp_path)


def test_steps_follow_the_dag_where_first_derives_as_early_as_their_columns_exist(tmp_path):
    plan = plan_of(tmp_path)
    assert plan.steps == [
        WhereStep("status <> 'test'"),
        DeriveStep((("amount", "price * qty"), ("day", "to_date(ts)"))),
        LookupStep((0,)),
        LookupStep((1,)),
        DeriveStep((("nation_code", "upper(customer_nation)"),)),
        LookupStep((2,)),
    ]
    fields = {f["name"]: f["type"] for f in plan.enriched.avro["fields"]}
    # derived columns come last, in YAML order, nullable
    assert list(fields)[-3:] == ["amount", "day", "nation_code"]
    assert fields["day"] == ["null", {"type": "int", "logicalType": "date"}]
    assert fields["nation_code"] == ["null", "string"]
    assert fields["amount"][0] == "null" and fields["amount"][1]["logicalType"] == "decimal"
    # a chained lookup's columns: left lookups nullable
    assert fields["customer_nation"] == ["null", "string"] and "n_region" in fields


def test_where_reading_a_looked_up_column_runs_after_that_lookup(tmp_path):
    plan = plan_of(tmp_path, where="order_channel = 'web'", derive={}, lookups=[
        {"snapshot": "orders", "on": {"order_id": "order_id"}, "prefix": "order_"}], updates=[])
    assert plan.steps == [LookupStep((0,)), WhereStep("order_channel = 'web'")]


def test_independent_lookups_share_a_round_and_a_derive_on_them_follows(tmp_path):
    plan = plan_of(tmp_path, where=None, derive={"label": "concat(o1_channel, '/', o2_channel)"}, lookups=[
        {"snapshot": "orders", "on": {"order_id": "order_id"}, "prefix": "o1_"},
        {"snapshot": "orders", "on": {"line_id": "order_id"}, "prefix": "o2_"}], updates=[])
    assert plan.steps == [LookupStep((0, 1)), DeriveStep((("label", "concat(o1_channel, '/', o2_channel)"),))]


def problems(tmp_path: Path, **overrides) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        plan_of(tmp_path, **overrides)
    return [f"{p.path}: {p.message}" for p in exc.value.problems]


def test_a_cycle_of_lookups_is_named_with_its_yaml_path(tmp_path):
    found = problems(tmp_path, where=None, derive={}, updates=[], lookups=[
        {"snapshot": "orders", "on": {"c_customer_id": "order_id"}, "prefix": "o_"},
        {"snapshot": "customers", "on": {"o_customer_id": "customer_id"}, "prefix": "c_"}])
    assert any(p.startswith("stream.lookups[0].on.c_customer_id") and "cycle" in p for p in found), found
    assert any(p.startswith("stream.lookups[1].on.o_customer_id") and "cycle" in p for p in found), found


def test_expression_errors_name_the_key(tmp_path):
    found = problems(tmp_path, where="amount", derive={"amount": "price * qty", "bad": "upper(nosuch)",
                                                       "worse": "sku * 2", "broken": "price *"})
    joined = "\n".join(found)
    assert "stream.where: 'amount' is numeric, not a boolean expression" in joined
    assert "stream.derive.bad: no column 'nosuch'" in joined
    assert "stream.derive.worse" in joined and "not arithmetic on numbers" in joined
    assert "stream.derive.broken: 'price *' is not a Spark SQL expression" in joined


def test_a_derive_reads_earlier_entries_only(tmp_path):
    found = problems(tmp_path, where=None, derive={"a": "b + 1", "b": "qty * 2"})
    assert any(p.startswith("stream.derive.a: reads ['b'] written after it") for p in found), found


def test_update_where_and_delete_when_are_boolean_expressions_over_the_enriched_event(tmp_path):
    updates = [{"topic": "u", "kind": "projection", "key": ["line_id"], "delete_when": "qty + 1",
                "where": "nosuch = 1"}]
    found = problems(tmp_path, updates=updates)
    assert any(p.startswith("stream.updates[0].delete_when: 'qty + 1' is numeric") for p in found), found
    assert any(p.startswith("stream.updates[0].where: 'nosuch = 1': no column 'nosuch'") for p in found), found


def test_a_derive_column_sqlglot_cannot_type_is_left_to_spark(tmp_path):
    """``timestamp_seconds`` / ``xxhash64`` have no type in sqlglot: validate must not take them for strings.

    The job types derive columns with Spark and accepts them as event time, version and numbers; validate
    refused the same config ("not an Avro timestamp", "not numeric", "is not arithmetic on numbers").
    """
    derive = {"at": "timestamp_seconds(qty)", "rev": "xxhash64(sku)", "bucket": "rev % 10", "amount": "price * qty"}
    updates = [
        {"topic": "u1", "kind": "projection", "key": ["line_id"], "version": "rev"},
        {"topic": "u2", "kind": "aggregation", "group_by": ["bucket"], "event_time": "at", "window": "1 hour",
         "aggregations": {"n": "count", "top": "max(rev)"}},
    ]
    plan = plan_of(tmp_path, where=None, derive=derive, lookups=[], snapshots=[], updates=updates)
    assert plan is not None
    types = {f["name"]: f["type"] for f in plan.enriched.avro["fields"]}
    assert types["amount"] == ["null", {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}]
    # still a string where sqlglot knows it is one
    found = problems(tmp_path, where=None, derive={"at": "cast(qty AS STRING)"}, lookups=[], snapshots=[],
                     updates=[updates[1] | {"group_by": ["sku"], "aggregations": {"n": "count"}}])
    assert any("stream.updates[0].event_time" in p for p in found), found


def test_delete_when_is_for_projections_only():
    with pytest.raises(ValueError, match="delete_when not allowed for kind aggregation"):
        StreamJobConfig.model_validate({
            "events": {"topic": "e", "value_schema": "x.avsc"}, "enriched_topic": "en", "dead_letter_topic": "d",
            "checkpoint_location": "/tmp/cp",
            "updates": [{"topic": "u", "kind": "aggregation", "group_by": ["a"], "event_time": "t",
                         "aggregations": {"n": "count"}, "delete_when": "true"}]})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sum(qty)", "aggregate functions belong"),
        ("row_number() over (order by qty)", "window functions"),
        ("(select 1)", "a query is not an expression"),
        ("qty AS q", "no alias here"),
        ("frobnicate(qty)", "not a Spark SQL function"),
        ("", "an empty expression"),
    ],
)
def test_what_is_not_a_per_event_expression(text, message):
    with pytest.raises(ExpressionError, match=message):
        check(parse(text), {"qty": "int"})


def test_validate_reports_every_broken_expression_with_file_and_line(tmp_path):
    """``threes validate`` on a pipeline with broken expressions: each problem names file:line and the key."""
    from typer.testing import CliRunner

    from threes.cli import app

    data = stream(tmp_path, where="qty", derive={"amount": "price * qty", "bad": "upper(nosuch)"})
    pipeline = {"kafka": {"bootstrap_servers": "127.0.0.1:1"}, "stream": data}
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline, sort_keys=False))
    result = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "300"})
    assert result.exit_code != 0
    lines = yaml.safe_load(path.read_text()) and path.read_text().splitlines()
    where_line = next(i for i, line in enumerate(lines, 1) if line.strip().startswith("where: qty"))
    assert f"pipeline.yaml:{where_line}: stream.where: 'qty' is numeric, not a boolean expression" in result.output
    assert "stream.derive.bad: no column 'nosuch'" in result.output
