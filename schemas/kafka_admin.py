"""Kafka admin primitives: cluster metadata, compacted topics, internal topics, watermark offsets.

The schema topic (:mod:`schemas.store`) stands on these, so they live in the bottom layer;
:mod:`kernel.kafka.topics` builds the framework's topic helpers on them and re-exports them.
A compacted topic (``cleanup.policy=compact``) keeps the latest record per key; a record whose
value is ``null`` is a tombstone and deletes the key (Kafka documentation, "Log Compaction").
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

from schemas.exceptions import ConfigError, SetupError
from schemas.kafka_cluster import admin_client, cluster_metadata

log = logging.getLogger(__name__)


def topic_configs(kafka_config: Mapping[str, Any], topic: str, timeout_s: float = 10.0) -> dict[str, str]:
    """Return the effective configs of an existing topic.

    Raises:
        SetupError: Kafka did not answer within ``timeout_s`` seconds.
    """
    admin = admin_client(kafka_config)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        result = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s)
    except (KafkaException, concurrent.futures.TimeoutError) as exc:
        detail = str(exc) or f"no answer within {timeout_s:g} s"
        raise SetupError(f"cannot describe topic {topic!r}: {detail}") from exc
    return {name: entry.value for name, entry in result.items()}


def ensure_compacted_topic(
    kafka_config: Mapping[str, Any],
    topic: str,
    *,
    partitions: int = 1,
    replication_factor: int | None = None,
    min_insync_replicas: int | None = None,
    configs: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> bool:
    """Create ``topic`` compacted if it is missing; refuse one that is not compacted.

    Args:
        kafka_config: librdkafka properties.
        topic: the topic name.
        partitions: partitions when created.
        replication_factor: replicas when created; ``None`` for the default of
            :func:`replication_settings` (``min(3, brokers)``).
        min_insync_replicas: ``min.insync.replicas`` when created; ``None`` for the
            default of :func:`replication_settings` (a ``min.insync.replicas`` in
            ``configs`` wins over both).
        configs: more topic configs when created (``cleanup.policy`` is forced to
            ``compact``).
        timeout_s: admin request timeout, seconds.

    Returns:
        ``True`` if the topic was created, ``False`` if it existed and is compacted.

    Raises:
        ConfigError: the topic exists with a ``cleanup.policy`` without ``compact``
            (its old records would be deleted by retention, losing entities), or the
            replication settings are impossible on this cluster.
        SetupError: Kafka cannot be reached or refused the creation.
    """
    metadata = cluster_metadata(kafka_config, timeout_s)
    if topic in metadata.topics and metadata.topics[topic].error is None:
        _require_compacted(kafka_config, topic, timeout_s)
        return False
    created = create_topic(
        kafka_config,
        topic,
        partitions=partitions,
        replication_factor=replication_factor,
        min_insync_replicas=min_insync_replicas,
        configs={**dict(configs or {}), "cleanup.policy": "compact"},
        timeout_s=timeout_s,
        metadata=metadata,
    )
    if created is None:  # created by someone else meanwhile
        _require_compacted(kafka_config, topic, timeout_s)
        return False
    return True


def _require_compacted(kafka_config: Mapping[str, Any], topic: str, timeout_s: float) -> None:
    """Raise ``ConfigError`` unless the existing ``topic``'s ``cleanup.policy`` includes ``compact``."""
    policy = topic_configs(kafka_config, topic, timeout_s).get("cleanup.policy", "")
    if "compact" not in policy.split(","):
        raise ConfigError(
            f"topic {topic!r} exists with cleanup.policy={policy!r}, not compacted: "
            "state topics must be compacted (one record per key, tombstones delete); "
            f"alter it with cleanup.policy=compact or choose another topic"
        )


def create_topic(
    kafka_config: Mapping[str, Any],
    topic: str,
    *,
    partitions: int = 1,
    replication_factor: int | None = None,
    min_insync_replicas: int | None = None,
    configs: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
    metadata: Any = None,
) -> tuple[int, int] | None:
    """Create ``topic`` replicated by the project's one rule; every topic the project creates goes through here.

    The replication factor and ``min.insync.replicas`` come from :func:`replication_settings`,
    given the number of brokers in the cluster's metadata: on a cluster of three or more
    brokers a topic gets three replicas and ``min.insync.replicas=2``; on one broker, 1 and 1.
    A ``min.insync.replicas`` in ``configs`` wins over ``min_insync_replicas``.

    Args:
        kafka_config: librdkafka properties.
        topic: the topic name.
        partitions: partitions.
        replication_factor: configured factor (``kafka.internal_replication_factor``, or a
            topic spec's), ``None`` for the default.
        min_insync_replicas: configured value (``kafka.internal_min_insync_replicas``),
            ``None`` for the default.
        configs: topic configs (``cleanup.policy``, ``retention.ms``...).
        timeout_s: admin request timeout, seconds.
        metadata: the cluster's metadata when the caller has just read it (else read here).

    Returns:
        ``(replication_factor, min_insync_replicas)`` it was created with; ``None`` when
        the topic existed already (its settings are left as they are).

    Raises:
        ConfigError: impossible replication settings on this cluster.
        SetupError: Kafka cannot be reached or refused the creation.
    """
    if metadata is None:
        metadata = cluster_metadata(kafka_config, timeout_s)
    settings = dict(configs or {})
    explicit_isr = settings.get("min.insync.replicas")
    rf, isr = replication_settings(
        len(metadata.brokers),
        replication_factor,
        int(explicit_isr) if explicit_isr is not None else min_insync_replicas,
    )
    settings["min.insync.replicas"] = str(isr)
    new = NewTopic(topic, num_partitions=partitions, replication_factor=rf, config=settings)
    admin = admin_client(kafka_config)  # held until the result: a collected client destroys its requests
    try:
        admin.create_topics([new], request_timeout=timeout_s)[topic].result(timeout_s)
    except KafkaException as exc:
        if exc.args and getattr(exc.args[0], "name", lambda: "")() == "TOPIC_ALREADY_EXISTS":
            return None
        raise SetupError(f"cannot create topic {topic!r}: {exc}") from exc
    log.info("created topic=%s partitions=%d replication_factor=%d min.insync.replicas=%d cleanup.policy=%s",
             topic, partitions, rf, isr, settings.get("cleanup.policy", "delete"))
    return rf, isr


