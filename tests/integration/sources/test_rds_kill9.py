"""Kill -9 a running RdsSource during a load (4 times in ``make test``, 10 in ``make drills``).

Every row reaches the topic at least once. Sized by ``THREES_KILL9_ROWS``
(default 100,000, the issue's size) and ``THREES_KILL9_KILLS`` (default 4;
``make drills``: the issue's 10). Reconciliation is off, so the test proves
the poller and the offsets handling alone lose nothing: a missing row could not
be repaired behind the test's back.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, TopicPartition
from sqlalchemy import text

from connectors.runtime.offsets import OffsetStore
from kernel.kafka.topics import end_offsets
from schemas.serde import AvroDeserializer
from schemas.store import SchemaStore
from tests.conftest import ROOT
from tests.integration.sources.rds import write_source_run_config

ROWS = int(os.environ.get("THREES_KILL9_ROWS", "100000"))
KILLS = int(os.environ.get("THREES_KILL9_KILLS", "4"))
CHUNK = 2_000


def _all_keys(kafka_conf: dict[str, Any], topic: str) -> list[int]:
    """Every key ever written to ``topic`` (not only the latest per key), decoded."""
    ends = end_offsets(kafka_conf, topic)
    consumer = Consumer({**kafka_conf, "group.id": f"kill9-{uuid.uuid4().hex}", "enable.auto.commit": False})
    de = AvroDeserializer(SchemaStore(kafka_conf))
    keys: list[int] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
        pending = {p for p, end in ends.items() if end > 0}
        while pending:
            for msg in consumer.consume(10_000, timeout=1.0):
                assert msg.error() is None, msg.error()
                keys.append(de(msg.key())["id"])
                if msg.offset() + 1 >= ends[msg.partition()]:
                    pending.discard(msg.partition())
    finally:
        consumer.close()
    return keys


def test_kill9_during_load_loses_no_row(tmp_path: Any, pg_engine: Any, pg: Any, kafka: Any, kafka_conf: Any,
                                        unique: str) -> None:
    table = f"kill_{unique}"
    name = f"kill-{unique}"
    topic = f"state.{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, payload text NOT NULL, "
                       "updated_at timestamptz NOT NULL DEFAULT now())"))
        c.execute(text(f"CREATE INDEX ON {table} (updated_at, id)"))
    cfg, env = write_source_run_config(
        tmp_path, kafka, pg, name, topic, table,
        f"    mode: timestamp+incrementing\n    timestamp_column: updated_at\n"
        f"    incrementing_column: id\n    commit_delay_s: 0\n    poll_interval_s: 0.2\n"
        f"    batch_records: {CHUNK}\n    reconcile_interval_s: null\n",
    )
    cmd = [sys.executable, "-m", "threes.cli", "source", "run", str(cfg)]

    def insert(n: int) -> None:
        # one transaction per chunk: all its rows share now(), and commit while the source reads
        with pg_engine.begin() as c:
            c.execute(text(f"INSERT INTO {table} (payload) SELECT md5(g::text) FROM generate_series(1, :n) g"),
                      {"n": n})

    store = OffsetStore(kafka_conf)
    positions: list[Any] = []
    rng = random.Random(4)
    per_kill = -(-ROWS // KILLS)
    loaded = 0
    for _ in range(KILLS):
        before = store.load(name)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            # this cycle's share of the load, written while the source runs
            share = min(per_kill, ROWS - loaded)
            for start in range(0, share, CHUNK):
                insert(min(CHUNK, share - start))
            loaded += share
            # kill only a working process: once it stored a newer position, at a random moment soon after
            deadline = time.monotonic() + 120
            while store.load(name) == before and time.monotonic() < deadline:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                time.sleep(0.2)
            time.sleep(rng.uniform(0.0, 0.8))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        positions.append(store.load(name))
    assert loaded == ROWS

    # a last run catches up with everything committed
    done = subprocess.run([*cmd, "--once"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    keys = _all_keys(kafka_conf, topic)
    missing = set(range(1, ROWS + 1)) - set(keys)
    assert not missing, f"{len(missing)} rows never reached the topic, e.g. {sorted(missing)[:10]}"
    # every kill hit a process that had made progress since its start
    moved = sum(1 for a, b in zip([None, *positions], positions, strict=False) if a != b)
    assert moved == KILLS, positions
    print(f"kill9: rows={ROWS} kills={KILLS} records={len(keys)} duplicates={len(keys) - ROWS} "
          f"position_moves={moved}")
