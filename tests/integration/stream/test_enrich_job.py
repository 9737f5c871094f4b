"""The stream job against real Kafka and Spark: enrichment, freshness, deletes, dead letters."""

from __future__ import annotations

import time

import pytest

from connectors.dlq import DeadLetter

from .conftest import airport, flight, offsets_header

pytestmark = pytest.mark.spark


def test_enriches_events_with_two_lookups_of_one_snapshot(spark, env):
    for faa in ("EWR", "JFK", "LAX"):
        env.put_airport(faa)
    env.put_flights([flight(1, "EWR", "LAX"), flight(2, "JFK", "SFO")])
    job = env.start(spark, available_now=True)
    assert job.await_termination(120)
    got = {r["value"]["flight_id"]: r for r in env.consume(env.enriched, lambda rs: len(rs) >= 2)}
    one, two = got[1]["value"], got[2]["value"]
    assert one["origin_name"] == "Newark Liberty Intl" and one["dest_name"] == "Los Angeles Intl"
    assert one["dest_alt"] == 125 and one["origin_tz"] == -5 and "origin_alt" not in one  # fields: [name, tz]
    assert two["origin_name"] == "John F Kennedy Intl" and two["dest_name"] is None  # left join, SFO unknown
    assert got[1]["key"] == b"1"  # the event's key is kept
    # the snapshot offsets the batch joined against travel in a header
    assert sum(offsets_header(got[1])[env.airports].values()) == 3
    assert job.snapshots["airports"].base_rows == 3
