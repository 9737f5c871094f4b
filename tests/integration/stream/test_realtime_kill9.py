"""kill -9 of ``threes stream run`` in real-time mode, then a restart: no event is lost (at least once).

The job runs as its own process (its own Spark, local[2]: real-time mode needs a task slot per
events partition). It is killed with SIGKILL while events arrive; the restarted job resumes from
the query's checkpoint, and every event ends up enriched. A SIGTERM then stops it cleanly (exit 0).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stream_app.realtime import lookup_jar

from .conftest import FLIGHT, flight

pytestmark = pytest.mark.spark


def _ids(records):
    return {r["value"]["flight_id"] for r in records if r["value"] is not None}


def test_kill9_and_restart_lose_nothing(env, kafka, tmp_path):
    lookup_jar()
    for faa in ("EWR", "LAX"):
        env.put_airport(faa)
    (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        textwrap.dedent(f"""\
        version: 1
        kafka:
          bootstrap_servers: {kafka.bootstrap_servers}
        stream:
          name: rt-kill9-{env.unique}
          mode: realtime
          checkpoint_interval: 5 seconds
          events: {{topic: {env.events}, value_schema: flight.avsc, starting_offsets: earliest}}
          snapshots:
            - name: airports
              topics: [{env.airports}]
              key_schema: nycflights13/airport_key
              value_schema: nycflights13/airport
          lookups:
            - {{snapshot: airports, on: {{origin: faa}}, prefix: origin_, fields: [name]}}
          enriched_topic: {env.enriched}
          dead_letter_topic: {env.dlq}
          checkpoint_location: {tmp_path / "checkpoint"}
          spark: {{master: "local[2]", driver_memory: 1g}}
        """)
    )
    threes = Path(sys.executable).parent / "threes"
    logs = [tmp_path / "run-1.log", tmp_path / "run-2.log"]

    def start(log: Path) -> subprocess.Popen:
        return subprocess.Popen([str(threes), "-v", "stream", "run", str(config)], stdout=subprocess.DEVNULL,
                                stderr=log.open("w"), start_new_session=True)

    env.put_flights([flight(i, "EWR") for i in range(50)])
    first = start(logs[0])
    try:
        env.consume(env.enriched, lambda rs: set(range(50)) <= _ids(rs), timeout_s=300)
        env.put_flights([flight(i, "LAX") for i in range(50, 100)])
        os.killpg(first.pid, signal.SIGKILL)  # the driver and its JVM, mid-stream
        first.wait(60)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    env.put_flights([flight(i, "LAX") for i in range(100, 120)])
    second = start(logs[1])
    try:
        got = env.consume(env.enriched, lambda rs: set(range(120)) <= _ids(rs), timeout_s=300)
        names = {r["value"]["flight_id"]: r["value"]["origin_name"] for r in got if r["value"] is not None}
        assert {names[i] for i in range(50)} == {"Newark Liberty Intl"}
        assert {names[i] for i in range(50, 120)} == {"Los Angeles Intl"}
        second.send_signal(signal.SIGTERM)
        assert second.wait(120) == 0, logs[1].read_text()[-3000:]
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
    assert "mode=realtime" in logs[1].read_text()
