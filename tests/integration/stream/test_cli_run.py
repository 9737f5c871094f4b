"""``threes stream run CONFIG --available-now`` end to end: its own Spark (a subprocess), real Kafka."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .conftest import FLIGHT, end_offsets, flight

pytestmark = pytest.mark.spark


def test_cli_runs_the_job_from_yaml(env, kafka, tmp_path):
    env.put_airport("EWR")
    env.put_flights([flight(1, "EWR", "LAX"), flight(2, "XXX", "LAX")])
    (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
    config = tmp_path / "pipeline.yaml"
    config.write_text(textwrap.dedent(f"""\
        version: 1
        kafka:
          bootstrap_servers: {kafka.bootstrap_servers}
        stream:
          name: cli-{env.unique}
          events: {{topic: {env.events}, value_schema: flight.avsc, starting_offsets: earliest}}
          snapshots:
            - name: airports
              topics: [{env.airports}]
              key_schema: nycflights13/airport_key
              value_schema: nycflights13/airport
          lookups:
            - {{snapshot: airports, on: {{origin: faa}}, prefix: origin_, how: inner, fields: [name]}}
          enriched_topic: {env.enriched}
          dead_letter_topic: {env.dlq}
          checkpoint_location: {tmp_path / "checkpoint"}
          spark: {{master: "local[1]", driver_memory: 1g}}
        """))
    threes = Path(sys.executable).parent / "threes"
    done = subprocess.run([str(threes), "-v", "stream", "run", str(config), "--available-now"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "snapshot=airports ready keys=1" in done.stderr
    assert sum(end_offsets(env.conf, env.enriched).values()) == 1  # flight 2's origin is unknown: inner join
    got = env.consume(env.enriched, lambda rs: len(rs) >= 1)
    assert [(r["value"]["flight_id"], r["value"]["origin_name"]) for r in got] == [(1, "Newark Liberty Intl")]
