"""Kafka topic helpers: read a compacted topic to its end, end and committed offsets, recent keys.

The admin primitives (cluster metadata, compacted and internal topics, watermark offsets) are
defined in :mod:`schemas.kafka_admin`, under the schema store, and re-exported here.

A compacted topic (``cleanup.policy=compact``) keeps the latest record per key;
a record whose value is ``null`` is a tombstone and deletes the key
(Kafka documentation, "Log Compaction"). The state topics, the schema topic
and the source offsets topic are all compacted.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kernel.exceptions import SetupError
from schemas.kafka_admin import create_topic as create_topic
from schemas.kafka_admin import ensure_compacted_topic as ensure_compacted_topic
from schemas.kafka_admin import ensure_internal_topic as ensure_internal_topic
from schemas.kafka_admin import replication_settings as replication_settings
from schemas.kafka_admin import topic_configs as topic_configs
from schemas.kafka_admin import watermark_offsets as watermark_offsets

# re-exported: the framework's topic helpers in one place
from schemas.kafka_cluster import check_credentials as check_credentials
from schemas.kafka_cluster import cluster_metadata as cluster_metadata

log = logging.getLogger(__name__)


def committed_offsets(
    consumer: Any, partitions: Iterable[tuple[str, int]], timeout_s: float = 10.0
) -> dict[tuple[str, int], int | None]:
    """Committed offset of each of ``partitions`` for the group of ``consumer``.

    ``consumer`` is a :class:`confluent_kafka.Consumer` whose ``group.id`` is the group to read and
    which never subscribes (it does not join the group, so reading never moves its partitions).
    The admin client's ``list_consumer_group_offsets`` is not used on purpose: with librdkafka
    2.16 a request that outlives a broker outage aborts the whole process
    (``rd_kafka_enq_once_del_source_return: Assertion `eonce->refcnt > 0' failed``), which is what
    stopped ``threes run`` in a broker restart drill. The consumer's ``committed`` call times out
    with an error instead.

    Returns:
        ``(topic, partition)`` -> the next offset the group will read, ``None`` when the group has
        committed nothing there.

    Raises:
        SetupError: no answer within ``timeout_s`` seconds (Kafka or the group coordinator is away).
    """
    wanted = [TopicPartition(t, p) for t, p in sorted(set(partitions))]
    if not wanted:
        return {}
    try:
        answer = consumer.committed(wanted, timeout=timeout_s)
    except KafkaException as exc:
        raise SetupError(f"cannot read the committed offsets: {exc}") from exc
    return {(tp.topic, tp.partition): (int(tp.offset) if tp.offset >= 0 else None) for tp in answer}


class GroupOffsets:
    """Committed offsets of consumer groups, read with one kept-open consumer per group.

    Each consumer has the group's ``group.id`` and never subscribes (:func:`committed_offsets`).

    Args:
        kafka: the pipeline's ``KafkaConfig``.
    """

    def __init__(self, kafka: Any):
        self.kafka = kafka
        self.consumers: dict[str, Any] = {}
        """Group -> its reading consumer, made on the group's first read."""

    def read(
        self, group: str, partitions: Iterable[tuple[str, int]], timeout_s: float = 10.0
    ) -> dict[tuple[str, int], int]:
        """``(topic, partition)`` -> committed offset of ``group``, for those of ``partitions`` it committed.

        Raises:
            SetupError: no answer within ``timeout_s`` seconds (as :func:`committed_offsets`).
        """
        from kernel.kafka import clients

        if group not in self.consumers:
            self.consumers[group] = clients.kafka_consumer(self.kafka, group)
        answer = committed_offsets(self.consumers[group], partitions, timeout_s)
        return {tp: offset for tp, offset in answer.items() if offset is not None}

    def close(self) -> None:
        """Close the consumers."""
        for consumer in self.consumers.values():
            consumer.close()
        self.consumers.clear()


def end_offsets(kafka_config: Mapping[str, Any], topic: str, timeout_s: float = 10.0) -> dict[int, int]:
    """Return the high watermark (next offset to be written) of every partition.

    Raises:
        SetupError: the topic does not exist, or Kafka did not answer within ``timeout_s``
            (a partition without a leader is asked again until then: :func:`watermark_offsets`).
    """
    consumer = Consumer({**kafka_config, "group.id": f"threes-meta-{uuid.uuid4().hex}"})
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            raise SetupError(f"topic {topic!r} does not exist")
        return {p: watermark_offsets(consumer, topic, p, timeout_s)[1] for p in meta.partitions}
    finally:
        consumer.close()


def read_latest_per_key(
    kafka_config: Mapping[str, Any], topic: str, timeout_s: float = 30.0
) -> dict[bytes, bytes]:
    """Read a compacted topic from the start to its current end, keeping the latest value per key.

    Tombstones remove their key, exactly as compaction would. Records of
    aborted or open transactions are not read (``read_committed``, see
    :mod:`kernel.kafka.committed`).

    Args:
        kafka_config: librdkafka properties.
        topic: the topic.
        timeout_s: the longest wait for one record, seconds.

    Returns:
        Key bytes -> value bytes of every live key.

    Raises:
        SetupError: the topic does not exist, or the end was not reached in time.
    """
    # read_committed, ended by the consumer's position: a transactional topic's last offset is a commit marker
    from kernel.exceptions import RetriableError
    from kernel.kafka.committed import latest_per_key

    try:
        return latest_per_key(kafka_config, topic, timeout_s)
    except RetriableError as exc:
        raise SetupError(str(exc)) from exc


class InternalTopicOptions(TypedDict):
    """Keyword arguments of :func:`ensure_internal_topic` (and the stores built on it) from a ``KafkaConfig``."""

    replication_factor: int | None
    min_insync_replicas: int | None


def internal_topic_options(kafka: Any) -> InternalTopicOptions:
    """``replication_factor`` / ``min_insync_replicas`` keyword arguments from a ``KafkaConfig``."""
    return {
        "replication_factor": getattr(kafka, "internal_replication_factor", None),
        "min_insync_replicas": getattr(kafka, "internal_min_insync_replicas", None),
    }


def recent_keys(
    kafka_config: Mapping[str, Any], topic: str, per_partition: int = 16, timeout_s: float = 10.0
) -> list[bytes]:
    """The keys of the last few records of every partition of ``topic`` (tombstones included).

    Enough to tell which key schema(s) a topic's keys were written with when no
    version was recorded, without reading the topic.

    Args:
        kafka_config: librdkafka properties.
        topic: the topic.
        per_partition: records read from the end of each partition, at most.
        timeout_s: the longest the whole read may take, seconds.

    Returns:
        Keys, in no particular order; empty when the topic is missing or empty.

    Raises:
        SetupError: a partition's offsets could not be read within ``timeout_s``.
    """
    consumer = Consumer({**kafka_config, "group.id": f"threes-peek-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    keys: list[bytes] = []
    try:
        meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        ends: dict[int, int] = {}
        starts = []
        for p in meta.partitions:
            low, high = watermark_offsets(consumer, topic, p, timeout_s)
            if high > low:
                ends[p] = high
                starts.append(TopicPartition(topic, p, max(low, high - per_partition)))
        if not starts:
            return []
        consumer.assign(starts)
        deadline = time.monotonic() + timeout_s
        while ends and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:  # the end may be a transaction marker: no record, but the position is there
                done = [tp.partition for tp in consumer.position([TopicPartition(topic, p) for p in ends])
                        if tp.offset >= ends[tp.partition]]
                for p in done:
                    ends.pop(p, None)
                continue
            partition, offset, key = msg.partition(), msg.offset(), msg.key()
            if msg.error() or partition is None or offset is None:  # a consumed record always has both
                continue
            if key is not None:
                keys.append(key)
            if offset + 1 >= ends.get(partition, 0):
                ends.pop(partition, None)
    finally:
        consumer.close()
    return keys


def ensure_dead_letter_topic(kafka: Any, topic: str, *, partitions: int = 1) -> int:
    """Create a dead letter topic whose size limit matches its producer's, or read an existing one's.

    A new topic gets ``max.message.bytes`` equal to the producer's ``message.max.bytes``
    (:func:`kernel.dlq.dead_letter_topic_config`) and the project's replication rule
    (:func:`schemas.kafka_admin.create_topic`: ``kafka.internal_replication_factor``, else
    min(3, brokers) replicas).

    Args:
        kafka: the pipeline's ``KafkaConfig``.
        topic: the dead letter topic.
        partitions: partitions of a new topic.

    Returns:
        The largest dead letter record the topic and the producer take, bytes
        (:func:`kernel.dlq.dead_letter_limit`): what :meth:`kernel.dlq.DeadLetter.record` fits under.

    Raises:
        SetupError: Kafka refused the login, the topic's creation or its description.
    """
    from kernel.dlq import dead_letter_limit, dead_letter_topic_config

    conf = kafka.librdkafka_config()
    meta = cluster_metadata(conf, kafka.request_timeout_s)
    if topic not in meta.topics:
        try:
            created = create_topic(conf, topic, partitions=partitions, configs=dead_letter_topic_config(
                kafka.client_config), timeout_s=kafka.request_timeout_s, metadata=meta, **internal_topic_options(kafka))
        except SetupError as exc:
            raise SetupError(f"cannot create dead letter topic {topic!r}: {exc}") from exc
        if created is not None:
            log.info("created dead letter topic=%s partitions=%d max.message.bytes=%d", topic, partitions,
                     dead_letter_limit(kafka.client_config))
            return dead_letter_limit(kafka.client_config)
    limit = topic_configs(conf, topic, kafka.request_timeout_s).get("max.message.bytes")
    return dead_letter_limit(kafka.client_config, int(limit) if limit and limit.isdigit() else None)
