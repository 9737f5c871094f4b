"""Kafka with three brokers: kill -9 the leader of the busiest partition, then restart it, under load.

A session fixture starts a dedicated three-broker KRaft cluster (what ``threes local up --brokers 3``
runs, in a tmp folder on ports from ``THREES_FAILOVER_KAFKA_PORT``, 29092 by default) and stops it
after. The topics the project creates there get three replicas and ``min.insync.replicas=2``
(:func:`schemas.kafka_admin.replication_settings`), so losing one broker loses no acknowledged
write. For each scenario the leader of the busiest partition is killed with SIGKILL mid-load and
restarted ``THREES_FAILOVER_DOWN_S`` (5) seconds later; the end state must equal the expected one,
with no record lost and none duplicated beyond the documented at-least-once stages (the sinks'
writes, made idempotent by the record version). The stall each failover caused (from the kill to
the first progress of each client on that partition) is printed as a ``[failover]`` line, not asserted.

Short by default (``make test``); ``make drills`` sets the full sizes: ``THREES_FAILOVER_UPDATES``
(sync service updates), ``THREES_FAILOVER_ROWS`` (exactly-once snapshot rows),
``THREES_FAILOVER_LOAD_S`` (seconds the loads last).

The micro-batch stream job runs inside ``threes run`` of the shop (``tests/e2e/test_first_pipeline.py``).
The stream job in real-time mode (``stream.mode: realtime``) is drilled in ``test_leader_failover_realtime.py``,
on the same cluster (the ``brokers`` fixture of ``conftest.py``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from elasticsearch import helpers
from sqlalchemy import MetaData, Table, select, text

from connectors.elasticsearch.connection import ElasticsearchConnection
from connectors.rds.connection import RdsConnection
from connectors.runtime.offsets import OffsetStore
from connectors.runtime.position_commits import TRANSACTION_TIMEOUT_MS
from connectors.s3.connection import S3Connection
from kernel.kafka.committed import high_watermarks
from kernel.kafka.topics import cluster_metadata, create_topic, ensure_compacted_topic, topic_configs
from tests.conftest import ROOT
from tests.e2e import test_first_pipeline as first
from tests.e2e.test_kafka_restart import _replay, _write_orders
from tests.integration.ops.brokers import BrokerCluster, measure_stalls
from tests.integration.sources.rds import write_source_run_config
from tests.integration.sources.test_exactly_once import committed_keys
from tests.integration.sources.test_rds_cdc import changes, drop_slot
from tests.integration.sync.helpers import UpdateProducer, group_lag, wait_until
from tests.integration.sync.test_s3_sink import list_keys, s3_state

pytestmark = [pytest.mark.serial, pytest.mark.integration]

UPDATES = int(os.environ.get("THREES_FAILOVER_UPDATES", "6000"))  # make drills: 60000
ROWS = int(os.environ.get("THREES_FAILOVER_ROWS", "20000"))  # make drills: 200000
LOAD_S = float(os.environ.get("THREES_FAILOVER_LOAD_S", "20"))  # make drills: 60
KEYS = 500


@pytest.fixture(autouse=True)
def _every_broker_back(brokers: BrokerCluster) -> Iterator[None]:
    """After each scenario all three brokers run again, whatever failed (the next one starts from a whole cluster)."""
    yield
    brokers.up()


def _replication(conf: dict[str, Any], topic: str) -> tuple[set[int], str]:
    deadline = time.monotonic() + 30
    while (meta := cluster_metadata(conf).topics.get(topic)) is None:  # a new topic's metadata spreads to every broker
        assert time.monotonic() < deadline, f"topic {topic} not in the metadata 30 s after its creation"
        time.sleep(0.2)
    return {len(p.replicas) for p in meta.partitions.values()}, topic_configs(conf, topic)["min.insync.replicas"]


def test_topics_get_three_replicas_and_two_in_sync(brokers: BrokerCluster, unique: str) -> None:
    conf = brokers.conf
    assert len(cluster_metadata(conf).brokers) == 3
    assert ensure_compacted_topic(conf, f"state.rf.{unique}", partitions=2)
    assert create_topic(conf, f"dlq.rf.{unique}") == (3, 2)
    assert _replication(conf, f"state.rf.{unique}") == ({3}, "2")
    assert _replication(conf, f"dlq.rf.{unique}") == ({3}, "2")
    # an explicit kafka.internal_replication_factor still wins (min.insync.replicas follows it: 1 of 2)
    assert create_topic(conf, f"two.rf.{unique}", replication_factor=2) == (2, 1)
    assert _replication(conf, f"two.rf.{unique}") == ({2}, "1")
    OffsetStore(conf).load("nobody")  # the offsets topic, created on first use
    assert _replication(conf, "_threes_offsets") == ({3}, "2")
    # the brokers' own topics
    assert _replication(conf, "__consumer_offsets")[0] == {3}


def _sync_config(brokers: BrokerCluster, topic: str, unique: str, pg: RdsConnection, es_conn: ElasticsearchConnection,
                 s3_conn: S3Connection) -> dict[str, Any]:
    """Three sync services (one per sink), as ``tests/integration/sync/test_kill9.py`` runs them."""
    common = {"dead_letter_topic": f"dlq.{unique}", "session_timeout_ms": 6_000, "max_poll_interval_ms": 30_000,
              "batch": {"max_records": 500, "max_age_ms": 200}}
    return {
        "kafka": {"bootstrap_servers": brokers.kafka.bootstrap_servers},
        "connections": {
            "pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()},
            "es": {"type": "elasticsearch", "hosts": es_conn.hosts},
            "s3": {"type": "s3", "endpoint_url": s3_conn.endpoint_url, "region": s3_conn.region,
                   "access_key_id": s3_conn.access_key_id,
                   "secret_access_key": s3_conn.secret_access_key.get_secret_value(), "path_style": True},
        },
        "sync": [
            {"name": f"db-{unique}", **common, "sinks": [
                {"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic], "table": f"fo_{unique}",
                 "key": ["id"], "create_table": True}]},
            {"name": f"search-{unique}", **common, "sinks": [
                {"name": "search", "type": "elasticsearch_sink", "connection": "es", "topics": [topic],
                 "index": f"fo-{unique}"}]},
            {"name": f"lake-{unique}", **common, "sinks": [
                {"name": "lake", "type": "s3_sink", "connection": "s3", "topics": [topic], "bucket": f"fo-{unique}",
                 "format": "jsonl", "rotate_records": 1_000, "rotate_interval_s": 1.0}]},
        ],
    }


def test_sync_service_to_three_sinks_loses_nothing(
    brokers: BrokerCluster, pg: RdsConnection, pg_engine: Any, es_conn: ElasticsearchConnection, es: Any,
    s3_conn: S3Connection, s3: Any, unique: str, tmp_path: Path,
) -> None:
    topic, table, index, bucket = f"updates.fo.{unique}", f"fo_{unique}", f"fo-{unique}", f"fo-{unique}"
    conf = brokers.conf
    create_topic(conf, topic, partitions=3)
    s3.create_bucket(Bucket=bucket)
    cfg = tmp_path / "sync.yaml"
    cfg.write_text(yaml.safe_dump(_sync_config(brokers, topic, unique, pg, es_conn, s3_conn)))
    log_path = tmp_path / "sync.log"
    threes = str(Path(sys.executable).parent / "threes")
    groups = {name: f"threes-sync-{name}-{unique}" for name in ("db", "search", "lake")}

    producer = UpdateProducer(brokers.kafka, topic)
    latest: dict[int, int] = {}
    done = threading.Event()

    def produce() -> None:  # UPDATES over LOAD_S seconds, in ticks of 0.05 s
        rng = random.Random(5)
        per_tick = max(1, int(UPDATES * 0.05 / LOAD_S))
        for version in range(1, UPDATES + 1):
            key = rng.randrange(KEYS) if version > KEYS else version - 1
            producer.send(key, version)
            latest[key] = version
            if version % per_tick == 0:
                time.sleep(0.05)
        producer.flush()
        done.set()

    with log_path.open("ab") as log:
        proc = subprocess.Popen([threes, "-v", "sync", "run", str(cfg)], stdout=log, stderr=log)
    feeder = threading.Thread(target=produce, daemon=True)
    try:
        feeder.start()
        # every service has committed something: the kill lands in the middle of the load
        wait_until(lambda: all(group_lag(conf, g, topic) < UPDATES and brokers.committed(g, topic, 0) > 0
                               for g in groups.values()), 90, "every sync service to commit")
        assert not done.is_set(), "the load ended before the kill: raise THREES_FAILOVER_LOAD_S"
        probes = {"producer acks": lambda p: brokers.high_watermark(topic, p)}
        for name, group in groups.items():
            probes[f"sync {name} commits"] = lambda p, g=group: brokers.committed(g, topic, p)
        failover = brokers.kill_leader(topic, probes)
        for what in probes:  # a commit past the end at the kill: a record written after it reached the sink
            failover.baselines[what] = failover.baselines["producer acks"]
        measure_stalls(failover)
        brokers.restart(failover)
        print(failover.report("sync service -> PostgreSQL, Elasticsearch, S3"))
        feeder.join(LOAD_S * 4 + 120)
        assert done.is_set() and not producer.errors, producer.errors[:5]
        wait_until(lambda: all(group_lag(conf, g, topic) == 0 for g in groups.values()), 240, "lag 0 in every group")
        assert proc.poll() is None, log_path.read_text()[-3000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    # the topic: every update once (an idempotent producer with acks=all: a failover neither loses nor repeats)
    assert sum(high_watermarks(conf, topic).values()) == UPDATES
    assert len(latest) == KEYS
    t = Table(table, MetaData(), autoload_with=pg_engine)
    with pg_engine.connect() as conn:
        assert dict(conn.execute(select(t.c.id, t.c._version)).all()) == latest
    es.indices.refresh(index=index)
    assert {int(h["_id"]): h["_version"] for h in helpers.scan(es, index=index, version=True)} == latest
    assert {int(k): v for k, (v, _value) in s3_state(s3, bucket).items()} == latest
    assert "Traceback" not in log_path.read_text()
    t.drop(pg_engine)
    es.indices.delete(index=index)
    for key in list_keys(s3, bucket):
        s3.delete_object(Bucket=bucket, Key=key)


SNAPSHOT_CLIENT_CONFIG = {"linger.ms": 200, "queue.buffering.max.messages": 500}
"""The snapshot's producer: at most 500 records queued, each batch sent 200 ms after its first record.

