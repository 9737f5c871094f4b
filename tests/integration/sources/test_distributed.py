"""Two worker processes share the tasks of one config through Kafka's consumer group protocol.

The topics must end up holding every row of the tables, keys and values, not
just as many records: a task that moved between workers must neither skip nor
mangle rows.
"""

from __future__ import annotations

import ast
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import text

from kernel.kafka.committed import latest_per_key
from kernel.kafka.topics import end_offsets
from schemas.serde import AvroDeserializer
from schemas.store import SchemaStore
from tests.conftest import ROOT

_ASSIGNED = re.compile(r"group=\S+ assigned tasks=(\[.*?\])")


def _assigned(log: Path) -> list[str] | None:
    """The last set of tasks a worker said it was assigned (None before the first assignment)."""
    found = _ASSIGNED.findall(log.read_text(errors="replace")) if log.exists() else []
    return ast.literal_eval(found[-1]) if found else None


def _wait(cond: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_workers_share_and_take_over_tasks(tmp_path: Path, pg_engine: Any, pg: Any, kafka: Any,
                                               kafka_conf: Any, unique: str) -> None:
    names = [f"a-{unique}", f"b-{unique}"]
    tables = [f"dist_a_{unique}", f"dist_b_{unique}"]
    topics = [f"state.a.{unique}", f"state.b.{unique}"]
    with pg_engine.begin() as c:
        for t in tables:
            c.execute(text(f"CREATE TABLE {t} (id serial PRIMARY KEY, v text)"))
            c.execute(text(f"INSERT INTO {t} (v) SELECT md5(random()::text) FROM generate_series(1, 10)"))
    sources = "".join(
        f"  - name: {n}\n    type: rds_source\n    connection: pg\n    topic: {tp}\n    table: {t}\n"
        f"    mode: incrementing\n    incrementing_column: id\n    poll_interval_s: 0.3\n"
        for n, t, tp in zip(names, tables, topics, strict=True)
    )
    cfg = tmp_path / "pipeline.yaml"
    cfg.write_text(f"kafka:\n  bootstrap_servers: {kafka.bootstrap_servers}\nconnections:\n  pg:\n    type: rds\n"
                   f"    url: {pg.url}\n    password: ${{env:THREES_PGPASS}}\nsources:\n{sources}")
    env = {"THREES_PGPASS": pg.password.get_secret_value(), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "threes.cli", "-v", "source", "run", str(cfg), "--group", f"g{unique}"]
    logs = [tmp_path / "a.log", tmp_path / "b.log"]

    def rows_in(i: int) -> int:
        return sum(end_offsets(kafka_conf, topics[i]).values()) if _exists(kafka_conf, topics[i]) else 0

    def insert(n: int) -> None:
        with pg_engine.begin() as c:
            for t in tables:
                c.execute(text(f"INSERT INTO {t} (v) SELECT md5(random()::text) FROM generate_series(1, :n)"),
                          {"n": n})

    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                      stderr=logs[0].open("w")))
        _wait(lambda: _assigned(logs[0]) == sorted(names), "worker A to run both tasks")
        _wait(lambda: rows_in(0) >= 10 and rows_in(1) >= 10, "both tables in their topics")

        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                      stderr=logs[1].open("w")))
        _wait(lambda: _assigned(logs[1]) is not None and len(_assigned(logs[1])) == 1
              and len(_assigned(logs[0]) or []) == 1, "the rebalance to give each worker one task")
        assert sorted(_assigned(logs[0]) + _assigned(logs[1])) == sorted(names)
        insert(5)
        _wait(lambda: rows_in(0) >= 15 and rows_in(1) >= 15, "both workers to copy the new rows")

        # worker B dies without a word: after the session timeout A takes its task over
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(30)
        _wait(lambda: _assigned(logs[0]) == sorted(names), "worker A to take over B's task", timeout_s=90)
        insert(5)
        _wait(lambda: rows_in(0) >= 20 and rows_in(1) >= 20, "worker A to copy rows of both tables")

        # not only how many: every row of both tables, key by key and value by value, as the table holds it
        for t, tp in zip(tables, topics, strict=True):
            with pg_engine.connect() as c:
                expected = {i: v for i, v in c.execute(text(f"SELECT id, v FROM {t}"))}
            _wait(lambda t=t, tp=tp, expected=expected: _topic_rows(kafka_conf, tp) == expected,
                  f"topic {tp} to hold exactly the rows of {t}")

        procs[0].send_signal(signal.SIGTERM)
        assert procs[0].wait(60) == 0, logs[0].read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(30)


def _topic_rows(kafka_conf: Any, topic: str) -> dict[int, str]:
    """The latest value per key of a state topic (read_committed), decoded: ``{id: v}``."""
    de = AvroDeserializer(SchemaStore(kafka_conf))
    rows: dict[int, str] = {}
    for key, value in latest_per_key(kafka_conf, topic).items():
        rows[de(key)["id"]] = de(value)["v"]
    return rows


def _exists(kafka_conf: Any, topic: str) -> bool:
    from confluent_kafka.admin import AdminClient

    return topic in AdminClient(kafka_conf).list_topics(timeout=10).topics
