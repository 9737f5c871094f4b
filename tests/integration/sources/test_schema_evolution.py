"""Schema evolution of a source's topic on real PostgreSQL and Kafka.

A column's type change between two runs of ``rds_source``: a decimal's scale
(refused at the default ``BACKWARD`` level, exact under ``NONE``), a column
added ``NOT NULL`` (refused, field named, nothing produced), a primary key
``integer`` -> ``bigint`` (refused without ``rekey``; with it the old keys are
tombstoned before the new values). And the internal topics' replication.
"""

from __future__ import annotations

import decimal
import uuid
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from sqlalchemy import text

from kernel.exceptions import ConfigError
from kernel.kafka.topics import end_offsets
from schemas.serde import MARKER
from schemas.store import SchemaStore
from tests.integration.sources.rds import source_pipeline
from threes.testing.source import count_records, run_once, topic_state

D = decimal.Decimal


def _run(kafka: Any, pg: Any, unique: str, table: str, **source: Any) -> Any:
    from kernel.config.policies import RetryPolicy

    source.setdefault("key", ["id"])
    pipeline = source_pipeline(kafka, pg, name=f"ev-{unique}", topic=f"state.{unique}", table=table, mode="bulk",
                               **source)
    (stats,) = run_once(pipeline, retry=RetryPolicy(max_attempts=1)).values()
    return stats


def _all_records(kafka_conf: dict[str, Any], topic: str) -> list[tuple[bytes, bytes | None]]:
    """Every record of partition 0 of ``topic`` in offset order: ``(key, value)`` (``None`` = tombstone)."""
    end = end_offsets(kafka_conf, topic)[0]
    consumer = Consumer({**kafka_conf, "group.id": f"t-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    out: list[tuple[bytes, bytes | None]] = []
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        while not out or out[-1][2] + 1 < end:  # type: ignore[misc]
            msg = consumer.poll(10.0)
            assert msg is not None, f"topic {topic} ended before offset {end}"
            out.append((msg.key(), msg.value(), msg.offset()))  # type: ignore[arg-type]
            if msg.offset() + 1 >= end:
                break
    finally:
        consumer.close()
    return [(k, v) for k, v, _ in out]  # type: ignore[misc]


@pytest.fixture
def amounts(pg_engine: Any, unique: str) -> str:
    table = f"ev_{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id integer PRIMARY KEY, amount numeric(12,2))"))
        c.execute(text(f"INSERT INTO {table} VALUES (1, 123.45), (2, 0.01)"))
    return table


def test_decimal_scale_change_is_refused_by_default_and_exact_when_allowed(
    kafka: Any, kafka_conf: Any, pg: Any, pg_engine: Any, unique: str, amounts: str
) -> None:
    topic = f"state.{unique}"
    assert _run(kafka, pg, unique, amounts).state == "caught_up"
    before = count_records(kafka_conf, topic)
    with pg_engine.begin() as c:
        c.execute(text(f"ALTER TABLE {amounts} ALTER COLUMN amount TYPE numeric(12,4)"))
        c.execute(text(f"INSERT INTO {amounts} VALUES (3, 1.2345)"))

    refused = _run(kafka, pg, unique, amounts)
    assert refused.state == "failed"
    assert f"topic {topic!r}" in refused.error and "field 'amount'" in refused.error
    assert "decimal(12,2) to decimal(12,4)" in refused.error
    assert count_records(kafka_conf, topic) == before  # nothing produced

    allowed = _run(kafka, pg, unique, amounts, topic_spec={"compatibility": "NONE"})
    assert allowed.state == "caught_up", allowed.error
    state = topic_state(kafka_conf, topic)
    # each record decodes with its own writer schema: no 1.2345 read as 123.45, no 123.45 read as 1.2345
    assert {k[0]: v["amount"] for k, v in state.items()} == {1: D("123.4500"), 2: D("0.0100"), 3: D("1.2345")}


