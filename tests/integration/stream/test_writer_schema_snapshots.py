"""A snapshot without reader schemas reads with the writer schemas its topics carry (real Kafka, Spark local[2])."""

from __future__ import annotations

import json

import pytest

from kernel.exceptions import ConfigError
from schemas.serde import AvroSerializer

from .conftest import AIRPORT, AIRPORT_KEY, flight

pytestmark = pytest.mark.spark

# what an RDS source writes: its own record names (threes.rds.<table>, threes.rds.<table>_key)
WRITER_VALUE = {**AIRPORT, "name": "airports", "namespace": "threes.rds"}
WRITER_KEY = {**AIRPORT_KEY, "name": "airports_key", "namespace": "threes.rds"}


def _publish(env):
    env.store.add_version(f"{env.airports}-key", WRITER_KEY)
    env.store.add_version(f"{env.airports}-value", WRITER_VALUE)
    env.key_ser = AvroSerializer(WRITER_KEY, env.store)
    env.airport_ser = AvroSerializer(WRITER_VALUE, env.store)
    for faa in ("EWR", "LAX"):
        env.put_airport(faa)
    env.put_flights([flight(1, "EWR", "LAX"), flight(2, "XXX", "EWR")])


def _enriched(env, topic):
    got = env.consume(topic, lambda rs: len(rs) >= 2)
    return {r["value"]["flight_id"]: {k: v for k, v in r["value"].items() if k.startswith(("origin_", "dest_"))}
            for r in got}


def test_no_reader_schema_enriches_as_a_hand_written_reader_schema(spark, env):
    _publish(env)
    lookups = [{"snapshot": "airports", "on": {"origin": "faa"}, "prefix": "origin_", "fields": ["name", "tz"]},
               {"snapshot": "airports", "on": {"dest": "faa"}, "prefix": "dest_", "fields": ["name"]}]
    derived = env.config(snapshots=[{"name": "airports", "topics": [env.airports]}], lookups=lookups)
    job = env.start(spark, derived, available_now=True)
    assert job.await_termination(120)
    without = _enriched(env, env.enriched)
    # a hand-written reader schema (other record names: the writers' names become its aliases)
    written = env.config(lookups=lookups, enriched_topic=f"{env.enriched}.2",
                         checkpoint_location=str(env.tmp / "checkpoint2"))
    job = env.start(spark, written, available_now=True)
    assert job.await_termination(120)
    assert _enriched(env, f"{env.enriched}.2") == without
    assert without[1]["origin_name"] == "Newark Liberty Intl" and without[1]["dest_name"] == "Los Angeles Intl"
    assert without[2]["origin_name"] is None and without[2]["dest_name"] == "Newark Liberty Intl"


def test_a_reader_schema_the_writers_do_not_fit_is_a_start_up_error(spark, env, tmp_path):
    _publish(env)
    reader = {**AIRPORT, "fields": [*AIRPORT["fields"], {"name": "runways", "type": "int"}]}
    (tmp_path / "airport.avsc").write_text(json.dumps(reader))
    config = env.config(snapshots=[{"name": "airports", "topics": [env.airports],
                                    "key_schema": "nycflights13/airport_key",
                                    "value_schema": str(tmp_path / "airport.avsc")}])
    with pytest.raises(ConfigError) as info:
        env.start(spark, config)
    text = str(info.value)
    assert f"topic '{env.airports}': writer record threes.rds.airports" in text and "['runways']" in text
