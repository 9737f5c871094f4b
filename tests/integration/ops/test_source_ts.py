"""Sources stamp every state record with ``threes.source_ts`` (the commit or read time, epoch ms)."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer
from sqlalchemy import text

from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from kernel.updates import source_ts_of
from tests.integration.sources.rds import source_pipeline
from threes.testing.source import run_once


def test_every_state_record_carries_its_source_timestamp(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any, unique: str,
) -> None:
    table, topic = f"ts_src_{unique}", f"state.ts.{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id integer PRIMARY KEY, v text)"))
        c.execute(text(f"INSERT INTO {table} SELECT g, 'v' || g FROM generate_series(1, 50) g"))
    before = int(time.time() * 1000)
    p = source_pipeline(kafka, pg, name=f"ts-{unique}", topic=topic, table=table, mode="incrementing",
                        incrementing_column="id")
    (stats,) = run_once(p, offsets_topic=f"_offsets.{unique}").values()
    after = int(time.time() * 1000)
    assert stats.state == "caught_up" and stats.acked == 50
    consumer = Consumer({**kafka_conf, "group.id": f"ts-{uuid.uuid4().hex}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    stamps: list[int | None] = []
    deadline = time.monotonic() + 30
    while len(stamps) < 50 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            stamps.append(source_ts_of(msg.headers()))
    consumer.close()
    assert len(stamps) == 50
    assert all(s is not None and before <= s <= after for s in stamps), stamps[:3]


def test_a_live_source_reports_its_state_position_and_records_behind(
    kafka: KafkaConfig, pg: RdsConnection, pg_engine: Any, unique: str,
) -> None:
    from connectors.runtime.standalone import SourceWorker, task_specs
    from connectors.runtime.status import source_document
    from tests.integration.sync.helpers import wait_until

    table = f"behind_{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id integer PRIMARY KEY, v text, "
                       "ts timestamptz NOT NULL DEFAULT clock_timestamp())"))
        c.execute(text(f"INSERT INTO {table} (id, v) SELECT g, 'v' || g FROM generate_series(1, 40) g"))
    # an hour of commit delay: the rows are too young to read, so all 40 are behind the cursor
    p = source_pipeline(kafka, pg, name=f"behind-{unique}", topic=f"state.behind.{unique}", table=table,
                        mode="timestamp", timestamp_column="ts", commit_delay_s=3600, poll_interval_s=0.5)
    worker = SourceWorker(p, offsets_topic=f"_offsets.{unique}")
    (spec,) = task_specs(p.sources)
    worker.start(spec)
    try:
        wait_until(lambda: worker.stats()[spec.key].state == "caught_up", 60, "the source caught up")
        (entry,) = source_document(worker)["sources"]
        assert entry["task"] == spec.key and entry["state"] in ("caught_up", "running")
        assert entry["records_behind"] == 40 and entry["position"] is None and entry["restarts"] == 0
    finally:
        worker.stop()


def test_a_timestamp_mode_source_stamps_the_rows_update_time(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any, unique: str,
) -> None:
    table, topic = f"ts_upd_{unique}", f"state.tsupd.{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id integer PRIMARY KEY, ts timestamptz NOT NULL)"))
        c.execute(text(f"INSERT INTO {table} SELECT g, timestamptz '2024-05-01 12:00:00+00' + g * interval '1 s' "
                       "FROM generate_series(1, 10) g"))
    p = source_pipeline(kafka, pg, name=f"tsupd-{unique}", topic=topic, table=table, mode="timestamp",
                        timestamp_column="ts", batch_records=5)
    (stats,) = run_once(p, offsets_topic=f"_offsets.{unique}").values()
    assert stats.state == "caught_up" and stats.acked == 10
    consumer = Consumer({**kafka_conf, "group.id": f"ts-{uuid.uuid4().hex}", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    stamps: list[int | None] = []
    deadline = time.monotonic() + 30
    while len(stamps) < 10 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            stamps.append(source_ts_of(msg.headers()))
    consumer.close()
    base = 1_714_564_800_000  # 2024-05-01 12:00:00 UTC, epoch ms
    # each batch of 5 rows carries its newest row's update time: 12:00:05 and 12:00:10
    assert sorted(set(stamps)) == [base + 5_000, base + 10_000]
