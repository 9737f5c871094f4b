"""Kill -9 a running binlog ``mode: cdc`` source (MariaDB) several times during a load of mixed operations.

The source runs with ``exactly_once: true`` (records and position in one Kafka transaction): a
``read_committed`` reader of the topic sees every change exactly once, the latest value per key equals the
table and every deleted row ends in a tombstone. Kept short for the suite (3 kills over 3,000 operations);
``THREES_BINLOG_KILLS`` and ``THREES_BINLOG_OPS`` raise it (``make drills``: 5 kills over 20,000 operations).
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
from sqlalchemy import bindparam, text

from connectors.runtime.offsets import OffsetStore
from connectors.runtime.position_commits import TRANSACTION_TIMEOUT_MS
from tests.conftest import ROOT
from tests.integration.sources.rds import write_source_run_config
from tests.integration.sources.test_rds_cdc import changes

KILLS = int(os.environ.get("THREES_BINLOG_KILLS", "3"))
OPERATIONS = int(os.environ.get("THREES_BINLOG_OPS", "3000"))


@pytest.fixture
def names(mysql_engine: Any, unique: str) -> Iterator[tuple[str, str, str]]:
    """Table, connector and topic names; the table is dropped after."""
    yield f"bkill_{unique}", f"bkill-{unique}", f"state.bkill.{unique}"
    with mysql_engine.begin() as c:
        c.execute(text(f"DROP TABLE IF EXISTS bkill_{unique}"))


class Load:
    """Small transactions of inserts, updates (v + 1) and deletes with known ids, until ``operations`` ran."""

    def __init__(self, engine: Any, table: str, operations: int, first_id: int):
        self.engine, self.table, self.operations = engine, table, operations
        self.live = list(range(1, first_id))
        self.next_id = first_id
        self.deleted: set[int] = set()
        self.done = 0
        self.transactions = 0
        self.stop = threading.Event()

    def run(self) -> None:
        rng = random.Random(7)
        t = self.table
        while self.done < self.operations and not self.stop.is_set():
            with self.engine.begin() as c:
                new = list(range(self.next_id, self.next_id + 5))
                c.execute(
                    text(f"INSERT INTO {t} (id, v, payload) VALUES (:id, 0, MD5(RAND()))"), [{"id": i} for i in new]
                )
                self.next_id += 5
                touched = rng.sample(self.live, 3)
                c.execute(
                    text(f"UPDATE {t} SET v = v + 1 WHERE id IN :ids").bindparams(bindparam("ids", expanding=True)),
                    {"ids": touched},
                )
                ops = 5 + 3
                gone = None
                if rng.random() < 0.5:
                    gone = rng.choice(self.live)
                    c.execute(text(f"DELETE FROM {t} WHERE id = :id"), {"id": gone})
                    ops += 1
            self.live.extend(new)
            if gone is not None:
                self.live.remove(gone)
                self.deleted.add(gone)
            self.done += ops
            self.transactions += 1
            time.sleep(0.01)


def test_kill9_during_a_change_load_loses_and_duplicates_nothing(
    tmp_path: Any, mysql_engine: Any, mysql: Any, kafka: Any, kafka_conf: Any, names: tuple[str, str, str]
) -> None:
    table, name, topic = names
    with mysql_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v int NOT NULL, payload varchar(40))"))
        c.execute(text(f"INSERT INTO {table} VALUES " + ",".join(f"({i}, 0, MD5({i}))" for i in range(1, 501))))
    cfg, env = write_source_run_config(
        tmp_path,
        kafka,
        mysql,
        name,
        topic,
        table,
        "    mode: cdc\n    exactly_once: true\n    batch_records: 500\n    topic_spec:\n      partitions: 1\n",
    )
    cmd = [sys.executable, "-m", "threes.cli", "source", "run", str(cfg)]
    load = Load(mysql_engine, table, OPERATIONS, 501)
    loader = threading.Thread(target=load.run, daemon=True)
    store = OffsetStore(kafka_conf, timeout_s=TRANSACTION_TIMEOUT_MS / 1000 + 15)
    rng = random.Random(4)
    moved = 0
    try:
        for i in range(KILLS):
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                # a read_committed read of the positions waits behind the transaction the last kill left
                # open, until the new process's init_transactions (same transactional.id) aborts it
                before = store.load(name)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and (
                    store.load(name) == before or (i == 0 and store.load(name)["snapshot"] is not None)
                ):
                    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
                    time.sleep(0.2)
                moved += store.load(name) != before
                if i == 0:  # the snapshot is stored: from here on every change must reach the topic
                    loader.start()
                # spread the kills over the load
                time.sleep(rng.uniform(0.5, 1.5) * max(1.0, OPERATIONS / 3000 * 2 / KILLS))
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
    finally:
        loader.join(600)
        load.stop.set()
    assert moved == KILLS  # every kill hit a process that had made progress
    assert load.done >= OPERATIONS

    done = subprocess.run([*cmd, "--once"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    with mysql_engine.connect() as c:
        rows = dict(c.execute(text(f"SELECT id, v FROM {table}")).all())
    committed = changes(kafka_conf, topic, isolation="read_committed")
    latest: dict[int, Any] = {}
    for _p, key, value, _version in committed:
        latest[key] = value
    assert {k: v["v"] for k, v in latest.items() if v is not None} == rows
    assert set(latest) == set(range(1, load.next_id))  # every id reached the topic
    assert load.deleted and all(latest[k] is None for k in load.deleted)  # every delete: a tombstone
    seen = Counter((key, version, None if value is None else value["v"]) for _p, key, value, version in committed)
    duplicates = {k: n for k, n in seen.items() if n > 1}
    assert not duplicates, list(duplicates.items())[:10]
    versions = [version for *_rest, version in committed]
    assert versions == sorted(versions)  # commit order (one partition)
    print(
        f"binlog cdc kill9: kills={KILLS} operations={load.done} transactions={load.transactions} "
        f"records={len(committed)}"
    )
