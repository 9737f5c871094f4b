"""Shared Avro bodies and narrowed reader schemas: what the stream job decodes and encodes only once."""

from __future__ import annotations

import io
import json

import fastavro

from stream_app.avro_schemas import same_encoding, subset_schema
from stream_app.plan import build_plan
from stream_app.plan.writer_match import full_name
from stream_app.updates import aggregation_input_fields
from tests.unit.stream_app.test_plan import config

ENRICHED = {
    "type": "record",
    "name": "Enriched",
    "namespace": "threes.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "origin", "type": "string"},
        {"name": "delay", "type": ["null", "double"], "default": None},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
    ],
}


def body(schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def test_a_record_with_the_same_field_types_under_other_names_has_the_same_body():
    renamed = subset_schema(ENRICHED, ["id", "origin", "delay", "kind"], "threes.updates.FlightsValue")
    assert same_encoding(renamed, ENRICHED)
    record = {"id": 7, "origin": "EWR", "delay": 2.5, "kind": "B"}
    assert body(renamed, record) == body(ENRICHED, record)


def test_other_field_types_or_order_or_count_do_not_share_a_body():
    reordered = subset_schema(ENRICHED, ["origin", "id", "delay", "kind"], "threes.X")
    fewer = subset_schema(ENRICHED, ["id", "origin", "delay"], "threes.Y")
    wider = json.loads(json.dumps(ENRICHED))
    wider["fields"][0]["type"] = "double"
    assert not same_encoding(reordered, ENRICHED)
    assert not same_encoding(fewer, ENRICHED)
    assert not same_encoding(wider, ENRICHED)
    # same types in the same order, but the columns swapped: the shared body would put values in the wrong fields
    two = {
        "type": "record",
        "name": "Two",
        "fields": [{"name": "a", "type": "string"}, {"name": "b", "type": "string"}],
    }
    swapped = {**two, "name": "Swapped", "fields": [two["fields"][1], two["fields"][0]]}
    assert not same_encoding(swapped, two)


def test_an_aggregation_reads_only_its_group_event_time_and_aggregated_fields(tmp_path):
    plan = build_plan(config(tmp_path), None, tmp_path)
    delays = next(u for u in plan.updates if u.config.kind == "aggregation")
    fields = aggregation_input_fields(delays)
    assert fields == ["origin", "origin_tz", "time_hour", "dep_delay"]
    # the narrowed reader keeps the enriched record's name: Avro resolution reads a full enriched body with it
    reader = subset_schema(plan.enriched.avro, fields, full_name(plan.enriched.avro))
    record = {fld["name"]: None for fld in plan.enriched.avro["fields"]}
    record.update(flight_id=1, origin="EWR", carrier="UA", time_hour=1_357_000_000_000_000, dep_delay=4.0, origin_tz=-5)
    decoded = fastavro.schemaless_reader(
        io.BytesIO(body(plan.enriched.avro, record)),
        fastavro.parse_schema(plan.enriched.avro),
        fastavro.parse_schema(reader),
    )
    assert decoded == {"origin": "EWR", "origin_tz": -5, "time_hour": decoded["time_hour"], "dep_delay": 4.0}
