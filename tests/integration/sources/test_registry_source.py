"""An ``rds_source`` writing Confluent's wire format through a Schema Registry, on real PostgreSQL and Kafka.

The registry is confluent-kafka's in-memory ``mock://`` client (no Confluent-API registry can be
installed here from the project's own files: see docs/config-reference.md); Kafka and PostgreSQL
are the real local stack. The topic is read back the way another team's consumer would, with
confluent-kafka's own ``AvroDeserializer``, and the way threes' readers do (the registry bridge,
then the single-object decoder).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from confluent_kafka.schema_registry.avro import AvroDeserializer as ConfluentAvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from sqlalchemy import text

from kernel.config.policies import RetryPolicy
from kernel.kafka.committed import latest_per_key
from schemas.registry import RegistryBridge, registry_client
from schemas.serde import AvroDeserializer
from schemas.store import InMemorySchemaStore
from threes.config import pipeline_from_dict
from threes.testing.source import count_records, run_once


def _run(kafka: Any, pg: Any, unique: str, table: str) -> Any:
    pipeline = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers, "schema_registry": {"url": f"mock://{unique}"}},
        "connections": {"pg": {"type": "rds", "url": pg.url, "password": pg.password.get_secret_value()}},
        "sources": [{"type": "rds_source", "connection": "pg", "commit_delay_s": 0, "name": f"reg-{unique}",
                     "topic": f"state.{unique}", "table": table, "mode": "bulk", "key": ["id"],
                     "value_format": "confluent_avro", "key_format": "confluent_avro"}],
    })
    (stats,) = run_once(pipeline, retry=RetryPolicy(max_attempts=1)).values()
    return stats


@pytest.fixture
def customers(pg_engine: Any, unique: str) -> str:
    table = f"regc_{unique}"
    with pg_engine.begin() as c:
        c.execute(text(f"CREATE TABLE {table} (id integer PRIMARY KEY, name text NOT NULL, score numeric(8,2))"))
        c.execute(text(f"INSERT INTO {table} SELECT g, 'n' || g, g * 1.5 FROM generate_series(1, 5) g"))
    return table


def test_source_writes_through_the_registry_and_readers_decode_it(
    kafka: Any, kafka_conf: Any, pg: Any, unique: str, customers: str
) -> None:
    topic = f"state.{unique}"
    assert _run(kafka, pg, unique, customers).state == "caught_up"
    client = registry_client({"url": f"mock://{unique}"})
    assert client.get_versions(f"{topic}-value") == [1] and client.get_versions(f"{topic}-key") == [1]
    records = latest_per_key(dict(kafka_conf), topic)
    assert len(records) == 5 and all(k[:1] == b"\x00" and v[:1] == b"\x00" for k, v in records.items())

    # another team's consumer: confluent-kafka's own deserializer
    theirs = ConfluentAvroDeserializer(client)
    ctx = SerializationContext(topic, MessageField.VALUE)
    decoded = {theirs(k, SerializationContext(topic, MessageField.KEY))["id"]: theirs(v, ctx)
               for k, v in records.items()}
    assert decoded[3]["name"] == "n3" and str(decoded[3]["score"]) == "4.50"

    # threes' readers: the bridge, then the single-object decoder with a reader schema
    store = InMemorySchemaStore()
    bridge = RegistryBridge(client, store)
    writer = json.loads(client.get_latest_version(f"{topic}-value").schema.schema_str)
    reader = {**writer, "fields": [*writer["fields"], {"name": "tier", "type": "string", "default": "basic"}]}
    ours = AvroDeserializer(store, reader_schema=reader)
    values = sorted((ours(bridge.to_single_object(v)) for v in records.values()), key=lambda r: r["id"])
    assert [r["name"] for r in values] == ["n1", "n2", "n3", "n4", "n5"] and values[0]["tier"] == "basic"


def test_incompatible_schema_is_refused_by_the_subjects_level_before_anything_is_produced(
    kafka: Any, kafka_conf: Any, pg: Any, pg_engine: Any, unique: str, customers: str
) -> None:
    topic = f"state.{unique}"
    assert _run(kafka, pg, unique, customers).state == "caught_up"
    before = count_records(kafka_conf, topic)
    with pg_engine.begin() as c:
        c.execute(text(f"ALTER TABLE {customers} ADD COLUMN owner text NOT NULL DEFAULT 'x'"))
        c.execute(text(f"UPDATE {customers} SET name = 'changed'"))
    stats = _run(kafka, pg, unique, customers)
    assert stats.state == "failed"
    assert "field 'owner'" in stats.error and "BACKWARD" in stats.error and f"{topic}-value" in stats.error
    assert count_records(kafka_conf, topic) == before
    assert registry_client({"url": f"mock://{unique}"}).get_versions(f"{topic}-value") == [1]
