"""The shop example (examples/shop): it validates, its stream runs in the order the docs say, its generator is fixed."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from stream_app.plan import build_plan
from stream_app.stages import DeriveStep, LookupStep, WhereStep
from threes.cli import app
from threes.config import load_pipeline
from threes.examples.shop import generate as shop_generator

ROOT = Path(__file__).resolve().parents[3]
SHOP = ROOT / "examples" / "shop"
EXAMPLE = SHOP / "pipeline.yaml"


def test_threes_validate_passes_on_the_shop() -> None:
    result = CliRunner().invoke(app, ["validate", str(EXAMPLE)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "3 source(s), a stream job, 3 sync service(s) with 5 sink(s)" in result.output


def _with_reader_schemas(tmp_path: Path):
    """The example's stream, its snapshots given the schemas their sources write (validate has no schema topic)."""
    pipeline = load_pipeline(EXAMPLE, environ={})
    written = {
        "orders": ([{"name": "order_id", "type": "long"}],
                   {"type": "record", "name": "orders", "namespace": "threes.rds", "fields": [
                       {"name": "order_id", "type": "long"}, {"name": "customer_id", "type": "string"},
                       {"name": "channel", "type": "string"}]}),
        "customers": ([{"name": "_id", "type": "string"}], json.loads((SHOP / "customer.avsc").read_text())),
        "nations": ([{"name": "code", "type": "string"}], json.loads((SHOP / "nation.avsc").read_text())),
    }
    snapshots = []
    for snap in pipeline.stream.snapshots:
        key_fields, value = written[snap.name]
        (tmp_path / f"{snap.name}_key.avsc").write_text(json.dumps(
            {"type": "record", "name": f"{snap.name}Key", "fields": key_fields}))
        (tmp_path / f"{snap.name}.avsc").write_text(json.dumps(value))
        snapshots.append(snap.model_copy(update={"key_schema": str(tmp_path / f"{snap.name}_key.avsc"),
                                                 "value_schema": str(tmp_path / f"{snap.name}.avsc")}))
    return pipeline.stream.model_copy(update={"snapshots": snapshots})


def test_where_first_then_derives_before_the_chain_and_nation_code_between_its_hops(tmp_path: Path) -> None:
    plan = build_plan(_with_reader_schemas(tmp_path), None, SHOP)
    assert plan.steps == [
        WhereStep("status <> 'test'"),
        DeriveStep((("line_date", "to_date(line_time)"), ("amount", "unit_price * quantity * (1 - discount)"))),
        LookupStep((0,)),  # line -> order
        LookupStep((1,)),  # order -> customer, on the order's customer_id
        DeriveStep((("nation_code", "upper(customer_nation)"),)),  # reads a looked-up column
        LookupStep((2,)),  # customer -> nation, on the derived code
    ]
    fields = {f["name"]: f["type"] for f in plan.enriched.avro["fields"]}
    assert fields["line_date"] == ["null", {"type": "int", "logicalType": "date"}]
    assert fields["amount"][1]["logicalType"] == "decimal"
    assert fields["nation_region"] == ["null", "string"]
    keys = {u.config.topic: [f["name"] for f in u.key.avro["fields"]] for u in plan.updates}
    pipeline = load_pipeline(EXAMPLE, environ={})
    sink_keys = {s.topics[0]: s.key for svc in pipeline.sync for s in svc.sinks if s.type == "rds_sink"}
    assert {t: sink_keys[t] for t in keys} == keys  # every table's key is its update key


def test_the_generator_is_deterministic_and_holds_every_case_the_example_shows() -> None:
    shop = shop_generator.generate()
    assert shop == shop_generator.generate()
    assert shop != shop_generator.generate(seed=1)
    events = shop.all_events
    times = [e["line_time"] for e in events]
    assert times == sorted(times) and len(set(times)) == len(times)  # produce order is event-time order
    assert 200 <= len(events) <= 400
    placed = {e["line_id"]: e for e in events if e["status"] == "open"}
    cancelled = [e for e in events if e["status"] == "cancelled"]
    assert cancelled and all(c["line_id"] in placed and c["line_time"] > placed[c["line_id"]]["line_time"]
                             for c in cancelled)
    assert sum(e["status"] == "test" for e in events) == 12
    orders = {o["order_id"]: o for o in shop.orders}
    customers = {c["customer_id"]: c for c in shop.customers}
    codes = {n["code"] for n in shop.nations}
    assert any(e["order_id"] not in orders for e in events)  # the chain stops at the order
    assert any(o["customer_id"] not in customers for o in shop.orders)  # ...at the customer
    assert any(c["nation"].upper() not in codes for c in shop.customers)  # ...at the nation
    assert all(c["nation"] == c["nation"].lower() for c in shop.customers)  # upper() is needed
    assert shop.closing["line_time"] - times[-2] == shop_generator.CLOSING_AFTER
    assert orders[shop.closing["order_id"]]["customer_id"] in customers
