"""A slow target: a lock held on the PostgreSQL table while updates keep coming.

The partitions feeding the RDS sink pause (and only those: the Elasticsearch
sink's topic keeps flowing), the member is never evicted from the group
(max.poll.interval.ms is 10 s, the lock is held longer), buffered bytes stay
under the configured bound, and everything lands once the lock is released.

``THREES_SLOW_TARGET_S`` sets how long the lock is held (CI default 20 s; the
issue's full size is 60 s).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import pytest
from sqlalchemy import MetaData, Table, func, inspect, select, text

from connectors.elasticsearch.connection import ElasticsearchConnection
from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from sync_service.service import PREFETCH_SHARE, SyncService
from tests.integration.sync.helpers import UpdateProducer, create_topic, pipeline, run_in_thread, wait_until

HOLD_S = float(os.environ.get("THREES_SLOW_TARGET_S", "20"))
BOUND = 1024 * 1024
KEYS = 1_000


def test_slow_target_pauses_only_its_partitions(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any,
    es_conn: ElasticsearchConnection, es: Any, unique: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    slow_topic, fast_topic = f"updates.slow.{unique}", f"updates.fast.{unique}"
    table, index = f"slow_{unique}", f"fast-{unique}"
    create_topic(kafka_conf, slow_topic, 2)
    create_topic(kafka_conf, fast_topic, 1)
    p = pipeline(kafka, {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()},
                         "es": {"type": "elasticsearch", "hosts": es_conn.hosts}},
                 [{"name": f"slow-{unique}", "dead_letter_topic": f"dlq.{unique}", "buffer_max_bytes": BOUND,
                   "max_poll_interval_ms": 10_000, "session_timeout_ms": 6_000,
                   "batch": {"max_records": 500, "max_age_ms": 200},
                   "sinks": [
                       {"name": "db", "type": "rds_sink", "connection": "pg", "topics": [slow_topic],
                        "table": table, "key": ["id"], "create_table": True, "lock_timeout_s": 1.0},
                       {"name": "search", "type": "elasticsearch_sink", "connection": "es", "topics": [fast_topic],
                        "index": index},
                   ]}])
    slow, fast = UpdateProducer(kafka, slow_topic), UpdateProducer(kafka, fast_topic)
    version = 0
    for key in range(KEYS):
        version += 1
        slow.send(key, version)
    slow.flush()
    service = SyncService(p.kafka, p.sync[0], dict(p.connections))
    thread, stop, errors = run_in_thread(service)
    t = None

    def db_versions() -> dict[int, int]:
        nonlocal t
        if t is None:
            if not inspect(pg_engine).has_table(table):
                return {}
            t = Table(table, MetaData(), autoload_with=pg_engine)
        with pg_engine.connect() as conn:
            return dict(conn.execute(select(t.c.id, t.c._version)).all())

    def es_count() -> int:
        es.indices.refresh(index=index)
        return es.count(index=index)["count"]

    try:
        wait_until(lambda: len(db_versions()) == KEYS or errors, 60, "the first 1,000 rows")
        assert not errors, errors
        samples: list[tuple[int, set[Any]]] = []
        produced = threading.Event()
        fast_sent = 0

        def keep_producing() -> None:
            nonlocal version, fast_sent
            end = time.monotonic() + HOLD_S
            while time.monotonic() < end:
                for _ in range(50):
                    version += 1
                    slow.send(version % KEYS, version)
                    fast.send(fast_sent, 1)
                    fast_sent += 1
                time.sleep(0.05)
            slow.flush()
            fast.flush()
            produced.set()

        with pg_engine.connect() as locker:
            quoted = pg_engine.dialect.identifier_preparer.quote(table)
            locker.execute(text(f"LOCK TABLE {quoted} IN ACCESS EXCLUSIVE MODE"))
            producer_thread = threading.Thread(target=keep_producing)
            producer_thread.start()
            es_during = []
            while not produced.is_set():
                samples.append((int(service.metrics.value("threes_sync_buffered_bytes")), set(service._paused)))
                if len(samples) % 10 == 0:
                    es_during.append(es_count() if es.indices.exists(index=index) else 0)
                time.sleep(0.2)
            producer_thread.join()
            assert not errors, errors
            locker.rollback()  # release the lock
        # the fast target kept up during the lock
        assert es_during and es_during[-1] > 0 and es_during[-1] > es_during[0]
        # the slow target's partitions stay paused through the lock; the fast topic's partition
        # may pause behind its own in-flight batch (its sink's slot only: a fast partition held back
        # by the slow sink would be paused in every sample). Under a loaded CI machine Elasticsearch's
        # answers slow down, and 15 of 69 samples (22%) were seen paused that way: at most half
        steady = samples[len(samples) // 4:]
        slow_paused = sum(1 for _b, s in steady if {(slow_topic, 0), (slow_topic, 1)} <= s)
        fast_paused = sum(1 for _b, s in steady if (fast_topic, 0) in s)
        assert slow_paused >= 0.8 * len(steady), (slow_paused, len(steady))
        assert fast_paused <= 0.5 * len(steady), (fast_paused, len(steady))
        assert max(b for b, _s in samples) <= BOUND, max(b for b, _s in samples)
        # everything lands afterwards: every key at its highest version, every fast doc indexed
        want = {}
        for v in range(1, version + 1):
            want[v % KEYS if v > KEYS else v - 1] = v
        wait_until(lambda: db_versions() == want or errors, 120, "every key at its highest version")
        wait_until(lambda: es_count() == fast_sent, 60, "every fast doc")
        assert not errors, errors
        assert service.metrics.value("threes_sync_retries_total", sink="db") > 0
        # never evicted while the target was slow (the records before the shutdown)
        running_log = "\n".join(r.getMessage() for r in caplog.records).lower()
        for evicted in ("poll interval", "leaving group", "leavegroup", "revoked partitions", "lost partitions"):
            assert evicted not in running_log, evicted
    finally:
        stop.set()
        thread.join(60)
    assert not thread.is_alive() and not errors, errors
    with pg_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(t)).scalar() == KEYS
    t.drop(pg_engine)
    es.indices.delete(index=index)


def test_librdkafka_s_prefetch_share_of_the_bound_is_spread_over_the_partitions(
    kafka: KafkaConfig, kafka_conf: dict[str, Any], pg: RdsConnection, unique: str
) -> None:
    """queued.max.messages.kbytes holds per partition: an eighth of the bound, divided by every partition,
    taken from the bound of the service's own buffers."""
    wide, narrow, later = f"updates.wide.{unique}", f"updates.narrow.{unique}", f"updates.later.{unique}"
    create_topic(kafka_conf, wide, 8)
    create_topic(kafka_conf, narrow, 1)
    bound = 64 * 1024 * 1024

    def opened(topics: list[str]) -> SyncService:
        p = pipeline(kafka, {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
                     [{"name": f"prefetch-{unique}", "dead_letter_topic": f"dlq.{unique}", "buffer_max_bytes": bound,
                       "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": topics,
                                  "table": f"prefetch_{unique}", "key": ["id"], "create_table": True}]}])
        service = SyncService(p.kafka, p.sync[0], dict(p.connections))
        service.open()
        service._shutdown()  # what run() does on its way out: sinks closed, consumer closed
        return service

    # 8 + 1 partitions, and a topic not created yet counts one
    wide_open = opened([wide, narrow, later])
    assert bound // PREFETCH_SHARE // 10 // 1024 == 819
    assert wide_open.queued_kbytes == 1024  # at least 1 MB a partition: over the share
    assert wide_open.buffer_bytes == bound - bound // PREFETCH_SHARE
    narrow_open = opened([narrow])
    assert narrow_open.queued_kbytes == bound // PREFETCH_SHARE // 1024 == 8192
    assert narrow_open.buffer_bytes == bound - 8192 * 1024
