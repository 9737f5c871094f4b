"""The outage drill: PostgreSQL stops (for 90 s in ``make drills``) while a source and a sync service run, then starts again.

Both recover by themselves, in process: the source task (an ``incrementing``
RDS source) fails once its ``errors.retry_timeout_s`` is spent and its
supervisor restarts it with backoff from the stored position; the RDS sink
fails, its partitions pause, and it is reopened with backoff until the
database answers, writing the failed batch first. Nothing is lost: every
source row reaches the state topic and every update reaches the table, and
the restart counters (metrics and ``/status.json``) are above zero.

The local stack is shared: the drill stops the project's PostgreSQL with
``threes local down --service postgres`` and appends a line to
``/tmp/threes-restarts.log``. ``THREES_OUTAGE_S`` sets the outage: 20 s in ``make test`` (past the
retry timeout of 3 s and the longest backoff of 4 s, so every recovery path runs several times), the
issue's 90 s in ``make drills``.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from connectors.rds.connection import RdsConnection
from connectors.runtime import metrics as source_metrics
from connectors.runtime.standalone import SourceWorker, task_specs
from kernel.config.models import KafkaConfig
from sync_service.supervisor import ServiceSupervisor
from tests.conftest import ROOT
from tests.integration.ops.helpers import free_port, get_json, rows
from tests.integration.sync.helpers import UpdateProducer, create_topic, group_lag, wait_until
from threes.config import pipeline_from_dict
from threes.testing.source import topic_state

# the drill stops PostgreSQL and Elasticsearch, which every other test uses: it runs alone
pytestmark = pytest.mark.serial

OUTAGE_S = float(os.environ.get("THREES_OUTAGE_S", "20"))
ERRORS = {"retry_timeout_s": 3, "restart_backoff_s": 1, "restart_max_backoff_s": 4}


def _threes(*args: str) -> None:
    subprocess.run([str(ROOT / ".venv" / "bin" / "threes"), *args], check=True, cwd=ROOT, timeout=300,
                   capture_output=True)


def _log_restart(what: str) -> None:
    with open("/tmp/threes-restarts.log", "a") as f:
        f.write(f"{dt.datetime.now(dt.UTC).isoformat()} {what}; why: tests/integration/ops/test_outage.py "
                f"(issue 15 outage drill, {OUTAGE_S:g} s)\n")


def test_postgres_outage_source_and_sink_recover_by_themselves(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any, unique: str,
    tmp_path: Path,
) -> None:
    src_table, state_topic = f"drill_src_{unique}", f"state.drill.{unique}"
    sink_table, update_topic = f"drill_{unique}", f"updates.drill.{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {src_table} (id integer PRIMARY KEY, v text)"))
        c.execute(text(f"INSERT INTO {src_table} SELECT g, 'v' || g FROM generate_series(1, 100) g"))
    create_topic(kafka_conf, update_topic, 2)
    port = free_port()
    p = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "connections": {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value(),
                               "connect_timeout_s": 2}},
        "sources": [{"name": f"drill-{unique}", "type": "rds_source", "connection": "pg", "topic": state_topic,
                     "table": src_table, "mode": "incrementing", "incrementing_column": "id",
                     "poll_interval_s": 0.5, "commit_delay_s": 0, "errors": ERRORS}],
        "sync": [{"name": f"drill-{unique}", "dead_letter_topic": f"dlq.{unique}", "metrics_port": port,
                  "batch": {"max_records": 50, "max_age_ms": 200},
                  "retry": {"initial_backoff_s": 0.2, "max_backoff_s": 1},
                  "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [update_topic],
                             "table": sink_table, "key": ["id"], "create_table": True, "errors": ERRORS}]}],
    })
    worker = SourceWorker(p, offsets_topic=f"_offsets.{unique}")
    (spec,) = task_specs(p.sources)
    stop = threading.Event()
    worker.start(spec)
    sup = ServiceSupervisor(p.kafka, p.sync[0], dict(p.connections), serve_addr="127.0.0.1")
    sync_thread = threading.Thread(target=sup.run, args=(stop,), daemon=True)
    sync_thread.start()
    producer = UpdateProducer(kafka, update_topic)
    group = p.sync[0].consumer_group()
    pg_down = False
    try:
        for key in range(100):
            producer.send(key, 1)
        producer.flush()
        wait_until(lambda: len(rows(pg_engine, sink_table)) == 100, 60, "the first 100 updates in the table")
        wait_until(lambda: len(topic_state(kafka_conf, state_topic)) == 100, 60, "the first 100 source rows")

        pg_engine.dispose()
        _log_restart("threes local down --service postgres, then up")
        _threes("local", "down", "--service", "postgres")
        pg_down = True
        began = time.monotonic()
        for key in range(100, 200):  # Kafka is up: updates keep coming while the target is down
            producer.send(key, 2)
        producer.flush()
        seen_sink, seen_source = set(), set()
        while time.monotonic() - began < OUTAGE_S:
            status = get_json(f"http://127.0.0.1:{port}/status.json")["sync"][0]
            seen_sink.add(status["sinks"][0]["state"])
            seen_source.add(worker.stats()[spec.key].state)
            time.sleep(1)
        _threes("local", "up", "--service", "postgres")
        pg_down = False

        with pg_engine.begin() as c:  # the source system takes writes again: new rows are read too
            c.execute(text(f"INSERT INTO {src_table} SELECT g, 'v' || g FROM generate_series(101, 200) g"))
        wait_until(lambda: group_lag(kafka_conf, group, update_topic) == 0, 120, "the sync group's lag to drain")
        assert rows(pg_engine, sink_table) == {**{k: 1 for k in range(100)}, **{k: 2 for k in range(100, 200)}}
        def all_rows() -> dict[Any, Any] | None:
            s = topic_state(kafka_conf, state_topic)
            return s if len(s) == 200 else None

        state = wait_until(all_rows, 120, "every source row in the state topic")
        assert sorted(k[0] for k in state) == list(range(1, 201))
        assert all(v["v"] == f"v{k[0]}" for k, v in state.items())

        # both failed during the outage and were restarted by their supervisors, in this process
        assert {"restarting", "recovering"} & seen_sink, seen_sink
        assert "restarting" in seen_source or worker.restarts()[spec.key] > 0, seen_source
        assert worker.restarts()[spec.key] > 0
        sample = source_metrics.REGISTRY.get_sample_value(
            "threes_source_task_restarts_total", {"connector": f"drill-{unique}", "task": spec.key})
        assert sample is not None and sample > 0
        status = wait_until(
            lambda: (s := get_json(f"http://127.0.0.1:{port}/status.json")["sync"][0])["state"] == "running" and s,
            30, "the sync service running again")
        assert status["sinks"][0]["restarts"] > 0 and status["sinks"][0]["state"] == "running"
        assert wait_until(lambda: worker.stats()[spec.key].state in ("running", "caught_up"), 30, "the source")
        assert status["dead_letters"] == 0  # nothing was given up on
        print(f"outage {OUTAGE_S:g} s: source restarts={worker.restarts()[spec.key]} states={sorted(seen_source)}; "
              f"sink restarts={status['sinks'][0]['restarts']} states={sorted(seen_sink)}")
    finally:
        if pg_down:
            _threes("local", "up", "--service", "postgres")
        stop.set()
        worker.stop()
        sync_thread.join(60)


def test_elasticsearch_outage_source_and_sink_recover_by_themselves(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], es_conn: Any, es: Any, unique: str,
) -> None:
    src_index, state_topic = f"drill-src-{unique}", f"state.esdrill.{unique}"
    sink_index, update_topic = f"drill-{unique}", f"updates.esdrill.{unique}"
    es.indices.create(index=src_index, mappings={"properties": {"n": {"type": "long"}}})
    for i in range(50):
        es.index(index=src_index, id=f"d{i}", document={"n": i})
    es.indices.refresh(index=src_index)
    create_topic(kafka_conf, update_topic, 2)
    port = free_port()
    p = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "connections": {"es": {"type": "elasticsearch", "hosts": es_conn.hosts, "request_timeout_s": 5}},
        "sources": [{"name": f"esdrill-{unique}", "type": "elasticsearch_source", "connection": "es",
                     "topic": state_topic, "index": src_index, "mode": "snapshot", "snapshot_interval_s": 1,
                     "poll_interval_s": 0.5, "errors": ERRORS}],
        "sync": [{"name": f"esdrill-{unique}", "dead_letter_topic": f"dlq.{unique}", "metrics_port": port,
                  "batch": {"max_records": 50, "max_age_ms": 200},
                  "retry": {"initial_backoff_s": 0.2, "max_backoff_s": 1},
                  "sinks": [{"name": "search", "type": "elasticsearch_sink", "connection": "es",
                             "topics": [update_topic], "index": sink_index, "errors": ERRORS}]}],
    })
    worker = SourceWorker(p, offsets_topic=f"_offsets.{unique}")
    (spec,) = task_specs(p.sources)
    stop = threading.Event()
    worker.start(spec)
    sup = ServiceSupervisor(p.kafka, p.sync[0], dict(p.connections), serve_addr="127.0.0.1")
    sync_thread = threading.Thread(target=sup.run, args=(stop,), daemon=True)
    sync_thread.start()
    producer = UpdateProducer(kafka, update_topic)
    group = p.sync[0].consumer_group()
    es_down = False

    def sink_count() -> int:
        es.indices.refresh(index=sink_index)
        return int(es.count(index=sink_index)["count"])

    try:
        for key in range(100):
            producer.send(key, 1)
        producer.flush()
        wait_until(lambda: es.indices.exists(index=sink_index) and sink_count() == 100, 60, "the first 100 docs")
        wait_until(lambda: len(topic_state(kafka_conf, state_topic)) == 50, 60, "the first 50 source docs")

        _log_restart("threes local down --service elasticsearch, then up")
        _threes("local", "down", "--service", "elasticsearch")
        es_down = True
        began = time.monotonic()
        for key in range(100, 200):
            producer.send(key, 2)
        producer.flush()
        seen_sink, seen_source = set(), set()
        while time.monotonic() - began < OUTAGE_S:
            status = get_json(f"http://127.0.0.1:{port}/status.json")["sync"][0]
            seen_sink.add(status["sinks"][0]["state"])
            seen_source.add(worker.stats()[spec.key].state)
            time.sleep(1)
        _threes("local", "up", "--service", "elasticsearch")
        es_down = False

        for i in range(50, 80):  # the source system takes writes again: new documents are read too
            es.index(index=src_index, id=f"d{i}", document={"n": i})
        es.indices.refresh(index=src_index)
        wait_until(lambda: group_lag(kafka_conf, group, update_topic) == 0, 180, "the sync group's lag to drain")
        assert sink_count() == 200
        docs = es.mget(index=sink_index, ids=["150", "50"])["docs"]
        assert [d["_version"] for d in docs] == [2, 1]  # external versions: the updates as sent

        def all_docs() -> dict[Any, Any] | None:
            s = topic_state(kafka_conf, state_topic)
            return s if len(s) == 80 else None

        state = wait_until(all_docs, 120, "every source document in the state topic")
        assert sorted(k[0] for k in state) == sorted(f"d{i}" for i in range(80))
        assert worker.restarts()[spec.key] > 0, seen_source
        status = wait_until(
            lambda: (s := get_json(f"http://127.0.0.1:{port}/status.json")["sync"][0])["state"] == "running" and s,
            60, "the sync service running again")
        assert {"restarting", "recovering"} & seen_sink, seen_sink
        assert status["sinks"][0]["restarts"] > 0 and status["dead_letters"] == 0
        print(f"elasticsearch outage {OUTAGE_S:g} s: source restarts={worker.restarts()[spec.key]} "
              f"states={sorted(seen_source)}; sink restarts={status['sinks'][0]['restarts']} states={sorted(seen_sink)}")
    finally:
        if es_down:
            _threes("local", "up", "--service", "elasticsearch")
        stop.set()
        worker.stop()
        sync_thread.join(60)
