"""Derived Avro schemas: enriched events (same snapshot twice, named types) and update subsets."""

from __future__ import annotations

import io

import fastavro
import pytest

from stream_app.avro_schemas import JoinedFields, enriched_schema, nullable, subset_schema

LOCATION = {"type": "record", "name": "Location", "fields": [{"name": "lat", "type": "double"}, {"name": "lon", "type": "double"}]}
AIRPORT = {
    "type": "record",
    "name": "Airport",
    "namespace": "threes.test",
    "fields": [
        {"name": "name", "type": "string"},
        {"name": "at", "type": LOCATION},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["SMALL", "LARGE"]}},
        {"name": "previous", "type": ["null", "Location"], "default": None},
    ],
}
FLIGHT = {
    "type": "record",
    "name": "Flight",
    "namespace": "threes.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "origin", "type": "string"},
        {"name": "seen_at", "type": LOCATION},  # the event defines its own threes.test.Location
    ],
}


def roundtrip(schema, record):
    parsed = fastavro.parse_schema(schema)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, parsed, record)
    buf.seek(0)
    return fastavro.schemaless_reader(buf, parsed)


def test_enriched_schema_joins_the_same_snapshot_twice():
    schema = enriched_schema(
        FLIGHT,
        [JoinedFields("origin_", AIRPORT, None, True), JoinedFields("dest_", AIRPORT, ["name", "at"], False)],
    )
    assert schema["name"] == "threes.test.FlightEnriched"
    names = [f["name"] for f in schema["fields"]]
    assert names == ["id", "origin", "seen_at", "origin_name", "origin_at", "origin_kind", "origin_previous", "dest_name", "dest_at"]
    record = {
        "id": 1,
        "origin": "EWR",
        "seen_at": {"lat": 1.0, "lon": 2.0},
        "origin_name": None,  # left join: optional
        "origin_at": None,
        "origin_kind": "LARGE",
        "origin_previous": {"lat": 3.0, "lon": 4.0},
        "dest_name": "Los Angeles",
        "dest_at": {"lat": 5.0, "lon": 6.0},
    }
    assert roundtrip(schema, record) == record
    fields = {f["name"]: f for f in schema["fields"]}
    assert fields["origin_name"]["type"] == ["null", "string"] and fields["origin_name"]["default"] is None
    assert fields["dest_name"]["type"] == "string"  # inner join: as in the snapshot


def test_unknown_or_colliding_fields_are_errors():
    with pytest.raises(ValueError, match="nope"):
        enriched_schema(FLIGHT, [JoinedFields("o_", AIRPORT, ["nope"], True)])
    with pytest.raises(ValueError, match="collides"):
        enriched_schema(FLIGHT, [JoinedFields("", {**AIRPORT, "fields": [{"name": "origin", "type": "string"}]}, None, True)])


def test_subset_copies_named_types_along():
    enriched = enriched_schema(FLIGHT, [JoinedFields("dest_", AIRPORT, None, True)])
    sub = subset_schema(enriched, ["id", "dest_previous"], "threes.updates.Key", [{"name": "n", "type": "long"}])
    record = {"id": 3, "dest_previous": {"lat": 1.0, "lon": 2.0}, "n": 7}
    assert roundtrip(sub, record) == record


def test_nullable_puts_null_first():
    assert nullable({"name": "x", "type": ["string", "null"]})["type"] == ["null", "string"]
