"""A clean stop of ``threes stream run``: SIGTERM to its process group (how the demo, systemd and most
supervisors stop it), and the end of an ``--available-now`` run. Both must leave a last snapshot
checkpoint and log no error; the restart after the SIGTERM must come from that checkpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

from .conftest import end_offsets, flight

pytestmark = pytest.mark.spark

# the lines a clean run must not have: Spark's log4j ERROR lines, Python's ERROR lines, a traceback
PROBLEM = re.compile(r"^\S+ \S+ ERROR |Traceback|Exception in thread", re.MULTILINE)


def _config(env, tmp_path: Path, kafka) -> Path:
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        textwrap.dedent(f"""\
        version: 1
        kafka:
          bootstrap_servers: {kafka.bootstrap_servers}
        stream:
          name: stop-{env.unique}
          events: {{topic: {env.events}, value_schema: flight.avsc, starting_offsets: earliest}}
          snapshots:
            - name: airports
              topics: [{env.airports}]
              key_schema: nycflights13/airport_key
              value_schema: nycflights13/airport
          lookups:
            - {{snapshot: airports, on: {{dest: faa}}, prefix: dest_, fields: [name]}}
          enriched_topic: {env.enriched}
          dead_letter_topic: {env.dlq}
          updates:
            - {{topic: {env.delays}, kind: aggregation, group_by: [origin], event_time: time_hour,
               window: 1 day, watermark: 1 day, aggregations: {{flights: count}}}}
          trigger_interval_s: 1
          checkpoint_location: {tmp_path / "checkpoint"}
          spark: {{master: "local[1]", driver_memory: 1g}}
        """)
    )
    return config


def _start(config: Path, log: Path, *args: str) -> subprocess.Popen:
    threes = Path(sys.executable).parent / "threes"
    with log.open("w") as out:  # its own session: the signal below reaches it and its JVM, as a supervisor's would
        return subprocess.Popen(
            [str(threes), "-v", "stream", "run", str(config), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} before {text!r}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {text!r} after {timeout_s} s:\n{log.read_text()[-4000:]}"
        time.sleep(0.5)


def _last_checkpoint(tmp_path: Path) -> tuple[dict, pa.Table]:
    folder = max((tmp_path / "checkpoint" / "snapshots" / "airports").glob("v*/_manifest.json")).parent
    manifest = json.loads((folder / "_manifest.json").read_text())
    with pa.ipc.open_stream(pa.py_buffer((folder / "data.arrows").read_bytes())) as reader:
        return manifest, reader.read_all()


def test_sigterm_to_the_group_stops_cleanly_with_a_last_checkpoint_and_available_now_logs_no_error(
    env, kafka, tmp_path
):
    env.put_airport("EWR")
    env.put_airport("LAX")
    env.put_flights([flight(1, "EWR", "LAX")])
    config, log = _config(env, tmp_path, kafka), tmp_path / "run.log"
    proc = _start(config, log)
    try:
        _wait_for(log, "snapshot=airports ready keys=2", proc)
        env.consume(env.enriched, lambda rs: len(rs) >= 1, timeout_s=300)
        # a snapshot change read into the overlay and joined by a micro-batch: pending merge at the stop
        env.put_airport("LAX", "Los Angeles CHANGED")
        env.put_flights([flight(2, "EWR", "LAX")])
        got = env.consume(env.enriched, lambda rs: any(r["value"]["flight_id"] == 2 for r in rs), timeout_s=300)
        assert [r["value"]["dest_name"] for r in got if r["value"]["flight_id"] == 2] == ["Los Angeles CHANGED"]
        text = log.read_text()
        assert "snapshot=airports refresh records=1" in text and "merged overlay" not in text
        os.killpg(proc.pid, signal.SIGTERM)  # the whole group, the JVM included
        assert proc.wait(timeout=300) == 0, log.read_text()[-6000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert f"job=stop-{env.unique} stopped after" in text, text[-4000:]
    # Spark is stopped while Python holds its gateway, not by the JVM's shutdown hook after it (40 s more)
    assert "spark stopped elapsed_s=" in text, text[-4000:]
    # the last checkpoint folds the overlay in on the driver: no new base (a Spark job) while stopping
    assert "snapshot=airports overlay records=1 folded into the last checkpoint keys=2" in text
    assert "merged overlay" not in text
    assert not PROBLEM.search(text), PROBLEM.search(text).group(0) + "\n" + text[-6000:]
    manifest, table = _last_checkpoint(tmp_path)
    written = {int(p): o for p, o in manifest["offsets"][env.airports].items() if o}
    assert written == {p: o for p, o in end_offsets(env.conf, env.airports).items() if o}  # the change included
    names = dict(zip(table.column("__lk").to_pylist(), table.column("name").to_pylist(), strict=True))
    assert sorted(names.values()) == ["Los Angeles CHANGED", "Newark Liberty Intl"]

    # the restart reads the snapshot from that checkpoint (no record of the topic), and an --available-now
    # run ends without the late-events listener failing on a gateway that is gone
    env.put_flights([flight(3, "EWR", "LAX")])
    log = tmp_path / "available-now.log"
    proc = _start(config, log, "--available-now")
    try:
        assert proc.wait(timeout=600) == 0, log.read_text()[-6000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log.read_text()
    assert "snapshot=airports ready keys=2 mode=broadcast source=checkpoint records_read=0" in text, text[-4000:]
    assert not PROBLEM.search(text), PROBLEM.search(text).group(0) + "\n" + text[-6000:]
    got = env.consume(env.enriched, lambda rs: any(r["value"]["flight_id"] == 3 for r in rs))
    assert [r["value"]["dest_name"] for r in got if r["value"]["flight_id"] == 3] == ["Los Angeles CHANGED"]
