"""The outage drill: PostgreSQL stops for 90 s while a source and a sync service run, then starts again.

Both recover by themselves, in process: the source task (an ``incrementing``
RDS source) fails once its ``errors.retry_timeout_s`` is spent and its
supervisor restarts it with backoff from the stored position; the RDS sink
fails, its partitions pause, and it is reopened with backoff until the
database answers, writing the failed batch first. Nothing is lost: every
source row reaches the state topic and every update reaches the table, and
the restart counters (metrics and ``/status.json``) are above zero.

The local stack is shared: the drill stops the project's PostgreSQL with
``threes local down --service postgres`` and appends a line to
``/tmp/threes-restarts.log``. ``THREES_OUTAGE_S`` sets the outage (default 90 s).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from connectors.config import pipeline_from_dict
from connectors.config.models import KafkaConfig, RdsConnection
from connectors.runtime import metrics as source_metrics
from connectors.runtime.standalone import SourceWorker, task_specs
from sync_service.supervisor import ServiceSupervisor
from tests.conftest import ROOT
from tests.integration.ops.helpers import free_port, get_json, rows
from tests.integration.sources.contract import topic_state
from tests.integration.sync.helpers import UpdateProducer, create_topic, group_lag, wait_until

OUTAGE_S = float(os.environ.get("THREES_OUTAGE_S", "90"))
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
