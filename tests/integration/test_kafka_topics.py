"""Compacted topics and the schema topic against the real broker."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from kernel.exceptions import ConfigError
from kernel.kafka import clients
from kernel.kafka.topics import ensure_compacted_topic, read_latest_per_key, topic_configs
from schemas.exceptions import UnknownSchemaError
from schemas.serde import AvroDeserializer, AvroSerializer, fingerprint
from schemas.store import SchemaStore

PLANE = {"type": "record", "name": "Plane", "fields": [{"name": "tailnum", "type": "string"}, {"name": "seats", "type": "int"}]}


def test_compacted_topic_latest_value_per_key_after_overwrites_and_tombstone(kafka, kafka_conf, topic):
    assert ensure_compacted_topic(kafka_conf, topic, partitions=3) is True
    assert ensure_compacted_topic(kafka_conf, topic, partitions=3) is False  # idempotent
    assert topic_configs(kafka_conf, topic)["cleanup.policy"] == "compact"

    producer = clients.kafka_producer(kafka)
    for key, value in [(b"a", b"1"), (b"b", b"1"), (b"a", b"2"), (b"c", b"1"), (b"b", None), (b"c", b"3"), (b"d", None)]:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0

    assert read_latest_per_key(kafka_conf, topic) == {b"a": b"2", b"c": b"3"}


def test_existing_non_compacted_topic_is_refused(kafka, kafka_conf, topic):
    admin = clients.kafka_admin(kafka)
    admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1, config={"cleanup.policy": "delete"})])[
        topic
    ].result(30)
    with pytest.raises(ConfigError, match=rf"topic '{topic}' exists with cleanup.policy='delete', not compacted"):
        ensure_compacted_topic(kafka_conf, topic)


def test_schema_topic_lets_a_new_reader_resolve_unseen_fingerprints(kafka_conf, topic):
    writer_store = SchemaStore(kafka_conf, topic=f"{topic}.schemas")
    data = AvroSerializer(PLANE, writer_store)({"tailnum": "N1", "seats": 55})

    reader_store = SchemaStore(kafka_conf, topic=f"{topic}.schemas")  # a different process, in effect
    assert AvroDeserializer(reader_store)(data) == {"tailnum": "N1", "seats": 55}
    assert fingerprint(PLANE) in reader_store.schemas_json()
    assert topic_configs(kafka_conf, f"{topic}.schemas")["cleanup.policy"] == "compact"

    other = {**PLANE, "name": "NotRegistered"}
    unregistered = AvroSerializer(other)({"tailnum": "N2", "seats": 1})
    with pytest.raises(UnknownSchemaError, match=f"{fingerprint(other).hex()}.*not in schema topic"):
        AvroDeserializer(reader_store)(unregistered)


def test_produce_fails_clearly_when_kafka_is_unreachable():
    from kernel.config.models import KafkaConfig
    from kernel.exceptions import SetupError

    dead = KafkaConfig(bootstrap_servers="127.0.0.1:1", request_timeout_s=2).librdkafka_config()
    with pytest.raises(SetupError, match=r"Kafka at 127.0.0.1:1 did not answer.*threes local up"):
        ensure_compacted_topic(dead, "never", timeout_s=2)
    Producer(dead)  # constructing a client alone does not connect: no error until used


def test_committed_offsets_read_a_live_group_without_joining_it(kafka, topic):
    from confluent_kafka import TopicPartition

    from kernel.kafka.topics import committed_offsets

    admin = clients.kafka_admin(kafka)  # kept: its futures need the client alive
    admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])[topic].result(30)
    producer = clients.kafka_producer(kafka)
    for i in range(10):
        producer.produce(topic, key=str(i).encode(), value=b"v", partition=0)
    assert producer.flush(30) == 0
    member = clients.kafka_consumer(kafka, f"{topic}.group")
    member.assign([TopicPartition(topic, 0, 0)])
    seen = 0
    while seen < 10:
        msg = member.poll(5)
        assert msg is not None and msg.error() is None
        seen += 1
    member.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)

    reader = clients.kafka_consumer(kafka, f"{topic}.group")  # the same group, never subscribing
    try:
        assert committed_offsets(reader, [(topic, 0), (topic, 1)], 10) == {(topic, 0): 7, (topic, 1): None}
    finally:
        reader.close()
    member.commit(offsets=[TopicPartition(topic, 0, 10)], asynchronous=False)  # the member was not moved out
    member.close()
