"""Kafka topic helpers: create compacted topics, read a compacted topic to its end.

A compacted topic (``cleanup.policy=compact``) keeps the latest record per key;
a record whose value is ``null`` is a tombstone and deletes the key
(Kafka documentation, "Log Compaction"). The state topics, the schema topic
and the source offsets topic are all compacted.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from connectors.exceptions import ConfigError, SetupError

log = logging.getLogger(__name__)


def _admin(kafka_config: Mapping[str, Any]) -> AdminClient:
    return AdminClient(dict(kafka_config))


def topic_configs(kafka_config: Mapping[str, Any], topic: str, timeout_s: float = 10.0) -> dict[str, str]:
    """Return the effective configs of an existing topic.

    Raises:
        SetupError: Kafka did not answer within ``timeout_s`` seconds.
    """
    admin = _admin(kafka_config)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        result = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s)
    except KafkaException as exc:
        raise SetupError(f"cannot describe topic {topic!r}: {exc}") from exc
    return {name: entry.value for name, entry in result.items()}


def ensure_compacted_topic(
    kafka_config: Mapping[str, Any],
    topic: str,
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    configs: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> bool:
    """Create ``topic`` compacted if it is missing; refuse one that is not compacted.

    Args:
        kafka_config: librdkafka properties.
        topic: the topic name.
        partitions: partitions when created.
        replication_factor: replicas when created.
        configs: more topic configs when created (``cleanup.policy`` is forced to
            ``compact``).
        timeout_s: admin request timeout, seconds.

    Returns:
        ``True`` if the topic was created, ``False`` if it existed and is compacted.

    Raises:
        ConfigError: the topic exists with a ``cleanup.policy`` without ``compact``
            (its old records would be deleted by retention, losing entities).
        SetupError: Kafka cannot be reached or refused the creation.
    """
    admin = _admin(kafka_config)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise SetupError(
            f"Kafka at {kafka_config.get('bootstrap.servers')} did not answer: {exc}",
            "check kafka.bootstrap_servers, or start the local stack with `threes local up`",
        ) from exc
    if topic in metadata.topics and metadata.topics[topic].error is None:
        policy = topic_configs(kafka_config, topic, timeout_s).get("cleanup.policy", "")
        if "compact" not in policy.split(","):
            raise ConfigError(
                f"topic {topic!r} exists with cleanup.policy={policy!r}, not compacted: "
                "state topics must be compacted (one record per key, tombstones delete); "
                f"alter it with cleanup.policy=compact or choose another topic"
            )
        return False
    new = NewTopic(
        topic,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config={**dict(configs or {}), "cleanup.policy": "compact"},
    )
    try:
        admin.create_topics([new], request_timeout=timeout_s)[topic].result(timeout_s)
    except KafkaException as exc:
        if exc.args and getattr(exc.args[0], "name", lambda: "")() == "TOPIC_ALREADY_EXISTS":
            return ensure_compacted_topic(kafka_config, topic, timeout_s=timeout_s)
        raise SetupError(f"cannot create topic {topic!r}: {exc}") from exc
    log.info("created compacted topic=%s partitions=%d", topic, partitions)
    return True


def end_offsets(kafka_config: Mapping[str, Any], topic: str, timeout_s: float = 10.0) -> dict[int, int]:
    """Return the high watermark (next offset to be written) of every partition.

    Raises:
        SetupError: the topic does not exist or Kafka did not answer.
    """
    consumer = Consumer({**kafka_config, "group.id": f"threes-meta-{uuid.uuid4().hex}"})
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            raise SetupError(f"topic {topic!r} does not exist")
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
            for p in meta.partitions
        }
    finally:
        consumer.close()


def read_latest_per_key(
    kafka_config: Mapping[str, Any], topic: str, timeout_s: float = 30.0
) -> dict[bytes, bytes]:
    """Read a compacted topic from the start to its current end, keeping the latest value per key.

    Tombstones remove their key, exactly as compaction would.

    Args:
        kafka_config: librdkafka properties.
        topic: the topic.
        timeout_s: the longest wait for one record, seconds.

    Returns:
        Key bytes -> value bytes of every live key.

    Raises:
        SetupError: the topic does not exist, or the end was not reached in time.
    """
    ends = end_offsets(kafka_config, topic, timeout_s)
    consumer = Consumer(
        {
            **kafka_config,
            "group.id": f"threes-read-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    latest: dict[bytes, bytes] = {}
    try:
        pending = {p for p, end in ends.items() if end > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in pending])
        # the low watermark may be > 0 after deletion; auto.offset.reset handles that.
        while pending:
            msg = consumer.poll(timeout_s)
            if msg is None:
                raise SetupError(f"topic {topic!r}: no record within {timeout_s} s before its end offsets {ends}")
            if msg.error():
                raise SetupError(f"topic {topic!r}: {msg.error()}")
            if msg.value() is None:
                latest.pop(msg.key(), None)
            else:
                latest[msg.key()] = msg.value()
            if msg.offset() + 1 >= ends[msg.partition()]:
                pending.discard(msg.partition())
                consumer.incremental_unassign([TopicPartition(topic, msg.partition())])
    finally:
        consumer.close()
    return latest
