"""Kill -9 the sync service again and again during a load: zero lost updates in all three targets.

``threes sync run`` runs three sync services (one per target, each its own
consumer group, static membership so a restart takes its partitions back at
once) while a producer writes updates across 1,000 keys. The process is killed
with SIGKILL at random moments and restarted. In the end every key holds its
highest version in PostgreSQL, Elasticsearch and S3, and SIGTERM stops it
cleanly (exit 0).

Sized for CI by default (``THREES_SOAK_UPDATES=10000``, ``THREES_SOAK_KILLS=5``);
the issue's full size is 50,000 updates and 20 kills.
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

import yaml
from elasticsearch import helpers
from sqlalchemy import MetaData, Table, select

from connectors.elasticsearch.connection import ElasticsearchConnection
from connectors.rds.connection import RdsConnection
from connectors.s3.connection import S3Connection
from kernel.config.models import KafkaConfig
from tests.integration.sync.helpers import UpdateProducer, create_topic, group_lag, wait_until
from tests.integration.sync.test_s3_sink import list_keys, s3_state

UPDATES = int(os.environ.get("THREES_SOAK_UPDATES", "10000"))
KILLS = int(os.environ.get("THREES_SOAK_KILLS", "5"))
KEYS = 1_000


def test_kill9_loses_no_update(kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any,
                               es_conn: ElasticsearchConnection, es: Any, s3_conn: S3Connection, s3: Any,
                               unique: str, tmp_path: Path) -> None:
    topic, table, index, bucket = f"updates.soak.{unique}", f"soak_{unique}", f"soak-{unique}", f"soak-{unique}"
    create_topic(kafka_conf, topic, 3)
    s3.create_bucket(Bucket=bucket)
    common = {"dead_letter_topic": f"dlq.{unique}", "session_timeout_ms": 6_000, "max_poll_interval_ms": 30_000,
              "batch": {"max_records": 1_000, "max_age_ms": 300}}
    config = {
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "connections": {
            "pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()},
            "es": {"type": "elasticsearch", "hosts": es_conn.hosts},
            "s3": {"type": "s3", "endpoint_url": s3_conn.endpoint_url, "region": s3_conn.region,
                   "access_key_id": s3_conn.access_key_id,
                   "secret_access_key": s3_conn.secret_access_key.get_secret_value(), "path_style": True},
        },
        "sync": [
            {"name": f"db-{unique}", "group_instance_id": "soak-0", **common, "sinks": [
                {"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic], "table": table,
                 "key": ["id"], "create_table": True}]},
            {"name": f"search-{unique}", "group_instance_id": "soak-0", **common, "sinks": [
                {"name": "search", "type": "elasticsearch_sink", "connection": "es", "topics": [topic],
                 "index": index}]},
            {"name": f"lake-{unique}", "group_instance_id": "soak-0", **common, "sinks": [
                {"name": "lake", "type": "s3_sink", "connection": "s3", "topics": [topic], "bucket": bucket,
                 "format": "jsonl", "rotate_records": 2_000, "rotate_interval_s": 1.0}]},
        ],
    }
    cfg = tmp_path / "soak.yaml"
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
        # spread the load over the kill loop (~4 s per kill and restart)
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
    last_start = 0
    proc = start()
    try:
        kills_mid_write = 0
        for _ in range(KILLS):
            # kill only once this process is writing: some batch of it was applied
            before = log_path.read_text().count("applied=")
            wait_until(lambda b=before, pr=proc: log_path.read_text().count("applied=") > b or pr.poll() is not None
                       or done.is_set(), 60, "the restarted service to write")
            time.sleep(random.uniform(0.0, 1.5))
            assert proc.poll() is None, log_path.read_text()[-3000:]
            kills_mid_write += not done.is_set()
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            last_start = len(log_path.read_text())
            proc = start()
        feeder.join()
        assert done.is_set()
        assert kills_mid_write >= KILLS // 2, kills_mid_write  # most kills hit the service during the load
        # SIGTERM before the signal handlers exist would kill it like any process: wait until it runs
        wait_until(lambda: log_path.read_text()[last_start:].count("assigned partitions") >= 3, 60,
                   "the last process to join its three groups")
        groups = [f"threes-sync-{name}-{unique}" for name in ("db", "search", "lake")]
        wait_until(lambda: all(group_lag(kafka_conf, g, topic) == 0 for g in groups), 240, "lag 0 in every group")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    assert len(latest) == KEYS
    t = Table(table, MetaData(), autoload_with=pg_engine)
    with pg_engine.connect() as conn:
        db = dict(conn.execute(select(t.c.id, t.c._version)).all())
    assert db == latest
    es.indices.refresh(index=index)
    docs = {int(h["_id"]): h["_version"] for h in helpers.scan(es, index=index, version=True)}
    assert docs == latest
    lake = {int(k): v for k, (v, _value) in s3_state(s3, bucket).items()}
    assert lake == latest
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert "Traceback" not in log_path.read_text()
    t.drop(pg_engine)
    es.indices.delete(index=index)
    for key in list_keys(s3, bucket):
        s3.delete_object(Bucket=bucket, Key=key)
