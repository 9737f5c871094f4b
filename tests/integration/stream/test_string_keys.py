"""A snapshot of a topic keyed by plain UTF-8 strings (as Kafka Streams writes it) on real Kafka and Spark."""

from __future__ import annotations

import pytest

from .conftest import airport, flight

pytestmark = pytest.mark.spark


def put_airport(env, faa: str, name: str | None = None, delete: bool = False) -> None:
    """An airport keyed by its code as plain UTF-8 bytes (Serdes.String()), the value single-object Avro."""
    value = None if delete else env.airport_ser(airport(faa, name))
    env.producer.produce(env.airports, key=faa.encode(), value=value)
    assert env.producer.flush(10) == 0


def by_flight(records):
    return {r["value"]["flight_id"]: r["value"] for r in records}


@pytest.mark.parametrize("engine", [{}, {"index_min_rows": 0}])
def test_string_keyed_snapshot_loads_refreshes_and_joins(spark, env, engine):
    for faa in ("EWR", "LAX", "JFK"):
        put_airport(env, faa)
    snapshots = [
        {
            "name": "airports",
            "topics": [env.airports],
            "key_format": "string",
            "key_field": "code",
            "value_schema": "nycflights13/airport",
            **engine,
        }
    ]
    lookups = [
        {"snapshot": "airports", "on": {"origin": "code"}, "prefix": "origin_", "fields": ["name"]},
        {"snapshot": "airports", "on": {"dest": "code"}, "prefix": "dest_", "fields": ["name", "alt"]},
    ]
    job = env.start(spark, env.config(snapshots=snapshots, lookups=lookups))
    assert job.snapshots["airports"].base_rows == 3  # loaded before the first micro-batch
    env.put_flights([flight(1, "EWR", "LAX"), flight(2, "JFK", "SFO")])
    env.consume(env.enriched, lambda rs: {1, 2} <= set(by_flight(rs)), timeout_s=120)
    # refresh: an update and a tombstone, read between micro-batches
    put_airport(env, "LAX", "Los Angeles RENAMED")
    put_airport(env, "JFK", delete=True)
    env.put_flights([flight(3, "EWR", "LAX"), flight(4, "JFK", "EWR")])
    got = by_flight(env.consume(env.enriched, lambda rs: {3, 4} <= set(by_flight(rs)), timeout_s=120))
    assert got[1]["origin_name"] == "Newark Liberty Intl" and got[1]["dest_name"] == "Los Angeles Intl"
    assert got[1]["dest_alt"] == 125
    assert got[2]["origin_name"] == "John F Kennedy Intl" and got[2]["dest_name"] is None  # SFO unknown
    assert got[3]["dest_name"] == "Los Angeles RENAMED"
    assert got[4]["origin_name"] is None and got[4]["dest_name"] == "Newark Liberty Intl"  # JFK deleted
    assert job.snapshots["airports"].decoded_by == "driver"  # the small delta: string keys taken as they are