def test_incompatible_change_is_refused_naming_topic_and_field(
    kafka: Any, kafka_conf: Any, pg: Any, pg_engine: Any, unique: str, amounts: str
) -> None:
    topic = f"state.{unique}"
    assert _run(kafka, pg, unique, amounts).state == "caught_up"
    before = count_records(kafka_conf, topic)
    with pg_engine.begin() as c:
        c.execute(text(f"ALTER TABLE {amounts} ADD COLUMN owner text NOT NULL DEFAULT 'x'"))
    stats = _run(kafka, pg, unique, amounts)
    assert stats.state == "failed"
    assert f"topic {topic!r}" in stats.error and "field 'owner'" in stats.error and "BACKWARD" in stats.error
    assert count_records(kafka_conf, topic) == before


@pytest.fixture
def keyed(pg_engine: Any, unique: str) -> str:
    table = f"rk_{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id integer PRIMARY KEY, v text NOT NULL)"))
        c.execute(text(f"INSERT INTO {table} SELECT g, 'v' || g FROM generate_series(1, 5) g"))
    return table


def test_key_type_change_is_refused_without_rekey(
    kafka: Any, kafka_conf: Any, pg: Any, pg_engine: Any, unique: str, keyed: str
) -> None:
    topic = f"state.{unique}"
    assert _run(kafka, pg, unique, keyed).state == "caught_up"
    before = count_records(kafka_conf, topic)
    with pg_engine.begin() as c:
        c.execute(text(f"ALTER TABLE {keyed} ALTER COLUMN id TYPE bigint"))
    stats = _run(kafka, pg, unique, keyed)
    assert stats.state == "failed"
    assert f"topic {topic!r}" in stats.error and "field 'id'" in stats.error and "rekey: true" in stats.error
    assert count_records(kafka_conf, topic) == before


def test_rekey_tombstones_old_keys_before_the_new_values(
    kafka: Any, kafka_conf: Any, pg: Any, pg_engine: Any, unique: str, keyed: str
) -> None:
    topic = f"state.{unique}"
    assert _run(kafka, pg, unique, keyed).state == "caught_up"
    first = len(_all_records(kafka_conf, topic))
    with pg_engine.begin() as c:
        c.execute(text(f"ALTER TABLE {keyed} ALTER COLUMN id TYPE bigint"))
        c.execute(text(f"DELETE FROM {keyed} WHERE id = 5"))
    stats = _run(kafka, pg, unique, keyed, rekey=True)
    assert stats.state == "caught_up", stats.error

    records = _all_records(kafka_conf, topic)[first:]
    old_keys = {k for k, _ in _all_records(kafka_conf, topic)[:first]}
    tombstoned = [k for k, v in records if v is None]
    values = [i for i, (k, v) in enumerate(records) if v is not None]
    assert set(tombstoned) == old_keys and len(old_keys) == 5
    last_tombstone = max(i for i, (_, v) in enumerate(records) if v is None)
    assert values and min(values) > last_tombstone  # every tombstone before the first new value
    assert all(records[i][0][:2] == MARKER and records[i][0] not in old_keys for i in values)
    state = topic_state(kafka_conf, topic)
    assert {k[0]: v["v"] for k, v in state.items()} == {i: f"v{i}" for i in range(1, 5)}

    # done once: the next run neither re-keys nor refuses
    again = _run(kafka, pg, unique, keyed, rekey=True)
    assert again.state == "caught_up" and again.tombstones == 0


def test_internal_topics_take_replication_from_the_config(kafka: Any, kafka_conf: Any, unique: str) -> None:
    """On the one-broker stack: the default is one replica with min.insync.replicas set; more is refused."""
    topic = f"_threes_schemas_{unique}"
    SchemaStore(kafka_conf, topic)
    admin = AdminClient(kafka_conf)
    meta = admin.list_topics(topic, timeout=10).topics[topic]
    assert len(meta.partitions[0].replicas) == min(3, len(admin.list_topics(timeout=10).brokers)) == 1
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(10)
    assert entries["min.insync.replicas"].value == "1"
    assert entries["min.insync.replicas"].source == 1  # DYNAMIC_TOPIC_CONFIG: set by threes, not the default
    assert entries["cleanup.policy"].value == "compact"

    # the worker takes kafka.internal_replication_factor from the pipeline's config
    from connectors.runtime.standalone import SourceWorker
    from threes.config import pipeline_from_dict

    pipeline = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "internal_replication_factor": 2,
                  "schema_topic": f"_threes_schemas2_{unique}"},
        "connections": {}, "sources": [],
    })
    other = f"_threes_offsets_{unique}"
    with pytest.raises(ConfigError, match="internal_replication_factor is 2 but the cluster has 1 broker"):
        SourceWorker(pipeline, offsets_topic=other)
    assert other not in admin.list_topics(timeout=10).topics


