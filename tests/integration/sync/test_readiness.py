"""A restarted sync service is not ready before the consumer group assigned it partitions (issue #40 item 7).

The drill: the service was killed (SIGKILL) and started again; the group still counts the dead member until
its session expires, so the new member gets its partitions only then (about 37 s with the default 45 s
session timeout). It used to report ``running`` (and ``threes run`` "ready") at once.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from sqlalchemy import MetaData, Table

from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from sync_service.service import SyncService
from tests.integration.sync.helpers import UpdateProducer, create_topic, pipeline, run_in_thread, wait_until
from threes.pipeline.probes import scrape, sync_assigned

# a member of the group that holds every partition, then dies without leaving it (SIGKILL)
_MEMBER = """
import json, sys
from confluent_kafka import Consumer
conf, topic = json.loads(sys.argv[1]), sys.argv[2]
c = Consumer(conf)
c.subscribe([topic], on_assign=lambda consumer, parts: print("assigned", len(parts), flush=True))
while True:
    c.poll(0.1)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_restarted_service_is_ready_only_once_partitions_are_assigned(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any, unique: str
) -> None:
    topic, table, name = f"updates.ready.{unique}", f"ready_{unique}", f"ready-{unique}"
    create_topic(kafka_conf, topic, 2)
    port = _free_port()
    p = pipeline(kafka, {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
                 [{"name": name, "dead_letter_topic": f"dlq.{unique}", "session_timeout_ms": 6_000,
                   "max_poll_interval_ms": 10_000, "metrics_port": port,
                   "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic],
                              "table": table, "key": ["id"], "create_table": True}]}])
    config = p.sync[0]
    member_conf = {**kafka_conf, "group.id": config.consumer_group(), "session.timeout.ms": 6_000,
                   "partition.assignment.strategy": "cooperative-sticky", "enable.auto.commit": False}
    member = subprocess.Popen([sys.executable, "-c", _MEMBER, json.dumps(member_conf), topic],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert member.stdout is not None
        assert member.stdout.readline().split() == ["assigned", "2"]
    finally:
        member.send_signal(signal.SIGKILL)
        member.wait(10)
    producer = UpdateProducer(kafka, topic)
    for key in range(10):
        producer.send(key, 1)
    producer.flush()

    service = SyncService(p.kafka, config, dict(p.connections))
    thread, stop, errors = run_in_thread(service)
    seen: list[tuple[str, int, int | None]] = []  # (state, partitions held, the probe's assigned partitions)

    def observe() -> bool:
        doc = service.status()
        text = scrape(port, timeout_s=1.0)
        probe = None if text is None else sync_assigned(text).get(name)
        seen.append((doc["state"], len(service._assigned), probe))
        return len(service._assigned) == 2

    try:
        while not observe():
            assert not errors, errors
            assert thread.is_alive()
            time.sleep(0.1)
            if len(seen) > 1_200:
                raise AssertionError(f"no assignment within ~2 min: {seen[-5:]}")
        waiting = [s for s in seen if s[1] == 0]
        assert waiting, "the test saw the service before its assignment"
        # before its partitions: never running, and the readiness probe of `threes run` says 0
        assert all(state in ("starting", "waiting_for_partitions") for state, _n, _probe in waiting), waiting
        assert all(probe in (None, 0) for _state, _n, probe in waiting), waiting
        assert any(state == "waiting_for_partitions" for state, _n, _probe in waiting), waiting
        # once assigned: running, and the probe says so
        wait_until(lambda: observe() and seen[-1][0] == "running" and seen[-1][2] == 2, 30, "ready")
        wait_until(lambda: service.status()["lag"] == 0 and service.status()["partitions"], 60, "records written")
        assert not errors, errors
    finally:
        stop.set()
        thread.join(60)
        Table(table, MetaData()).drop(pg_engine, checkfirst=True)
        Table(f"{table}__deleted", MetaData()).drop(pg_engine, checkfirst=True)
