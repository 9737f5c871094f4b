"""Supervised sinks: a batch that always fails, with ``errors.tolerance`` all and none.

A PostgreSQL trigger refuses one key with SQLSTATE 57P03 (a transient class
for the RDS sink), so its batch fails on every attempt until the test drops
the trigger:

* ``tolerance: all``: after ``retry_timeout_s`` the batch's records go to the
  dead letter topic with the error in their headers; every other record lands
  and the group's lag drains to 0.
* ``tolerance: none``: the sink's task fails, is restarted with backoff (more
  than once), the committed offset never passes the failing batch and nothing
  goes to the dead letter topic; once the trigger is dropped the restarted
  sink writes everything by itself.

Both run under the :class:`~sync_service.supervisor.ServiceSupervisor`, whose
``/status.json`` and the ``threes status --json`` command are asserted on.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from sync_service.supervisor import ServiceSupervisor
from tests.integration.ops.helpers import accept_all, fail_key, free_port, get_json, metric, rows, send_stamped
from tests.integration.sync.helpers import UpdateProducer, create_topic, group_lag, pipeline, read_topic, wait_until

KEYS = 30
BAD = 13


def _doc(kafka: KafkaConfig, pg: RdsConnection, unique: str, tolerance: str, port: int) -> dict[str, Any]:
    return {
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "connections": {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
        "sync": [{
            "name": f"sup-{unique}", "dead_letter_topic": f"dlq.{unique}", "metrics_port": port,
            "batch": {"max_records": 5, "max_age_ms": 100},
            "retry": {"initial_backoff_s": 0.05, "max_backoff_s": 0.2},
            "sinks": [{
                "name": "db", "type": "rds_sink", "connection": "pg", "topics": [f"updates.sup.{unique}"],
                "table": f"sup_{unique}", "key": ["id"], "create_table": True,
                "errors": {"retry_timeout_s": 0.5, "tolerance": tolerance, "restart_backoff_s": 0.2,
                           "restart_max_backoff_s": 1.0},
            }],
        }],
    }


def _start(kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any, unique: str,
           tolerance: str) -> tuple[Any, ServiceSupervisor, threading.Thread, threading.Event, int, UpdateProducer]:
    port = free_port()
    doc = _doc(kafka, pg, unique, tolerance, port)
    p = pipeline(kafka, doc["connections"], doc["sync"])
    topic, table = f"updates.sup.{unique}", f"sup_{unique}"
    create_topic(kafka_conf, topic, 1)
    producer = UpdateProducer(kafka, topic)
    for key in range(10):
        producer.send(key, 1)
    producer.flush()
    sup = ServiceSupervisor(p.kafka, p.sync[0], dict(p.connections), serve_addr="127.0.0.1")
    stop = threading.Event()
    thread = threading.Thread(target=sup.run, args=(stop,), daemon=True)
    thread.start()
    wait_until(lambda: len(rows(pg_engine, table)) == 10, 60, "the first 10 rows (the table exists)")
    fail_key(pg_engine, table, BAD)
    committed_at_ms = int(time.time() * 1000) - 30_000  # as if the source committed them 30 s ago
    for key in range(10, KEYS):
        send_stamped(producer, key, 1, committed_at_ms)
    producer.flush()
    return doc, sup, thread, stop, port, producer


def test_tolerance_all_dead_letters_the_failing_batch_and_goes_on(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any, unique: str,
) -> None:
    doc, sup, thread, stop, port, producer = _start(kafka, kafka_conf, pg, pg_engine, unique, "all")
    topic, table, group = f"updates.sup.{unique}", f"sup_{unique}", f"threes-sync-sup-{unique}"
    try:
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0, 60, "the group's lag to drain")
        letters = read_topic(kafka_conf, f"dlq.{unique}", 1)
        dead_keys = {producer.key_of(m) for m in letters}
        landed = set(rows(pg_engine, table))
        assert BAD in dead_keys and BAD not in landed
        assert landed | dead_keys == set(range(KEYS))  # nothing lost: every record landed or is a dead letter
        assert not landed & dead_keys
        assert len(dead_keys) <= 5  # only the failing batch (max_records 5)
        for m in letters:
            h = {k: (v or b"").decode() for k, v in m.headers() if k.startswith("dlq.")}
            assert h["dlq.stage"] == "write" and h["dlq.component"] == f"sup-{unique}/db"
            assert "refused by a test trigger" in h["dlq.error.message"]
        status = get_json(f"http://127.0.0.1:{port}/status.json")["sync"][0]
        (sink,) = status["sinks"]
        assert sink["state"] == "running" and sink["restarts"] == 0 and sink["dead_letters"] == len(letters)
        assert "refused by a test trigger" in sink["last_error"]
        # freshness from the source commit: every batch of stamped records is at least 30 s old when durable
        count = metric(port, "threes_sync_source_freshness_seconds_count")
        total = metric(port, "threes_sync_source_freshness_seconds_sum")
        assert count and count >= 3 and total is not None and total / count >= 30
    finally:
        stop.set()
        thread.join(60)
        accept_all(pg_engine, table)


def test_tolerance_none_restarts_with_backoff_and_never_commits_past_the_batch(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any, unique: str,
    tmp_path: Path,
) -> None:
    doc, sup, thread, stop, port, producer = _start(kafka, kafka_conf, pg, pg_engine, unique, "none")
    topic, table, group = f"updates.sup.{unique}", f"sup_{unique}", f"threes-sync-sup-{unique}"
    bad_offset = producer.delivered[BAD][1]
    try:
        def restarted() -> dict[str, Any] | None:
            s = get_json(f"http://127.0.0.1:{port}/status.json")["sync"][0]
            return s if s["sinks"][0]["restarts"] >= 2 else None

        status = wait_until(restarted, 60, "two restarts of the failing sink")
        (sink,) = status["sinks"]
        assert sink["state"] in ("restarting", "recovering")
        assert "refused by a test trigger" in sink["last_error"]
        assert status["state"] == "degraded"
        assert [topic, 0] in status["paused"] or sink["state"] == "recovering"
        # the committed offset never passes the failing batch, and nothing was dead-lettered
        committed = {p["partition"]: p["committed"] for p in status["partitions"]}
        assert committed.get(0) is None or committed[0] <= bad_offset
        assert BAD not in rows(pg_engine, table)
        assert read_topic(kafka_conf, f"dlq.{unique}", 0, timeout_s=3) == []
        # while stuck, the oldest un-durable record keeps ageing (from its source commit, 30 s before)
        assert sink["oldest_pending_age_s"] >= 30
        assert (metric(port, "threes_sync_oldest_pending_age_seconds") or 0) >= 30

        # threes status --json gathers the same facts from Kafka and the service's endpoint
        config = tmp_path / "pipeline.yaml"
        config.write_text(yaml.safe_dump(doc))
        from threes.cli import app

        result = CliRunner().invoke(app, ["status", str(config), "--json"])
        assert result.exit_code == 0, result.output
        import json

        gathered = json.loads(result.stdout)
        (svc,) = gathered["sync"]
        assert svc["service"] == f"sup-{unique}" and svc["group"] == group
        assert svc["state"] == "degraded" and svc["restarts"] == 0
        (part,) = svc["partitions"]
        assert part["topic"] == topic and part["end_offset"] == KEYS
        assert part["committed"] is None or part["committed"] <= bad_offset
        assert part["lag"] >= KEYS - bad_offset
        (gsink,) = svc["sinks"]
        assert gsink["sink"] == "db" and gsink["restarts"] >= 2 and gsink["state"] in ("restarting", "recovering")
        assert gathered["endpoints"] == [{"url": f"http://127.0.0.1:{port}/status.json", "ok": True, "error": None}]

        # the target accepts the key again: the restarted sink writes everything by itself
        accept_all(pg_engine, table)
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0, 60, "the group's lag to drain")
        assert set(rows(pg_engine, table)) == set(range(KEYS))
        status = wait_until(
            lambda: (s := get_json(f"http://127.0.0.1:{port}/status.json")["sync"][0])["state"] == "running" and s,
            30, "the service's status to say running (refreshed every second)")
        assert status["sinks"][0]["state"] == "running"
        metrics = __import__("urllib.request").request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
        line = next(ln for ln in metrics.splitlines() if ln.startswith("threes_sync_sink_restarts_total{"))
        assert float(line.rsplit(" ", 1)[1]) >= 2
    finally:
        stop.set()
        thread.join(60)
        accept_all(pg_engine, table)