def watermark_offsets(consumer: Any, topic: str, partition: int, timeout_s: float = 10.0) -> tuple[int, int]:
    """``(low, high)`` watermarks of one partition, waiting out a partition without a leader for a moment.

    Right after a topic is created, or while a broker restarts, the broker answers
    ``NOT_LEADER_FOR_PARTITION`` (or ``LEADER_NOT_AVAILABLE``) for a while: asked again every
    0.1 s, up to ``timeout_s`` in all.

    Raises:
        SetupError: no watermarks within ``timeout_s`` (it names the partition, and the last error
            when the broker answered one).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            marks = consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=max(0.1, deadline - time.monotonic()), cached=False
            )
        except KafkaException as exc:
            if time.monotonic() >= deadline:
                raise SetupError(f"cannot read the offsets of {topic}[{partition}]: {exc}") from exc
            time.sleep(0.1)
            continue
        if marks is not None:
            return int(marks[0]), int(marks[1])
        if time.monotonic() >= deadline:
            raise SetupError(f"no answer for the offsets of {topic}[{partition}] within {timeout_s} s")


def replication_settings(
    brokers: int, replication_factor: int | None = None, min_insync_replicas: int | None = None
) -> tuple[int, int]:
    """The replication factor and ``min.insync.replicas`` of a topic the project creates: the one rule.

    Every topic threes creates (state topics, ``_threes_schemas``, ``_threes_offsets``,
    task topics, dead letter, update, enriched and events topics) is created through
    :func:`create_topic`, which asks the cluster's broker count and calls this.
    Defaults follow Kafka's own advice for topics that must not be lost
    (Kafka Connect's internal topics default to replication factor 3): three
    replicas, or every broker when there are fewer, and ``min.insync.replicas``
    one less than that (at least 1, at most 2), so an ``acks=all`` write is on
    two brokers whenever there are three, and one broker may be down.

    Args:
        brokers: brokers in the cluster (from the cluster metadata), >= 1.
        replication_factor: the configured factor (``kafka.internal_replication_factor``),
            ``None`` for the default ``min(3, brokers)``.
        min_insync_replicas: the configured value (``kafka.internal_min_insync_replicas``),
            ``None`` for the default ``max(1, min(2, replication_factor - 1))``.

    Returns:
        ``(replication_factor, min_insync_replicas)``.

    Raises:
        ConfigError: the factor exceeds the brokers, or ``min.insync.replicas``
            exceeds the factor (every write would then fail).
    """
    rf = replication_factor if replication_factor is not None else min(3, max(1, brokers))
    if rf > brokers:
        raise ConfigError(
            f"kafka.internal_replication_factor is {rf} but the cluster has {brokers} broker(s): "
            "internal topics cannot be created; lower it or add brokers"
        )
    isr = min_insync_replicas if min_insync_replicas is not None else max(1, min(2, rf - 1))
    if isr > rf:
        raise ConfigError(
            f"kafka.internal_min_insync_replicas is {isr}, more than the replication factor {rf}: "
            "no acks=all write could ever succeed"
        )
    return rf, isr


def ensure_internal_topic(
    kafka_config: Mapping[str, Any],
    topic: str,
    *,
    partitions: int = 1,
    replication_factor: int | None = None,
    min_insync_replicas: int | None = None,
    timeout_s: float = 10.0,
) -> bool:
    """Create an internal compacted topic (schemas, offsets, task topics) replicated as configured.

    The factor and ``min.insync.replicas`` come from :func:`replication_settings`.
    An existing topic is kept as it is (Kafka cannot change a topic's replication
    factor without a partition reassignment); one with fewer replicas than
    asked is logged as a warning naming the topic.

    Args:
        kafka_config: librdkafka properties.
        topic: the topic.
        partitions: partitions when created.
        replication_factor: configured factor, ``None`` for the default.
        min_insync_replicas: configured value, ``None`` for the default.
        timeout_s: admin request timeout, seconds.

    Returns:
        ``True`` if the topic was created.

    Raises:
        ConfigError: impossible settings, or the topic exists not compacted.
        SetupError: Kafka cannot be reached or refused the creation.
    """
    metadata = cluster_metadata(kafka_config, timeout_s)
    rf, isr = replication_settings(len(metadata.brokers), replication_factor, min_insync_replicas)
    existing = metadata.topics.get(topic)
    if existing is not None and existing.error is None and existing.partitions:
        replicas = min(len(p.replicas) for p in existing.partitions.values())
        if replicas < rf:
            log.warning(
                "internal topic=%s has %d replica(s), fewer than the %d configured: losing a broker can lose it; "
                "raise it with a partition reassignment (kafka-reassign-partitions.sh)", topic, replicas, rf,
            )
    return ensure_compacted_topic(
        kafka_config,
        topic,
        partitions=partitions,
        replication_factor=rf,
        min_insync_replicas=isr,
        timeout_s=timeout_s,
    )
