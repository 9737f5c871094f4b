"""A paused stream job under ``threes run`` stops cleanly and resumes from its checkpoint (real Spark, real Kafka).

``threes run --only stream`` runs the job; ``POST /parts/stream/pause`` stops it (SIGTERM:
its running micro-batch and checkpoint finish) and nothing starts it again while events keep
coming; ``resume`` starts it again, and it goes on from its checkpoint: the events of before
the pause are not enriched a second time (its ``starting_offsets`` is ``earliest``, so a start
without the checkpoint would re-emit them), and those of the pause are enriched once.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.integration.sync.helpers import wait_until
from threes.pipeline.endpoint import read_discovery
from threes.pipeline.lock import lock_path

from .conftest import FLIGHT, end_offsets, flight

pytestmark = pytest.mark.spark


def _call(url: str, method: str, token: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_paused_stream_job_stops_and_resumes_from_its_checkpoint(env: Any, kafka: Any, tmp_path: Path) -> None:
    env.put_airport("EWR")
    env.put_flights([flight(1), flight(2)])
    (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
    config = tmp_path / "pipeline.yaml"
    config.write_text(
        textwrap.dedent(f"""\
        version: 1
        kafka:
          bootstrap_servers: {kafka.bootstrap_servers}
        stream:
          name: pause-{env.unique}
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
          trigger_interval_s: 1
          checkpoint_location: {tmp_path / "checkpoint"}
          spark: {{master: "local[1]", driver_memory: 1g}}
        """)
    )
    threes = Path(sys.executable).parent / "threes"
    run = subprocess.Popen(
        [str(threes), "run", str(config), "--only", "stream", "--api-port", "0", "--log-dir", str(tmp_path / "logs")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=tmp_path,
    )
    try:
        wait_until(lambda: read_discovery(lock_path(config)) is not None, 60, "the run's API")
        found = read_discovery(lock_path(config))
        assert found is not None
        url, token = found["url"], found["token"]

        def part() -> dict[str, Any]:
            return _call(f"{url}/parts/stream", "GET", token)[1]

        enriched = lambda: sum(end_offsets(env.conf, env.enriched).values())  # noqa: E731
        wait_until(lambda: enriched() == 2, 300, "the first two events enriched", interval_s=1.0)
        first_pid = part()["pid"]

        code, doc = _call(f"{url}/parts/stream/pause", "POST", token)
        assert code == 202 and doc["state"] == "pausing", doc
        wait_until(lambda: part()["state"] == "paused", 150, "the job stopped", interval_s=0.5)
        assert part()["pid"] is None and "exit code 0" in part()["detail"]  # a clean stop
        env.put_flights([flight(3), flight(4), flight(5)])
        assert enriched() == 2  # nothing runs the job while it is paused

        code, doc = _call(f"{url}/parts/stream/resume", "POST", token)
        assert code == 202 and doc["state"] == "starting", doc
        wait_until(lambda: enriched() >= 5, 300, "the events of the pause enriched", interval_s=1.0)
        assert part()["pid"] not in (None, first_pid)
        got = env.consume(env.enriched, lambda rs: len(rs) >= 5)
        assert sorted(r["value"]["flight_id"] for r in got) == [1, 2, 3, 4, 5]  # each once: from the checkpoint
        assert enriched() == 5
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(180)
