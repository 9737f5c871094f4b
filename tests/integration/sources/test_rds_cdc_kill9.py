"""Kill -9 a running ``mode: cdc`` source 5 times during a load of inserts, updates and deletes.

The source runs with ``exactly_once: true`` (records and position in one Kafka
transaction): a ``read_committed`` reader of the topic sees every change exactly
once, and the topic's latest value per key equals the table. Kept short (a few
seconds per kill) for the suite's time budget; ``THREES_CDC_KILLS`` raises it.
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
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text

from connectors.runtime.offsets import OffsetStore
from connectors.runtime.position_commits import TRANSACTION_TIMEOUT_MS
from tests.conftest import ROOT
from tests.integration.sources.rds import write_source_run_config
from tests.integration.sources.test_rds_cdc import changes, drop_slot

KILLS = int(os.environ.get("THREES_CDC_KILLS", "5"))


@pytest.fixture
def names(pg_engine: Any, unique: str) -> Iterator[tuple[str, str, str]]:
    """Table, connector and topic names; the slot (which retains WAL) and the publication are dropped after."""
    name = f"cdckill-{unique}"
    yield f"cdckill_{unique}", name, f"state.cdckill.{unique}"
    drop_slot(pg_engine, name)


def test_kill9_during_a_change_load_loses_and_duplicates_nothing(
    tmp_path: Any, pg_engine: Any, pg: Any, kafka: Any, kafka_conf: Any, names: tuple[str, str, str]
) -> None:
    table, name, topic = names
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id bigserial PRIMARY KEY, v int NOT NULL, payload text)"))
        c.execute(text(f"INSERT INTO {table} (v, payload) SELECT 0, md5(g::text) FROM generate_series(1, 500) g"))
    cfg, env = write_source_run_config(
        tmp_path, kafka, pg, name, topic, table,
        "    mode: cdc\n    exactly_once: true\n    batch_records: 500\n"
        "    topic_spec:\n      partitions: 1\n",
    )
    cmd = [sys.executable, "-m", "threes.cli", "source", "run", str(cfg)]
    stop = threading.Event()
    transactions = Counter()

    def load() -> None:
        # small transactions of inserts, updates (v + 1) and deletes, until stopped
        rng = random.Random(7)
        while not stop.is_set():
            with pg_engine.begin() as c:
                c.execute(text(f"INSERT INTO {table} (v, payload) SELECT 0, md5(random()::text) "
                               "FROM generate_series(1, 5)"))
                c.execute(text(f"UPDATE {table} SET v = v + 1 WHERE id IN (SELECT id FROM {table} "
                               "ORDER BY random() LIMIT 3)"))
                if rng.random() < 0.5:
                    c.execute(text(f"DELETE FROM {table} WHERE id = (SELECT id FROM {table} "
                                   "ORDER BY random() LIMIT 1)"))
            transactions["committed"] += 1
            time.sleep(0.05)

    store = OffsetStore(kafka_conf, timeout_s=TRANSACTION_TIMEOUT_MS / 1000 + 15)
    rng = random.Random(4)
    loader = threading.Thread(target=load, daemon=True)
    moved = 0
    try:
        for i in range(KILLS):
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                # a read_committed read of the positions waits behind the transaction the last kill left
                # open, until the new process's init_transactions (same transactional.id) aborts it
                before = store.load(name)
                deadline = time.monotonic() + 60
                started = time.monotonic()
                while time.monotonic() < deadline and (
                    store.load(name) == before or (i == 0 and store.load(name)["snapshot"] is not None)
                ):
                    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                    time.sleep(0.2)
                moved += store.load(name) != before
                if i == 0:  # the snapshot is stored: from here on every change must reach the topic
                    loader.start()
                print(f"kill {i}: position moved after {time.monotonic() - started:.1f} s")
                time.sleep(rng.uniform(0.0, 1.0))
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
    finally:
        stop.set()
        if loader.is_alive():
            loader.join(30)
    assert moved == KILLS  # every kill hit a process that had made progress

    done = subprocess.run([*cmd, "--once"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    with pg_engine.connect() as c:
        rows = dict(c.execute(text(f"SELECT id, v FROM {table}")).all())
        max_id = c.execute(text(f"SELECT last_value FROM {table}_id_seq")).scalar_one()
    committed = changes(kafka_conf, topic, isolation="read_committed")
    latest: dict[int, Any] = {}
    for _p, key, value, _version in committed:
        latest[key] = value
    assert {k: v["v"] for k, v in latest.items() if v is not None} == rows
    # every id reached the topic (the snapshot's, the load's), deleted ones end in a tombstone
    assert set(latest) == set(range(1, max_id + 1))
    # exactly once for a read_committed reader: no change appears twice
    seen = Counter((key, version, None if value is None else value["v"]) for _p, key, value, version in committed)
    duplicates = {k: n for k, n in seen.items() if n > 1}
    assert not duplicates, list(duplicates.items())[:10]
    versions = [version for *_rest, version in committed]
    assert versions == sorted(versions)  # commit order (one partition)
    print(f"cdc kill9: kills={KILLS} transactions={transactions['committed']} records={len(committed)}")
