"""Issue #42 end to end: the nycflights13 example in real-time mode gives micro-batch mode's output.

The example pipeline, rewritten by :func:`threes.demo.isolate.realtime_variant`
(``stream.mode: realtime``, a 5 s checkpoint interval, the ``updates.flights``
projection only, the Elasticsearch index and the S3 archive as its only sinks:
real-time mode runs no ``route_stats`` aggregation), then isolated like the
micro-batch test's, runs through the very code of ``threes demo`` on the same
five days. The index and the archive are compared with the same pandas oracle
as in ``test_nycflights13.py`` (every flight field and every looked-up column),
so both modes give the same output.

No reference change mid-stream: real-time mode's snapshot is eventually fresh
(each executor's JVM store tails the compacted topics), and the exact old/new
boundary the micro-batch test checks is a micro-batch guarantee;
``tests/integration/stream/test_realtime_job.py`` shows that later events see a
change.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kernel.config.loader import _Yaml12BoolLoader
from stream_app.realtime import lookup_jar
from threes.demo.isolate import realtime_variant
from threes.demo.oracle import enriched_flights, match_counts, read_frame, select_days
from threes.demo.run import DemoOptions, DemoRun

from .conftest import EXAMPLE
from .test_nycflights13 import DAYS, FLIGHTS_ON_DAYS, RATE

# real-time mode runs one long-running task per events partition, all at once: the example's local[2]
# master has two task slots, so the events topic gets two partitions (the micro-batch test uses four;
# the output does not depend on them: versions are offsets, compared by key)
PARTITIONS = 2


@pytest.fixture(scope="module")
def example_yaml(workdir: Path) -> Path:
    """The example pipeline in real-time mode (``isolated`` in conftest.py then makes its names unique)."""
    document = yaml.load(EXAMPLE.read_text(), Loader=_Yaml12BoolLoader)  # a SafeLoader subclass
    path = workdir / "pipeline-realtime.yaml"
    path.write_text(yaml.safe_dump(realtime_variant(document, checkpoint_interval="5 seconds"), sort_keys=False))
    return path


@pytest.fixture(scope="module")
def summary(isolated: Any, workdir: Path) -> dict[str, Any]:
    """One run of the demo's code on the subset, in real-time mode, shared by the tests of this module."""
    lookup_jar()  # the Java lookup component (make jvm): a clear SetupError here rather than in the job's log
    config, pipeline, offsets_topic = isolated
    assert pipeline.stream.mode == "realtime"
    options = DemoOptions(
        config=config, days=DAYS, rate=RATE, changes=False, offsets_topic=offsets_topic, partitions=PARTITIONS,
        start_stack=False, log_dir=workdir / "logs", timeout_s=900, start_timeout_s=600, sample_every=50,
    )
    result = DemoRun(options).run()
    (workdir / "summary.json").write_text(json.dumps(result, default=str, indent=2))
    print("demo summary:", json.dumps({k: result.get(k) for k in ("phases_s", "first_flight_to_all_sinks_s",
                                                                    "latency_s")}, default=str))
    return result


def test_the_stream_job_ran_in_real_time_mode(summary: dict[str, Any], isolated: Any) -> None:
    _config, pipeline, _offsets = isolated
    log = (Path(summary["logs"]) / "stream.log").read_text(errors="replace")
    assert f"job={pipeline.stream.name} mode=realtime checkpoint_interval_s=5" in log
    assert f"job={pipeline.stream.name} batch=" not in log  # no micro-batch ran (each one logs this summary line)
    # a clean stop cancels the open epoch on purpose: said once by the job, not as Spark's abort errors
    assert f"job={pipeline.stream.name} stopping the real-time query" in log
    assert f"job={pipeline.stream.name} stopped (real-time mode" in log
    assert " ERROR " not in log and "Aborting task" not in log, [ln for ln in log.splitlines() if "ERROR" in ln][:5]


def test_index_and_archive_hold_exactly_the_oracle_s_output(summary: dict[str, Any]) -> None:
    oracle = summary["oracle"]
    assert summary["flights"] == summary["events_in"] == FLIGHTS_ON_DAYS
    assert summary["enriched_out"] >= FLIGHTS_ON_DAYS
    assert summary["dead_letters"] == 0
    assert oracle["flights_index"]["ok"], oracle["flights_index"]
    assert oracle["flights_index"]["actual_rows"] == FLIGHTS_ON_DAYS
    assert oracle["archive"]["ok"], oracle["archive"]
    assert oracle["archive"]["rows_in_wrong_dt_folder"] == 0
    assert oracle["archive"]["dt_folders"] == oracle["archive"]["expected_dt_folders"] == 10
    # route_stats did not run (no such sink in real-time mode): reported as skipped, not as a match
    assert oracle["checked"] == ["flights_index", "archive"]
    assert set(oracle["skipped"]) == {"route_stats"} and oracle["route_stats"]["ok"] is None
    assert oracle["reference_changes"] == []
    assert oracle["all_match"]


def test_lookups_matched_the_oracle_s_rows(summary: dict[str, Any]) -> None:
    expected = match_counts(enriched_flights(select_days(read_frame("flights"), DAYS)))
    rates = summary["oracle"]["match_rate"]
    assert {k: v["matched"] for k, v in rates.items()} == expected
    assert all(v > 0 for v in expected.values())  # every lookup, the weather's composite key too, found rows
    assert rates["plane"]["matched"] < FLIGHTS_ON_DAYS and rates["dest"]["matched"] < FLIGHTS_ON_DAYS


def test_summary_reports_the_two_sinks_only(summary: dict[str, Any]) -> None:
    sinks = summary["sinks"]
    assert set(sinks) == set(summary["first_flight_to_sink_complete_s"]) == {"elasticsearch", "s3"}
    assert sinks["elasticsearch"]["docs"] == FLIGHTS_ON_DAYS
    assert sinks["s3"]["rows"] >= FLIGHTS_ON_DAYS and sinks["s3"]["objects"] > 0
    assert set(summary["latency_s"]) == {"elasticsearch", "s3"}
    for sink in ("elasticsearch", "s3"):
        latency = summary["latency_s"][sink]
        assert latency["samples"] == latency["of"] > 0, (sink, latency)
