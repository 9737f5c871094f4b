"""The stream job in real-time mode (stream.mode: realtime) on real Kafka and Spark.

The same events, snapshot and config, once in micro-batch mode and once in real-time mode: the
enriched events and the projection updates are the same. Then the real-time job sees a reference
change by later events, and a stop and a restart from the checkpoint lose nothing. A producer
that registers a new writer schema after the query started is read, not dead-lettered.
"""

from __future__ import annotations

import re
import time

import pytest

from kernel.dlq import DeadLetter
from schemas.serde import MARKER, AvroSerializer
from stream_app.realtime import lookup_jar

from .conftest import FLIGHT, flight
from .language_helpers import totals

pytestmark = pytest.mark.spark

PROJECTION = {"topic": None, "kind": "projection", "key": ["flight_id"], "version": "offset"}


def _config(env, **overrides):
    data = {"where": "origin <> 'ORD'", "derive": {"late": "dep_delay > 5"},
            "updates": [{**PROJECTION, "topic": env.updates}]}
    return env.config(**{**data, **overrides})


def _by_id(records):
    return {r["value"]["flight_id"]: r["value"] for r in records if r["value"] is not None}


def test_realtime_gives_the_enriched_events_and_updates_of_microbatch(spark, env):
    lookup_jar()  # built by make jvm; the session's spark.jars carry it (tests/conftest.py)
    for faa in ("EWR", "LAX", "JFK"):
        env.put_airport(faa)
    flights = [flight(1, "EWR", "LAX", delay=9.0), flight(2, "JFK", "SFO"), flight(3, "ORD", "EWR"),
               flight(4, "LGA", "JFK", delay=None)]
    env.put_flights(flights)
    kept = {1, 2, 4}  # ORD is dropped by where

    micro = env.start(spark, _config(env))
    enriched_mb = _by_id(env.consume(env.enriched, lambda rs: kept <= set(_by_id(rs)), timeout_s=180))
    updates_mb = _by_id(env.consume(env.updates, lambda rs: kept <= set(_by_id(rs)), timeout_s=60))
    micro.stop(checkpoint=False)

    # the same input into other output topics, in real-time mode
    enriched_rt_topic, updates_rt_topic = f"{env.enriched}.rt", f"{env.updates}.rt"
    config = _config(env, mode="realtime", checkpoint_interval="5 seconds", enriched_topic=enriched_rt_topic,
                     dead_letter_topic=f"{env.dlq}.rt", checkpoint_location=str(env.tmp / "rt"),
                     updates=[{**PROJECTION, "topic": updates_rt_topic}])
    job = env.start(spark, config)
    assert job.snapshots == {}  # no snapshot on the driver: the stores are in the executors' JVMs
    enriched_rt = _by_id(env.consume(enriched_rt_topic, lambda rs: kept <= set(_by_id(rs)), timeout_s=180))
    updates_rt = _by_id(env.consume(updates_rt_topic, lambda rs: kept <= set(_by_id(rs)), timeout_s=60))
    assert set(enriched_rt) == set(enriched_mb) == kept
    assert enriched_rt == enriched_mb and updates_rt == updates_mb
    assert enriched_rt[1]["origin_name"] == "Newark Liberty Intl" and enriched_rt[1]["late"] is True
    assert enriched_rt[2]["dest_name"] is None  # SFO: not in the snapshot, a left lookup
    # counted per epoch, from the observed metrics in each epoch's progress (the where dropped ORD)
    assert totals(job, 4) == {"events": 4, "filtered": 1, "enriched": 3, "dead_letters": 0, "updates": 3}

    # eventually fresh: later events see a renamed airport
    env.put_airport("EWR", "Newark RENAMED")
    i, deadline = 100, time.monotonic() + 120
    while True:
        assert time.monotonic() < deadline, "the reference change was never seen"
        env.put_flights([flight(i, "EWR")])
        got = _by_id(env.consume(enriched_rt_topic, lambda rs, i=i: i in _by_id(rs), timeout_s=120))
        if got[i]["origin_name"] == "Newark RENAMED":
            break
        i += 1

    # threes status: the store's keys, read from the driver's JVM (local[2]: the executors are in it)
    from stream_app.metrics import status_document

    (row,) = [r for r in status_document()["snapshots"] if r["job"] == config.name]
    assert row["snapshot"] == "airports" and row["keys"] == 3

    # a stop and a restart from the checkpoint: the events written while stopped are all enriched
    job.stop()
    env.put_flights([flight(500 + n, "LAX", "JFK") for n in range(10)])
    env.start(spark, config)
    want = set(range(500, 510))
    got = _by_id(env.consume(enriched_rt_topic, lambda rs: want <= set(_by_id(rs)), timeout_s=180))
    assert {got[n]["origin_name"] for n in want} == {"Los Angeles Intl"}
    # no full reload: the store came back from the RocksDB folder the stop checkpointed, with no tail to read
    from stream_app.realtime import store_status

    (restarted,) = [s for s in store_status(spark).values() if s["restored_keys"] >= 0]
    # restored_keys is RocksDB's estimate (overwritten entries not compacted yet count); keys is the in-heap
    # table's exact count, built again from the folder once the store was ready
    assert restarted["restored_keys"] > 0 and restarted["applied"] == 0 and restarted["keys"] == 3
    assert restarted["engine"] == "heap" and restarted["disk_bytes"] > 0
    assert len([p for p in (env.tmp / "rt" / "realtime-stores").iterdir() if p.name.startswith("airports-")]) == 1


def test_realtime_reads_a_writer_schema_registered_after_the_start(spark, env):
    """A real-time query has no micro-batch boundary at which to learn new writer schemas: its events are
    decoded in the JVM, which reads the schema topic again on a fingerprint it has not seen."""
    lookup_jar()
    env.put_airport("EWR")
    env.put_flights([flight(1)])
    config = _config(env, mode="realtime", checkpoint_interval="5 seconds", updates=[])
    job = env.start(spark, config)
    env.consume(env.enriched, lambda rs: 1 in _by_id(rs), timeout_s=180)  # the query runs its first epoch

    # a new writer of the events (one more field, with a name no earlier run registered): registered now
    gate = "gate_" + re.sub(r"\W", "_", env.unique)
    v2 = {**FLIGHT, "fields": [*FLIGHT["fields"], {"name": gate, "type": "string", "default": ""}]}
    writer = AvroSerializer(v2, env.store)
    for i in (2, 3):
        env.producer.produce(env.events, key=str(i).encode(), value=writer({**flight(i), gate: "B7"}))
    assert env.producer.flush(10) == 0
    corrupt = env.put_raw_event(b"bad", MARKER + b"\x07" * 8 + b"\x02")  # a writer no one registered
    got = _by_id(env.consume(env.enriched, lambda rs: {2, 3} <= set(_by_id(rs)), timeout_s=120))
    assert got[2]["origin_name"] == "Newark Liberty Intl" and gate not in got[2]  # read with the reader schema

    (letter,) = env.consume(env.dlq, lambda rs: len(rs) >= 1, timeout_s=60, deserialize=False)
    dead = DeadLetter.from_headers(list(letter["headers"].items()))
    assert (int(letter["headers"]["dlq.partition"]), int(letter["headers"]["dlq.offset"])) == corrupt
    assert dead.stage == "decode" and dead.message == "value has an unknown writer schema fingerprint " + "07" * 8
    assert totals(job, 4) == {"events": 4, "filtered": 0, "enriched": 3, "dead_letters": 1, "updates": 0}
