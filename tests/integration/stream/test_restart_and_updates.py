"""Restarts (no event lost, snapshot restored from its checkpoint) and update records (projection,
aggregation) that are identical when a micro-batch is replayed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kernel.updates import version_of
from stream_app.spark_checkpoint import CHECKPOINT_MANAGER_KEY, FILE_SYSTEM_CHECKPOINT_MANAGER

from .conftest import flight, offsets_header, same_on_every_master
from .test_enrich_job import Flow, by_flight

pytestmark = pytest.mark.spark


def test_restart_loses_no_event_and_reads_only_the_snapshot_tail(spark, env):
    airports = ("EWR", "JFK", "LGA", "LAX", "ORD")
    for faa in airports:
        env.put_airport(faa)
    spark.conf.unset(CHECKPOINT_MANAGER_KEY)
    first = env.start(spark)
    assert first.readiness["airports"]["source"] == "topics" and first.readiness["airports"]["keys"] == 5
    # a local checkpoint: Spark's offset and commit logs go through the FileSystem manager (no forked processes)
    assert spark.conf.get(CHECKPOINT_MANAGER_KEY) == FILE_SYSTEM_CHECKPOINT_MANAGER
    with Flow(env, period_s=0.05) as flow:
        env.consume(env.enriched, lambda rs: len(rs) >= 10, timeout_s=120)
        first.stop()  # while events keep coming
        # while the job is down: more events (the flow goes on) and two snapshot changes
        env.put_airport("LAX", "Los Angeles WHILE DOWN")
        env.put_airport("ORD", delete=True)
        second = env.start(spark)
        time.sleep(2)
    restored = second.readiness["airports"]
    # the snapshot came from its checkpoint; only the two records written since were read
    assert restored["source"] == "checkpoint" and restored["records"] == 2 and restored["keys"] == 4
    got = by_flight(env.consume(env.enriched, lambda rs: set(flow.sent) <= set(by_flight(rs)), timeout_s=180))
    assert set(got) == set(flow.sent)  # nothing lost across the restart (duplicates allowed: at least once)
    last = got[max(flow.sent)]["value"]
    assert last["dest_name"] == "Los Angeles WHILE DOWN"


def remove_last_commit(checkpoint: Path) -> int:
    """Simulate a crash after a micro-batch wrote its output but before Spark committed it."""
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    os.remove(checkpoint / "commits" / str(commits[-1]))
    crc = checkpoint / "commits" / f".{commits[-1]}.crc"  # Hadoop's checksum file, or the rewrite is refused
    if crc.exists():
        os.remove(crc)
    return commits[-1]


def test_update_records_are_identical_when_a_batch_is_replayed(spark, env, outputs_by_master):
    for faa in ("EWR", "JFK", "LAX"):
        env.put_airport(faa)
    updates = [
        {"topic": env.updates, "kind": "projection", "key": ["flight_id"],
         "fields": ["flight_id", "origin", "dest", "dest_name", "dep_delay"], "version": "offset"},
        {"topic": env.delays, "kind": "aggregation", "group_by": ["origin"], "event_time": "time_hour",
         "window": "1 day", "watermark": "1 day",
         "aggregations": {"flights": "count", "mean_delay": "mean(dep_delay)", "max_delay": "max(dep_delay)"}},
    ]
    config = env.config(updates=updates)
    delays = [1.0, 2.0, 3.0, 6.0]
    env.put_flights([flight(i + 1, "EWR", "LAX", delay=d) for i, d in enumerate(delays)] + [flight(5, "JFK", "LAX", delay=None)])
    job = env.start(spark, config, available_now=True)
    assert job.await_termination(180)
    job.stop()

    projections = env.consume(env.updates, lambda rs: len(rs) >= 5)
    by_key = {r["value"]["flight_id"]: r for r in projections}
    assert by_key[2]["value"] == {"flight_id": 2, "origin": "EWR", "dest": "LAX", "dest_name": "Los Angeles Intl", "dep_delay": 2.0}
    events = {r["value"]["flight_id"]: r for r in env.consume(env.events, lambda rs: len(rs) >= 5)}
    for i, rec in by_key.items():  # version = the event's offset
        assert version_of(list(rec["headers"].items())) == events[i]["offset"]

    aggregates = env.consume(env.delays, lambda rs: {r["value"]["origin"] for r in rs} == {"EWR", "JFK"})
    latest = {}
    for rec in aggregates:
        latest[rec["value"]["origin"]] = rec
    ewr = latest["EWR"]["value"]
    assert ewr["flights"] == 4 and ewr["mean_delay"] == 3.0 and ewr["max_delay"] == 6.0
    assert latest["JFK"]["value"]["flights"] == 1 and latest["JFK"]["value"]["mean_delay"] is None
    assert version_of(list(latest["EWR"]["headers"].items())) == 4  # version = the group's event count
    assert ewr["window_start"].isoformat() == "2013-01-01T00:00:00+00:00"

    # crash simulation: both queries lose their last commit; meanwhile the snapshot changes
    checkpoint = Path(config.checkpoint_location)
    remove_last_commit(checkpoint / "events")
    remove_last_commit(checkpoint / "aggregations" / env.delays)
    env.put_airport("LAX", "Los Angeles CHANGED")
    replay = env.start(spark, config, available_now=True)
    assert replay.await_termination(180)
    assert replay.readiness["airports"]["source"] == "checkpoint" and replay.readiness["airports"]["records"] == 1
    assert replay.last_batch["replay"] is True

    again = env.consume(env.updates, lambda rs: len(rs) >= 10)
    first_seen: dict[bytes, tuple] = {}
    for rec in again:
        seen = (rec["raw"], rec["headers"]["version"])
        assert first_seen.setdefault(rec["key"], seen) == seen  # byte-identical value and version
    assert len(first_seen) == 5
    enriched = env.consume(env.enriched, lambda rs: len(rs) >= 10)
    assert {r["value"]["dest_name"] for r in enriched} == {"Los Angeles Intl"}  # the recorded snapshot offsets
    assert len({str(offsets_header(r)) for r in enriched}) == 1
    # the aggregation, replayed and fed the duplicated enriched events, emits no other count or version
    final = env.consume(env.delays, lambda rs: len(rs) >= len(aggregates), timeout_s=30)
    for rec in final:
        origin = rec["value"]["origin"]
        assert rec["raw"] == latest[origin]["raw"] or version_of(list(rec["headers"].items())) < version_of(
            list(latest[origin]["headers"].items())
        )
    # the same records whatever the master (local[2] or the standalone cluster: test_cluster.py); the Avro
    # bodies without the 10-byte single-object header (the writer schema's name holds the test's topic)
    output = {
        "updates": sorted({(r["value"]["flight_id"], r["raw"][10:], r["headers"]["version"]) for r in again}),
        "aggregates": {o: (r["value"], r["headers"]["version"]) for o, r in latest.items()},
        "enriched": sorted({repr(sorted(r["value"].items())) for r in enriched}),
    }
    same_on_every_master(outputs_by_master, "replay", spark, output)
