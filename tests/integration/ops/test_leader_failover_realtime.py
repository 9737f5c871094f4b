"""Kafka with three brokers: kill -9 the leader of the events topic's busiest partition under a real-time job.

The stream job runs in real-time mode (``stream.mode: realtime``, its own process and Spark,
``local[2]``: a task slot per events partition) on the three-broker cluster of ``conftest.py``,
enriching events that arrive at a steady rate for ``THREES_FAILOVER_LOAD_S`` seconds (20; ``make
drills``: 60). Mid-load the leader of the events topic's busiest partition is killed with SIGKILL and
restarted ``THREES_FAILOVER_DOWN_S`` (5) seconds later. Every event must be enriched with the right
reference (no event lost); real-time mode is at least once, so an event enriched twice is counted
and printed, not refused. The stall (from the kill until the enriched topic grows again, and until
every event of the load is enriched) is printed as a ``[failover]`` line, not asserted. A SIGTERM
then stops the job cleanly (exit 0).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kernel.kafka.committed import high_watermarks
from stream_app.realtime import lookup_jar
from tests.integration.ops.brokers import BrokerCluster, measure_stalls
from tests.integration.stream.conftest import FLIGHT, Env, flight

pytestmark = [pytest.mark.serial, pytest.mark.integration, pytest.mark.spark]

LOAD_S = float(os.environ.get("THREES_FAILOVER_LOAD_S", "20"))  # make drills: 60
RATE = 50  # events per second


@pytest.fixture(autouse=True)
def _every_broker_back(brokers: BrokerCluster) -> Iterator[None]:
    """After the scenario all three brokers run again, whatever failed."""
    yield
    brokers.up()


def _produce(env: Env, ids: range) -> None:
    """Write flights ``ids`` (even: from EWR, odd: from LAX), waiting out a leader election."""
    for i in ids:
        fl = flight(i, "EWR" if i % 2 == 0 else "LAX")
        env.producer.produce(env.events, key=str(i).encode(), value=env.flight_ser(fl))
    while env.producer.flush(30) > 0:  # acks=all, idempotent: it retries through the failover
        pass


def _load(env: Env, first: int, stop: threading.Event, sent: list[int]) -> None:
    """``RATE`` events a second from id ``first`` until ``stop`` or ``LOAD_S``; the ids written go to ``sent``."""
    began, at = time.monotonic(), first
    while not stop.is_set() and time.monotonic() - began < LOAD_S:
        _produce(env, range(at, at + RATE))
        sent.extend(range(at, at + RATE))
        at += RATE
        time.sleep(max(0.0, began + (at - first) / RATE - time.monotonic()))


def test_realtime_stream_job_loses_no_event(brokers: BrokerCluster, tmp_path: Path, unique: str) -> None:
    lookup_jar()
    env = Env(brokers.kafka, brokers.conf, unique, tmp_path)
    env.put_airport("EWR")
    env.put_airport("LAX")
    (tmp_path / "flight.avsc").write_text(json.dumps(FLIGHT))
    config = tmp_path / "pipeline.yaml"
    config.write_text(textwrap.dedent(f"""\
        version: 1
        kafka:
          bootstrap_servers: {brokers.kafka.bootstrap_servers}
        stream:
          name: rt-failover-{unique}
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
        """))
    log = tmp_path / "run.log"
    threes = Path(sys.executable).parent / "threes"
    job = subprocess.Popen([str(threes), "-v", "stream", "run", str(config)], stdout=subprocess.DEVNULL,
                           stderr=log.open("w"), start_new_session=True)
    sent: list[int] = list(range(50))
    stop = threading.Event()
    try:
        _produce(env, range(50))
        env.consume(env.enriched, lambda rs: set(range(50)) <= {r["value"]["flight_id"] for r in rs}, 300)
        loader = threading.Thread(target=_load, args=(env, 50, stop, sent), daemon=True)
        loader.start()
        time.sleep(min(5.0, LOAD_S / 4))  # the job is enriching the load when the leader goes away
        failover = brokers.kill_leader(env.events, {
            "job's enriched records": lambda _p: sum(high_watermarks(brokers.conf, env.enriched, timeout_s=2).values()),
        })
        measure_stalls(failover, timeout_s=300)
        brokers.restart(failover)
        loader.join(LOAD_S + 300)
        assert not loader.is_alive(), "the load did not end"
        expected = set(sent)
        got = env.consume(env.enriched, lambda rs: expected <= {r["value"]["flight_id"] for r in rs}, 420)
        failover.stalls["every event of the load enriched"] = time.monotonic() - failover.killed_at
        print(failover.report("real-time stream job (stream.mode: realtime)"))
        job.send_signal(signal.SIGTERM)
        assert job.wait(180) == 0, log.read_text()[-6000:]
    finally:
        stop.set()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    seen: Counter[int] = Counter(r["value"]["flight_id"] for r in got)
    names: dict[int, Any] = {r["value"]["flight_id"]: r["value"]["origin_name"] for r in got}
    assert set(seen) == expected  # every event, and none that was never sent
    assert all(names[i] == ("Newark Liberty Intl" if i % 2 == 0 else "Los Angeles Intl") for i in expected)
    again = sum(n - 1 for n in seen.values())
    print(f"[failover] real-time stream job: {len(expected)} events, {again} enriched more than once (at least once)")
    assert "mode=realtime" in log.read_text()
