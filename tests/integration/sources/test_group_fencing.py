"""Zombie fencing in ``--group`` mode: a worker paused past its session timeout writes no stale value.

Worker A runs the only task while every row of a table keeps being updated
(``v`` grows by one per update, so it is the row's version). A is frozen with
SIGSTOP in the middle of that work, holding a page of rows it read; after the
session timeout worker B owns the task and writes newer versions. A is then
woken up (SIGCONT) and tries to send its page and store its position. Its
producer was fenced by B's (same ``transactional.id``): nothing A writes after
B took over may reach a ``read_committed`` reader, so every key's versions
never go backwards in the topic, and neither does the task's stored position.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from connectors.rds import connection as rds_connection
from connectors.rds.connection import RdsConnection
from connectors.runtime.offsets import OFFSETS_TOPIC
from kernel.kafka.committed import high_watermarks, read_committed
from schemas.serde import AvroDeserializer
from schemas.store import SchemaStore
from tests.conftest import ROOT, sql_engine
from tests.integration.sources.rds import write_source_run_config
from tests.integration.sources.test_distributed import _assigned, _wait

ROWS = 400
FENCING_DB = "threes_fencing"


@pytest.fixture(scope="module")
def fence_db(pg: RdsConnection) -> Iterator[tuple[RdsConnection, Any]]:
    """A database of this test alone: RdsSource's commit-safe bound waits for every open transaction of its
    database, and other suites hold long ones in theirs on purpose."""
    admin = rds_connection.sql_engine(pg, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            if not c.execute(text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": FENCING_DB}).first():
                c.execute(text(f'CREATE DATABASE "{FENCING_DB}"'))
    finally:
        admin.dispose()
    conn = RdsConnection(type="rds", url=make_url(pg.url).set(database=FENCING_DB).render_as_string(
        hide_password=False), password=pg.password)
    yield from ((conn, engine) for engine in sql_engine(conn))


def committed_versions(kafka_conf: dict[str, Any], topic: str) -> list[tuple[int, int | None]]:
    """``(id, v)`` of every committed record of ``topic`` in offset order (``v`` None for a tombstone)."""
    de = AvroDeserializer(SchemaStore(kafka_conf))
    out: list[tuple[int, int | None]] = []
    for msgs in read_committed(kafka_conf, topic, high_watermarks(kafka_conf, topic)):
        for m in msgs:
            out.append((de(m.key())["id"], de(m.value())["v"] if m.value() is not None else None))
    return out


def stored_positions(kafka_conf: dict[str, Any], key: str) -> list[tuple[str, int]]:
    """The committed positions of offsets key ``key`` in write order, as ``(timestamp, id)``."""
    out: list[tuple[str, int]] = []
    for msgs in read_committed(kafka_conf, OFFSETS_TOPIC, high_watermarks(kafka_conf, OFFSETS_TOPIC)):
        for m in msgs:
            if m.key() == key.encode() and m.value() is not None:
                ts, last_id = json.loads(m.value())["position"]["after"]
                out.append((ts["$datetime"] if isinstance(ts, dict) else ts, last_id))
    return out


def test_paused_worker_past_session_timeout_writes_no_stale_value(tmp_path: Any, fence_db: Any, kafka: Any,
                                                                   kafka_conf: Any, unique: str) -> None:
    pg, pg_engine = fence_db
    table = f"fence_{unique}"
    name = f"fence-{unique}"
    topic = f"state.fence.{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id int PRIMARY KEY, v bigint NOT NULL, "
                       "updated_at timestamptz NOT NULL DEFAULT clock_timestamp())"))
        c.execute(text(f"INSERT INTO {table} (id, v) SELECT g, 0 FROM generate_series(1, {ROWS}) g"))
    cfg, env = write_source_run_config(
        tmp_path, kafka, pg, name, topic, table,
        "    mode: timestamp+incrementing\n    timestamp_column: updated_at\n"
        "    incrementing_column: id\n    commit_delay_s: 0\n    poll_interval_s: 0.05\n"
        "    batch_records: 50\n    reconcile_interval_s: null\n",
    )
    cmd = [sys.executable, "-m", "threes.cli", "-v", "source", "run", str(cfg), "--group", f"g{unique}"]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]

    updating = threading.Event()
    updating.set()
    tick = [0]

    def update() -> None:
        # a fifth of the rows gets a new version every tick: the task never runs out of work
        while updating.is_set():
            with pg_engine.begin() as c:
                c.execute(text(f"UPDATE {table} SET v = v + 1, updated_at = clock_timestamp() "
                               f"WHERE id % 5 = :r"), {"r": tick[0] % 5})
            tick[0] += 1
            time.sleep(0.02)

    updater = threading.Thread(target=update, daemon=True)
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=logs[0].open("w")))
        _wait(lambda: _assigned(logs[0]) == [name], "the first worker to run the task")
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=logs[1].open("w")))
        _wait(lambda: sorted([_assigned(logs[0]) or [], _assigned(logs[1]) or []]) == [[], [name]]
              and _assigned(logs[1]) is not None, "the second worker to join (one runs the task, one idles)")
        a, b = (0, 1) if _assigned(logs[0]) == [name] else (1, 0)
        updater.start()
        _wait(lambda: sum(high_watermarks(kafka_conf, topic).values()) > 3 * ROWS, "A to copy updates")

        procs[a].send_signal(signal.SIGSTOP)  # A freezes mid-work, a page in hand
        _wait(lambda: _assigned(logs[b]) == [name], "worker B to take the task over", timeout_s=90)
        b_started = sum(high_watermarks(kafka_conf, topic).values())
        _wait(lambda: sum(high_watermarks(kafka_conf, topic).values()) > b_started + 2 * ROWS,
              "B to write newer versions")
        a_before = logs[a].read_text(errors="replace").count("revoked tasks=")
        procs[a].send_signal(signal.SIGCONT)  # the zombie wakes up and tries to send its page
        _wait(lambda: logs[a].read_text(errors="replace").count("revoked tasks=") > a_before,
              "A to learn it lost the task", timeout_s=60)
        time.sleep(2.0)
        updating.clear()
        updater.join(30)

        with pg_engine.connect() as c:
            expected = {i: v for i, v in c.execute(text(f"SELECT id, v FROM {table}"))}

        def caught_up() -> bool:
            latest: dict[int, int | None] = {}
            for k, v in committed_versions(kafka_conf, topic):
                latest[k] = v
            return latest == expected

        _wait(caught_up, "B to copy the last versions (topic = table, key by key)")
    finally:
        updating.clear()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(30)

    seen: dict[int, int] = {}
    stale: list[tuple[int, int, int]] = []
    for k, v in committed_versions(kafka_conf, topic):
        assert v is not None
        if v < seen.get(k, -1):
            stale.append((k, seen[k], v))
        seen[k] = max(v, seen.get(k, -1))
    assert not stale, f"{len(stale)} stale values written after newer ones (key, newest, stale): {stale[:10]}"
    positions = stored_positions(kafka_conf, name)
    regressed = [(a, b) for a, b in zip(positions, positions[1:], strict=False) if b < a]
    assert not regressed, f"stored position went back {len(regressed)} time(s): {regressed[:5]}"
    print(f"fencing: positions={len(positions)} records={len(seen)} keys, A's log:\n" + "\n".join(
        line for line in logs[a].read_text(errors="replace").splitlines() if "fenced" in line or "revoked" in line))
