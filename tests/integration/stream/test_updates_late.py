"""Late events: an aggregation drops events older than its watermark, and counts every one it drops."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from prometheus_client import REGISTRY

pytestmark = pytest.mark.spark


def at(i: int, day: int, hour: int) -> dict[str, Any]:
    return {
        "flight_id": i,
        "origin": "EWR",
        "dest": "LAX",
        "dep_delay": 1.0,
        "time_hour": dt.datetime(2013, 1, day, hour, tzinfo=dt.UTC),
    }


def test_events_older_than_the_watermark_are_counted_not_silently_lost(spark, env):
    for faa in ("EWR", "LAX"):
        env.put_airport(faa)
    updates = [
        {
            "topic": env.delays,
            "kind": "aggregation",
            "group_by": ["origin"],
            "event_time": "time_hour",
            "window": "1 day",
            "watermark": "1 hour",
            "aggregations": {"flights": "count"},
        }
    ]
    config = env.config(updates=updates)
    env.put_flights([at(1, 3, 12), at(2, 3, 12)])
    job = env.start(spark, config, available_now=True)
    assert job.await_termination(180)
    job.stop()

    # the watermark (kept in the query's checkpoint) is now 2013-01-03 11:00: a flight of the 1st is late
    env.put_flights([at(3, 1, 6), at(4, 3, 13)])
    again = env.start(spark, config, available_now=True)
    assert again.await_termination(180)
    late = again._listener
    # progress reaches listeners through Spark's asynchronous bus: the stop waits for the queries' last events
    again.stop()
    assert late.dropped[env.delays] == 1
    labels = {"job": config.name, "topic": env.delays}
    assert REGISTRY.get_sample_value("threes_stream_late_events_total", labels) == 1

    counts = {}
    for rec in env.consume(env.delays, lambda rs: any(r["value"]["flights"] == 3 for r in rs)):
        counts[rec["value"]["window_start"].date().isoformat()] = rec["value"]["flights"]
    assert counts == {"2013-01-03": 3}  # the late flight is in no aggregate; the on-time ones all are