def test_keys_written_before_the_logical_canonical_form_keep_their_bytes(
    kafka: Any, kafka_conf: Any, pg: Any, pg_engine: Any, unique: str
) -> None:
    """Upgrade: a ``date`` key an older release framed with its Parsing Canonical Form fingerprint."""
    import datetime as dt

    from confluent_kafka import Producer

    from connectors.rds.source import RdsSource
    from kernel.kafka.topics import ensure_compacted_topic, read_latest_per_key
    from schemas.serde import AvroSerializer, fingerprint, parsing_fingerprint, schema_json

    table, topic = f"up_{unique}", f"state.{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (day date PRIMARY KEY, v text NOT NULL)"))
        c.execute(text(f"INSERT INTO {table} SELECT DATE '2024-01-01' + g, 'new' FROM generate_series(0, 2) g"))
    pipeline = source_pipeline(kafka, pg, name=f"ev-{unique}", topic=topic, table=table, mode="bulk", key=["day"])
    cfg = pipeline.sources[0]
    task = RdsSource(cfg, pipeline.connections[cfg.connection], kafka=pipeline.kafka)
    schemas = task.open(None)
    task.close()
    legacy = parsing_fingerprint(schemas.key)
    assert legacy != fingerprint(schemas.key)  # a key with a logical type: the identity changed

    # what an older release left: the key schema stored under its old fingerprint, keys framed with it
    store = SchemaStore(kafka_conf)
    producer = Producer(kafka_conf)
    producer.produce(store.topic, key=legacy.hex().encode(), value=schema_json(schemas.key).encode())
    ensure_compacted_topic(kafka_conf, topic)
    key_ser = AvroSerializer(schemas.key, fp=legacy)
    value_ser = AvroSerializer(schemas.value, store)
    days = [dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in range(3)]
    for day in days:
        producer.produce(topic, key=key_ser({"day": day}), value=value_ser({"day": day, "v": "old"}))
    assert producer.flush(10) == 0

    assert _run(kafka, pg, unique, table, key=["day"]).state == "caught_up"
    latest = read_latest_per_key(kafka_conf, topic)
    assert len(latest) == 3 and all(k.startswith(MARKER + legacy) for k in latest)  # no entity twice
    assert {k[0]: v["v"] for k, v in topic_state(kafka_conf, topic).items()} == {d: "new" for d in days}


def test_a_key_change_is_seen_in_the_topic_when_no_version_was_recorded(
    kafka: Any, kafka_conf: Any, pg: Any, pg_engine: Any, unique: str, keyed: str
) -> None:
    """The schema versions are gone (another schema topic): the topic's latest keys still tell the key changed."""
    from kernel.config.policies import RetryPolicy
    from threes.config import pipeline_from_dict

    topic = f"state.{unique}"

    def run(schema_topic: str) -> Any:
        pipeline = pipeline_from_dict({
            "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "schema_topic": schema_topic},
            "connections": {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
            "sources": [{"type": "rds_source", "connection": "pg", "commit_delay_s": 0, "name": f"ev-{unique}",
                         "topic": topic, "table": keyed, "mode": "bulk", "key": ["id"]}],
        })
        (stats,) = run_once(pipeline, retry=RetryPolicy(max_attempts=1)).values()
        return stats

    assert run(f"_threes_schemas_a_{unique}").state == "caught_up"
    before = count_records(kafka_conf, topic)
    with pg_engine.begin() as c:
        c.execute(text(f"ALTER TABLE {keyed} ALTER COLUMN id TYPE bigint"))
    stats = run(f"_threes_schemas_b_{unique}")
    assert stats.state == "failed" and "rekey: true" in stats.error and f"topic {topic!r}" in stats.error
    assert count_records(kafka_conf, topic) == before
