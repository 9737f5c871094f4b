"""Kill -9 the sync service again and again while it writes Iceberg tables: 0 lost, 0 duplicated.

``threes sync run`` runs one sync service with two Iceberg sinks on one update topic (3
partitions): ``lake`` upserts by key, ``events`` appends every record as a row. A producer
writes updates (each a new version) across 500 keys while the process is killed with SIGKILL
at random moments, often between an Iceberg commit and the Kafka offset commit, and
restarted. In the end the upsert table holds each key's highest version, the event table
holds every version exactly once (a record written twice would be a second row), and
SIGTERM stops the service cleanly.

Sized for CI by default (``THREES_ICEBERG_SOAK_UPDATES=5000``, ``THREES_ICEBERG_SOAK_KILLS=3``);
``make drills`` runs the issue's size, 50,000 updates and 10 kills.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.rds.connection import RdsConnection
from connectors.s3.connection import S3Connection
from kernel.config.models import KafkaConfig
from tests.integration.sync.helpers import UpdateProducer, create_topic, group_lag, wait_until
from tests.integration.sync.iceberg_helpers import as_yaml, iceberg_connection, read_with_polars

pytestmark = pytest.mark.integration

UPDATES = int(os.environ.get("THREES_ICEBERG_SOAK_UPDATES", "5000"))
KILLS = int(os.environ.get("THREES_ICEBERG_SOAK_KILLS", "3"))
KEYS = 500


def test_kill9_of_the_iceberg_sync_service_loses_and_duplicates_nothing(
    kafka: KafkaConfig,
    kafka_conf: dict[str, Any],
    pg: RdsConnection,
    s3_conn: S3Connection,
    unique: str,
    tmp_path: Path,
) -> None:
    topic = f"updates.icesoak.{unique}"
    create_topic(kafka_conf, topic, 3)
    lake = iceberg_connection(pg, s3_conn)
    upserts, events = f"soak_{unique}.items", f"soak_{unique}.events"
    config = {
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "connections": {"lake": as_yaml(lake)},
        "sync": [
            {
                "name": f"ice-{unique}",
                "group_instance_id": "icesoak-0",
                "dead_letter_topic": f"dlq.{unique}",
                "session_timeout_ms": 6_000,
                "max_poll_interval_ms": 60_000,
                "batch": {"max_records": 500, "max_age_ms": 300},
                "sinks": [
                    {
                        "name": "lake",
                        "type": "iceberg_sink",
                        "connection": "lake",
                        "topics": [topic],
                        "table": upserts,
                        "key": ["id"],
                    },
                    {
                        "name": "events",
                        "type": "iceberg_sink",
                        "connection": "lake",
                        "topics": [topic],
                        "table": events,
                        "mode": "append",
                    },
                ],
            }
        ],
    }
    cfg = tmp_path / "icesoak.yaml"
    cfg.write_text(yaml.safe_dump(config))
    log_path = tmp_path / "sync.log"
    threes = str(Path(sys.executable).parent / "threes")

    def start() -> subprocess.Popen[bytes]:
        with log_path.open("ab") as log:
            return subprocess.Popen([threes, "-v", "sync", "run", str(cfg)], stdout=log, stderr=log)

    producer = UpdateProducer(kafka, topic)
    latest: dict[int, int] = {}
    done = threading.Event()

    def produce() -> None:
        per_tick = max(1, UPDATES // max(1, KILLS * 40))
        for version in range(1, UPDATES + 1):
            key = random.randrange(KEYS) if version > KEYS else version - 1
            producer.send(key, version)
            latest[key] = version
            if version % per_tick == 0:
                time.sleep(0.1)
        producer.flush()
        done.set()

    feeder = threading.Thread(target=produce)
    feeder.start()
    proc = start()
    last_start = 0
    try:
        for _ in range(KILLS):
            before = log_path.read_text().count("applied=")
            wait_until(
                lambda b=before, pr=proc: log_path.read_text().count("applied=") > b or pr.poll() is not None,
                120,
                "the (re)started service to write",
            )
            time.sleep(random.uniform(0.0, 1.5))
            assert proc.poll() is None, log_path.read_text()[-3000:]
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            last_start = len(log_path.read_text())
            proc = start()
        feeder.join()
        assert done.is_set()
        wait_until(
            lambda: "assigned partitions" in log_path.read_text()[last_start:], 90, "the last process to join its group"
        )
        group = f"threes-sync-ice-{unique}"
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0, 300, "lag 0")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    text = log_path.read_text()
    assert "Traceback" not in text
    assert as_yaml(lake)["storage"]["secret_access_key"] not in text  # no secret in the log
    assert "already in" in text  # a restart re-read records the tables held (killed before the Kafka commit)
    assert len(latest) == KEYS
    table = read_with_polars(lake, upserts)
    assert dict(zip(table["id"].to_list(), table["_version"].to_list(), strict=True)) == latest
    assert table.height == KEYS
    versions = sorted(read_with_polars(lake, events)["_version"].to_list())
    assert versions == list(range(1, UPDATES + 1))  # every record once: none lost, none twice