The source reads only as fast as its records are acknowledged (the local queue's backpressure), so
the snapshot's writes last at least ``ROWS / 500 * 0.2`` seconds (8 s for 20,000 rows) however fast
the machine: the kill, made as soon as its first records are in the topic, lands in the middle of them.
Unthrottled, 20,000 rows were written within about 1 s of the first commit, and the kill could come
after the last transaction (seen once in seven runs): nothing was left to write, so no progress could
follow it, which this drill reported as transactional writes that did not resume (2 of about 5 runs).
"""


def test_exactly_once_snapshot_neither_loses_nor_duplicates(
    brokers: BrokerCluster,
    pg: RdsConnection,
    pg_engine: Any,
    unique: str,
    tmp_path: Path,
) -> None:
    table, name, topic = f"foeos_{unique}", f"foeos-{unique}", f"state.foeos.{unique}"
    conf = brokers.conf
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, payload text NOT NULL)"))
        c.execute(text(f"INSERT INTO {table} (payload) SELECT md5(g::text) FROM generate_series(1, :n) g"), {"n": ROWS})
    cfg, env = write_source_run_config(
        tmp_path,
        brokers.kafka,
        pg,
        name,
        topic,
        table,
        "    mode: incrementing\n    incrementing_column: id\n    batch_records: 100\n"
        "    reconcile_interval_s: null\n    exactly_once: true\n    topic_spec:\n      partitions: 3\n",
        client_config=SNAPSHOT_CLIENT_CONFIG,
    )
    log_path = tmp_path / "source.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "threes.cli", "source", "run", str(cfg), "--once"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        # the snapshot's first records are in the topic (read fast, with ListOffsets: waiting for a stored
        # position lagged by 10 s and more on a loaded machine, long enough for the snapshot to end first)
        wait_until(
            lambda: sum(brokers.high_watermark(topic, p) for p in range(3)) > 0 or proc.poll() is not None,
            120,
            "the snapshot's first records",
            interval_s=0.05,
        )
        assert proc.poll() is None, log_path.read_text()[-3000:]
        failover = brokers.kill_leader(topic, {"transactional writes": lambda p: brokers.high_watermark(topic, p)})
        # the broker comes back after THREES_FAILOVER_DOWN_S whether or not the writes resumed without it
        restart = threading.Thread(target=brokers.restart, args=(failover,), daemon=True)
        restart.start()
        measure_stalls(failover, ended=lambda: proc.poll() is not None)
        restart.join(300)
        print(failover.report(f"exactly-once snapshot of {ROWS} rows"))
        assert proc.wait(600) == 0, log_path.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    keys = committed_keys(conf, topic)
    counts = Counter(keys)
    missing = set(range(1, ROWS + 1)) - set(counts)
    duplicated = {k: n for k, n in counts.items() if n > 1}
    assert not missing, f"{len(missing)} rows never reached the topic, e.g. {sorted(missing)[:10]}"
    assert not duplicated, f"{len(duplicated)} rows written more than once, e.g. {list(duplicated.items())[:10]}"
    assert len(keys) == ROWS
    assert "Traceback" not in log_path.read_text()


@pytest.fixture
def cdc_names(pg_engine: Any, unique: str) -> Iterator[tuple[str, str, str]]:
    """Table, connector and topic names; the slot (which retains WAL) and the publication are dropped after."""
    name = f"focdc-{unique}"
    yield f"focdc_{unique}", name, f"state.focdc.{unique}"
    drop_slot(pg_engine, name)


def test_cdc_stream_neither_loses_nor_duplicates(
    brokers: BrokerCluster,
    pg: RdsConnection,
    pg_engine: Any,
    cdc_names: tuple[str, str, str],
    tmp_path: Path,
) -> None:
    table, name, topic = cdc_names
    conf = brokers.conf
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, v int NOT NULL, payload text)"))
        c.execute(text(f"INSERT INTO {table} (v, payload) SELECT 0, md5(g::text) FROM generate_series(1, 500) g"))
    cfg, env = write_source_run_config(
        tmp_path,
        brokers.kafka,
        pg,
        name,
        topic,
        table,
        "    mode: cdc\n    exactly_once: true\n    batch_records: 500\n    topic_spec:\n      partitions: 1\n",
    )
    cmd = [sys.executable, "-m", "threes.cli", "source", "run", str(cfg)]
    stop = threading.Event()

    def load() -> None:  # small transactions of inserts, updates and deletes, as test_rds_cdc_kill9 loads
        rng = random.Random(7)
        while not stop.is_set():
            with pg_engine.begin() as c:
                c.execute(
                    text(f"INSERT INTO {table} (v, payload) SELECT 0, md5(random()::text) FROM generate_series(1, 5)")
                )
                c.execute(
                    text(f"UPDATE {table} SET v = v + 1 WHERE id IN (SELECT id FROM {table} ORDER BY random() LIMIT 3)")
                )
                if rng.random() < 0.5:
                    c.execute(
                        text(f"DELETE FROM {table} WHERE id = (SELECT id FROM {table} ORDER BY random() LIMIT 1)")
                    )
            time.sleep(0.05)

    store = OffsetStore(conf, timeout_s=TRANSACTION_TIMEOUT_MS / 1000 + 15)
    loader = threading.Thread(target=load, daemon=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        # the snapshot is stored: from here on every change must reach the topic
        wait_until(
            lambda: (store.load(name) or {}).get("snapshot", "x") is None or proc.poll() is not None,
            120,
            "the snapshot to be stored",
        )
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
        loader.start()
        time.sleep(min(5.0, LOAD_S / 4))
        failover = brokers.kill_leader(topic, {"change records": lambda p: brokers.high_watermark(topic, p)})
        measure_stalls(failover)
        brokers.restart(failover)
        print(failover.report("PostgreSQL CDC stream"))
        time.sleep(min(5.0, LOAD_S / 4))
        assert proc.poll() is None, proc.stderr.read().decode()[-3000:]  # type: ignore[union-attr]
    finally:
        stop.set()
        if loader.is_alive():
            loader.join(30)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    done = subprocess.run([*cmd, "--once"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    with pg_engine.connect() as c:
        rows = dict(c.execute(text(f"SELECT id, v FROM {table}")).all())
        max_id = c.execute(text(f"SELECT last_value FROM {table}_id_seq")).scalar_one()
    committed = changes(conf, topic, isolation="read_committed")
    latest: dict[int, Any] = {}
    for _p, key, value, _version in committed:
        latest[key] = value
    assert {k: v["v"] for k, v in latest.items() if v is not None} == rows
    assert set(latest) == set(range(1, max_id + 1))  # every id reached the topic; deleted ones end in a tombstone
    seen = Counter((key, version, None if value is None else value["v"]) for _p, key, value, version in committed)
    duplicates = {k: n for k, n in seen.items() if n > 1}
    assert not duplicates, list(duplicates.items())[:10]


shop = first.shop  # the first pipeline's shop (its own topics, tables, index and bucket), for the stream job


def test_micro_batch_stream_job_enriches_and_counts_each_event_once(
    brokers: BrokerCluster,
    shop: Any,
    pg: Any,
    es_conn: Any,
    s3_conn: Any,
) -> None:
    """``threes run`` of the shop (sources, a micro-batch stream job, three sync services) on the three brokers.

    The leader of the busiest partition of the events topic is killed right after the second half of
    the orders is replayed, while the job reads it; the job must go on through the new leader and every
    sink must equal the oracle (each order enriched once, the per-category counts exact: none lost,
    none counted twice).
    """
    folder, names, data, _pipeline, env = shop
    env = {**env, "THREES_KAFKA_BOOTSTRAP": brokers.kafka.bootstrap_servers}
    env.pop("THREES_KAFKA_SASL_BOOTSTRAP", None)
    half = first.N_ORDERS // 2
    _write_orders(folder / "orders_a.csv", data["orders"][:half])
    _write_orders(folder / "orders_b.csv", data["orders"][half:])
    enriched, per_category = first.oracle(data)
    sinks = first.Sinks(names, pg, es_conn, s3_conn)
    events, updates = f"orders.{names['u']}", f"updates.orders.{names['u']}"
    process = subprocess.Popen(
        [first.THREES, "run", "pipeline.yaml", "--log-dir", "logs", "--offsets-topic", f"_threes_offsets.{names['u']}"],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    output = first.Output(process, folder / "logs")
    try:
        first.wait_for(
            "ready pipeline",
            lambda: any(line.startswith("[run] running:") for line in output.lines),
            240,
            process,
            output,
        )
        _replay(folder, names, env, "orders_a.csv")
        first.wait_for("the first half in Elasticsearch", lambda: sinks.es_count() == half, 240, process, output)
        assert _replication(brokers.conf, events) == ({3}, "2") and _replication(brokers.conf, updates) == ({3}, "2")

        # the second half is in the events topic; the job is reading it when the leader goes away
        _replay(folder, names, env, "orders_b.csv")
        failover = brokers.kill_leader(
            events,
            {
                "job's update records": lambda _p: sum(high_watermarks(brokers.conf, updates, timeout_s=2).values()),
                "Elasticsearch documents": lambda _p: sinks.es_count(),
            },
        )
        assert sinks.es_count() < first.N_ORDERS, "the job had written every order before the kill"
        measure_stalls(failover)
        first.wait_for("complete Elasticsearch index", lambda: sinks.es_count() == first.N_ORDERS, 420, process, output)
        failover.stalls["every order in Elasticsearch"] = time.monotonic() - failover.killed_at
        brokers.restart(failover)
        print(failover.report("micro-batch stream job (threes run of the shop)"))
        first.wait_for("complete sales table", lambda: sinks.sales() == per_category, 420, process, output)
        first.wait_for("complete archive", lambda: len(sinks.archive()) == first.N_ORDERS, 420, process, output)
        docs, archive = sinks.es_docs(), sinks.archive()
    finally:
        process.send_signal(signal.SIGINT)  # Ctrl-C
        returncode = process.wait(240)
    said = output.text()
    assert returncode == 0, said[-6000:]
    assert "Traceback" not in said
    fields = first.FIELDS
    assert {k: {f: d.get(f) for f in fields} for k, d in docs.items()} == {str(i): e for i, e in enriched.items()}
    assert sinks.sales() == per_category  # each order counted once, none lost
    assert {json.loads(k)["order_id"]: {f: r["value"][f] for f in fields} for k, r in archive.items()} == enriched
    # the events topic: every order once (the replay's idempotent producer rode the failover out)
    assert sum(high_watermarks(brokers.conf, events).values()) == first.N_ORDERS
