"""Exactly once into Kafka (KIP-618): kill -9 a source with ``exactly_once: true`` during a load.

Every row must reach the state topic exactly once for a ``read_committed``
reader: records and the position covering them are committed in one
transaction, so a kill before the commit loses both (the restart reads the
rows again) and a kill after it loses neither. Without transactions the
position trails the records by up to a flush interval and a kill duplicates
the rows between them.

The source runs in ``incrementing`` mode, which emits each row once: any key
seen twice is a duplicate made by a crash. Reconciliation is off (it would
re-send rows behind the test's back).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

from sqlalchemy import text

from connectors.runtime.offsets import OffsetStore
from kernel.kafka.committed import high_watermarks, read_committed
from schemas.serde import AvroDeserializer
from schemas.store import SchemaStore
from tests.conftest import ROOT
from tests.integration.sources.rds import write_source_run_config

ROWS = 30_000
KILLS = int(os.environ.get("THREES_EOS_KILLS", "5"))  # make drills: 10
CHUNK = 200


def committed_keys(kafka_conf: dict[str, Any], topic: str, field: str = "id") -> list[Any]:
    """Every committed record's key field, in offset order (not only the latest per key)."""
    de = AvroDeserializer(SchemaStore(kafka_conf))
    keys: list[Any] = []
    for msgs in read_committed(kafka_conf, topic, high_watermarks(kafka_conf, topic)):
        keys.extend(de(m.key())[field] for m in msgs)
    return keys


def test_kill9_with_exactly_once_neither_loses_nor_duplicates(tmp_path: Any, pg_engine: Any, pg: Any, kafka: Any,
                                                              kafka_conf: Any, unique: str) -> None:
    table = f"eos_{unique}"
    name = f"eos-{unique}"
    topic = f"state.eos.{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, payload text NOT NULL)"))
    cfg, env = write_source_run_config(
        tmp_path, kafka, pg, name, topic, table,
        f"    mode: incrementing\n    incrementing_column: id\n"
        f"    poll_interval_s: 0.1\n    batch_records: {CHUNK}\n    reconcile_interval_s: null\n"
        f"    exactly_once: true\n",
    )
    cmd = [sys.executable, "-m", "threes.cli", "source", "run", str(cfg)]

    def insert(n: int) -> None:
        with pg_engine.begin() as c:
            c.execute(text(f"INSERT INTO {table} (payload) SELECT md5(g::text) FROM generate_series(1, :n) g"),
                      {"n": n})

    store = OffsetStore(kafka_conf)
    rng = random.Random(13)
    loading = threading.Event()
    loaded = [0]
    quota = [0]

    def load() -> None:
        # a load that keeps coming while the source copies it and is killed: each run's share, CHUNK rows a tick
        while loaded[0] < ROWS:
            loading.wait()
            if loaded[0] >= quota[0]:
                time.sleep(0.05)
                continue
            insert(CHUNK)
            loaded[0] += CHUNK
            time.sleep(0.1)

    loader = threading.Thread(target=load, daemon=True)
    progressed = 0
    for i in range(KILLS):
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            # a read_committed read of the positions waits behind a transaction the last kill left open,
            # until the new process's init_transactions (same transactional.id) aborts it
            before = store.load(name)
            quota[0] += ROWS // KILLS
            loading.set()
            if i == 0:
                loader.start()
            # kill a working process: once it committed a newer position, at a random moment soon after
            deadline = time.monotonic() + 120
            while store.load(name) == before and time.monotonic() < deadline:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                time.sleep(0.1)
            progressed += store.load(name) != before
            time.sleep(rng.uniform(0.2, 1.0))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
            loading.clear()
    assert progressed == KILLS  # every kill hit a process that had committed since its start
    loading.set()
    loader.join(120)
    assert loaded[0] == ROWS

    done = subprocess.run([*cmd, "--once"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    keys = committed_keys(kafka_conf, topic)
    counts = Counter(keys)
    missing = set(range(1, ROWS + 1)) - set(counts)
    duplicated = {k: n for k, n in counts.items() if n > 1}
    assert not missing, f"{len(missing)} rows never reached the topic, e.g. {sorted(missing)[:10]}"
    assert not duplicated, f"{len(duplicated)} rows written more than once, e.g. {list(duplicated.items())[:10]}"
    assert len(keys) == ROWS
