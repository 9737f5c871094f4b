"""``threes dlq list|show|replay``: dead letters replayed once their cause is fixed (issue #43, part 2).

Real Kafka and PostgreSQL, the ``threes`` command run as a user runs it: records dead-lettered because their
``name`` is longer than the column's ``varchar(5)``, the column widened by hand, ``threes dlq replay``, and the
table equals an oracle (the newest version per key: a key updated after its dead letter keeps the newer value).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, Table, select, text

from connectors.rds.connection import RdsConnection
from kernel.kafka import clients
from kernel.kafka.topics import end_offsets
from kernel.updates import encode_version
from schemas.serde import AvroSerializer
from schemas.store import SchemaStore
from sync_service.service import SyncService
from tests.integration.sync.helpers import create_topic, group_lag, run_in_thread, wait_until
from threes.config import load_pipeline

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
THREES = shutil.which("threes", path=str(Path(sys.executable).parent)) or "threes"
SCHEMA = {"type": "record", "name": "Person", "namespace": "threes.test.dlq",
          "fields": [{"name": "id", "type": "long"}, {"name": "name", "type": "string"}]}
KEYS = 40


def threes(*args: str, password: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(ROOT), "COLUMNS": "200",
           "THREES_TEST_PG_PASSWORD": password}
    result = subprocess.run([THREES, *args], capture_output=True, text=True, timeout=120, env=env)
    assert password not in result.stdout + result.stderr, "a secret was printed"
    return result


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_dead_letters_replayed_after_the_column_is_widened_equal_the_oracle(
    kafka: Any, kafka_conf: dict[str, Any], pg: RdsConnection, pg_engine: Any, unique: str, tmp_path: Path
) -> None:
    topic, dlq, table = f"updates.people.{unique}", f"dlq.people.{unique}", f"people_{unique}"
    create_topic(kafka_conf, topic, 2)
    with pg_engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name varchar(5), _version bigint NOT NULL)"))
    password = pg.password.get_secret_value() if pg.password else ""
    config = tmp_path / "pipeline.yaml"
    config.write_text(json.dumps({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "connections": {"pg": {"type": "rds", "url": pg.url, "password": "${env:THREES_TEST_PG_PASSWORD}"}},
        "sync": [{"name": f"people-{unique}", "dead_letter_topic": dlq, "batch": {"max_age_ms": 100},
                  "sinks": [{"name": "db", "type": "rds_sink", "connection": "pg", "topics": [topic],
                             "table": table, "key": ["id"]}]}],
    }))
    os.environ["THREES_TEST_PG_PASSWORD"] = password
    try:
        pipeline = load_pipeline(config)
    finally:
        del os.environ["THREES_TEST_PG_PASSWORD"]

    store = SchemaStore(kafka.librdkafka_config(), kafka.schema_topic)
    key_ser, value_ser = AvroSerializer("long", store), AvroSerializer(SCHEMA, store)
    producer = clients.kafka_producer(kafka, linger_ms=5)
    oracle: dict[int, tuple[str, int]] = {}
    version = 0

    def send(key: int, name: str) -> None:
        nonlocal version
        version += 1
        producer.produce(topic, key=key_ser(key), value=value_ser({"id": key, "name": name}),
                         headers=[("version", encode_version(version))])
        oracle[key] = (name, version)

    too_long = {k for k in range(KEYS) if k % 4 == 0}  # 10 records too long for varchar(5)
    for key in range(KEYS):
        send(key, f"name-of-person-{key}" if key in too_long else f"p{key}")
    assert producer.flush(30) == 0

    service = SyncService(pipeline.kafka, pipeline.sync[0], dict(pipeline.connections))
    thread, stop, errors = run_in_thread(service)
    group = pipeline.sync[0].consumer_group()
    try:
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0, 60, "the records consumed")
        send(8, "late")  # newer than key 8's dead letter (a later batch): a replay must not overwrite it
        assert producer.flush(30) == 0
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0, 60, "the late update consumed")

        listed = as_json(threes("dlq", "list", str(config), "--json", password=password))
        assert sorted(r["offset"] for r in listed) == sorted(  # every too-long record, named by its origin
            r["offset"] for r in listed if r["topic"] == topic)
        assert len(listed) == len(too_long)
        for r in listed:
            assert r["topic"] == topic and r["stage"] == "write" and r["replayed"] is None
            assert "'name'" in r["reason"] and "VARCHAR(5)" in r["reason"], r["reason"]
        assert as_json(threes("dlq", "list", str(config), "--json", "--reason", "no such reason",
                              password=password)) == []
        assert as_json(threes("dlq", "list", str(config), "--json", "--topic", "other", password=password)) == []
        assert len(as_json(threes("dlq", "list", str(config), "--json", "--since", "1h", "--topic", topic,
                                  password=password))) == len(too_long)
        assert as_json(threes("dlq", "list", str(config), "--json", "--until", "1h", password=password)) == []

        shown = as_json(threes("dlq", "show", str(config), listed[0]["id"], "--json", password=password))
        assert shown["value"]["as"] == "avro" and shown["value"]["value"]["name"].startswith("name-of-person-")
        assert shown["key"]["value"] == shown["value"]["value"]["id"]
        assert shown["headers"]["dlq.topic"] == topic and "version" in shown["headers"]
        human = threes("dlq", "list", str(config), password=password)
        assert human.returncode == 0 and listed[0]["id"] in human.stdout, human.stdout + human.stderr

        # the cause, fixed by hand; the running sink sees the wider column when it next needs it
        with pg_engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {table} ALTER COLUMN name TYPE varchar(50)"))

        before = end_offsets(kafka_conf, topic)
        dry = as_json(threes("dlq", "replay", str(config), "--reason", "VARCHAR(5)", "--dry-run", "--json",
                             password=password))
        assert dry["dry_run"] and len(dry["replayed"]) == len(too_long)
        assert end_offsets(kafka_conf, topic) == before, "a dry run sends nothing"

        done = as_json(threes("dlq", "replay", str(config), "--reason", "VARCHAR(5)", "--json", password=password))
        assert not done["dry_run"] and len(done["replayed"]) == len(too_long)
        assert {r["to"] for r in done["replayed"]} == {topic} and "version" in done["note"]
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0, 60, "the replayed records consumed")

        t = Table(table, MetaData(), autoload_with=pg_engine)
        with pg_engine.connect() as conn:
            stored = {r.id: (r.name, r._version) for r in conn.execute(select(t.c.id, t.c.name, t.c._version))}
        assert stored == oracle
        assert stored[8] == ("late", KEYS + 1)
        # nothing was dead-lettered again, and the list says what was replayed
        again = as_json(threes("dlq", "list", str(config), "--json", password=password))
        assert len(again) == len(too_long) and all(r["replayed"]["to"] == topic for r in again)

        # a second replay of the same records is refused, unless forced (and then changes nothing)
        refused = threes("dlq", "replay", str(config), "--reason", "VARCHAR(5)", password=password)
        assert refused.returncode == 1 and "replayed before" in refused.stderr and "--force" in refused.stderr
        assert "Traceback" not in refused.stderr
        assert end_offsets(kafka_conf, topic) == {
            p: before[p] + sum(1 for r in done["replayed"] if r["partition"] == p) for p in before}
        forced = as_json(threes("dlq", "replay", str(config), "--id", listed[0]["id"], "--force", "--json",
                                password=password))
        assert len(forced["replayed"]) == 1
        wait_until(lambda: group_lag(kafka_conf, group, topic) == 0, 60, "the forced replay consumed")
        with pg_engine.connect() as conn:
            assert {r.id: (r.name, r._version) for r in conn.execute(select(t.c.id, t.c.name, t.c._version))} == oracle
        assert not errors, errors
    finally:
        stop.set()
        thread.join(60)
        for name in (table, f"{table}__deleted"):
            Table(name, MetaData()).drop(pg_engine, checkfirst=True)


def test_a_column_widened_by_hand_is_used_before_a_value_is_refused(pg: RdsConnection, pg_engine: Any,
                                                                    unique: str) -> None:
    # a replayed record in a batch with others: the sink must not refuse it on its old view of the column
    # (a batch of refused records only would block and reopen the sink, which reflects the table anyway)
    import fastavro

    from connectors.api.sink_records import SinkBatch, SinkRecord
    from connectors.rds.config import RdsSinkConfig
    from connectors.rds.sink import RdsSink
    from schemas.serde import fingerprint

    table = f"widen_{unique}"
    with pg_engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} (id bigint PRIMARY KEY, name varchar(5), _version bigint NOT NULL)"))
    parsed, fp = fastavro.parse_schema(SCHEMA), fingerprint(SCHEMA)

    def batch(first: int) -> SinkBatch:
        records = [SinkRecord("t", 0, first + i, k, {"id": k, "name": n}, first + i + 1, 0, 100, parsed, fp)
                   for i, (k, n) in enumerate([(1, "short"), (2, "much-too-long")])]
        return SinkBatch("t", 0, first, first + 1, records)

    sink = RdsSink(RdsSinkConfig(name="s", type="rds_sink", connection="db", topics=["t"], table=table,
                                 key=["id"]), pg)
    sink.open()
    try:
        assert [f.record.key for f in sink.write(batch(0))] == [2]
        with pg_engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE {table} ALTER COLUMN name TYPE varchar(50)"))
        assert sink.write(batch(2)) == []
        with pg_engine.connect() as conn:
            assert dict(conn.execute(text(f"SELECT id, name FROM {table}")).all()) == {1: "short", 2: "much-too-long"}
    finally:
        sink.close()
        for name in (table, f"{table}__deleted"):
            Table(name, MetaData()).drop(pg_engine, checkfirst=True)
