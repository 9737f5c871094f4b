"""Kafka topic helpers: create compacted topics, read a compacted topic to its end.

A compacted topic (``cleanup.policy=compact``) keeps the latest record per key;
a record whose value is ``null`` is a tombstone and deletes the key
(Kafka documentation, "Log Compaction"). The state topics, the schema topic
and the source offsets topic are all compacted.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from connectors.exceptions import ConfigError, SetupError

log = logging.getLogger(__name__)


def _admin(kafka_config: Mapping[str, Any]) -> AdminClient:
    return AdminClient(dict(kafka_config))


# librdkafka reports these through error_cb while list_topics only sees "transport failure":
# a wrong password or an untrusted certificate never heals by waiting.
_REFUSED = {"_AUTHENTICATION": "authentication", "SASL_AUTHENTICATION_FAILED": "authentication", "_SSL": "tls"}
_BROKER_PREFIX = re.compile(r"^\S+://\S+?/(?:bootstrap|\d+): ")
_STATE_SUFFIX = re.compile(r" \(after \d+ms in state \w+\)$")


def cluster_metadata(kafka_config: Mapping[str, Any], timeout_s: float = 10.0) -> Any:
    """Return the cluster's metadata; a refused login or TLS handshake fails at once, in one line.

    librdkafka retries a broker that refuses the credentials or presents a
    certificate it cannot verify (wrong CA, or issued for another host name)
    and ``list_topics`` reports only a timeout. Here the client's ``error_cb``
    is served between short metadata requests, so such a failure raises on
    its first occurrence instead of after ``timeout_s``.

    Args:
        kafka_config: librdkafka properties (secrets included; never logged).
        timeout_s: Seconds to wait for a broker that does not answer at all.

    Returns:
        ``confluent_kafka.admin.ClusterMetadata`` of every topic.

    Raises:
        SetupError: Authentication refused, TLS verification failed (both at
            once), or no answer within ``timeout_s`` seconds. The message is one
            line naming the bootstrap servers and, for a login, the user; it never
            holds the password.
    """
    refused: list[Any] = []

    def on_error(err: Any) -> None:
        if err.name() in _REFUSED:
            refused.append(err)

    # log_level 0: the failure is reported once, by us, not as librdkafka log lines on stderr
    admin = AdminClient({**kafka_config, "error_cb": on_error, "log_level": 0})
    bootstrap = kafka_config.get("bootstrap.servers")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return admin.list_topics(timeout=max(0.1, min(0.5, deadline - time.monotonic())))
        except KafkaException as exc:
            admin.poll(0)
            if refused:
                raise _refused_error(kafka_config, refused[0]) from exc
            if time.monotonic() >= deadline:
                raise SetupError(
                    f"Kafka at {bootstrap} did not answer within {timeout_s:g} s ({_short(exc.args[0].str())})",
                    "check kafka.bootstrap_servers, or start the local stack with `threes local up`",
                ) from exc


def check_credentials(kafka_config: Mapping[str, Any], timeout_s: float = 10.0) -> bool:
    """Fail at once when the brokers refuse our login or certificate; tolerate brokers that are down.

    For long-running processes at start-up (``source run``, ``sync run``): a wrong
    password or CA never heals, so it ends the process in one line before any
    producer or consumer logs its retries; a broker that does not answer yet may
    come back, and the runtime's retries and supervision handle that.

    Args:
        kafka_config: librdkafka properties.
        timeout_s: Seconds to wait for an answer.

    Returns:
        ``True`` when the brokers answered, ``False`` when none did within ``timeout_s``.

    Raises:
        SetupError: The login was refused or the broker's certificate failed verification.
    """
    try:
        cluster_metadata(kafka_config, timeout_s)
    except SetupError as exc:
        if not getattr(exc, "refused", False):
            log.warning("%s", exc)
            return False
        raise
    return True


def _short(text: str) -> str:
    return _STATE_SUFFIX.sub("", _BROKER_PREFIX.sub("", " ".join(text.split())))


def _refused_error(kafka_config: Mapping[str, Any], err: Any) -> SetupError:
    bootstrap = kafka_config.get("bootstrap.servers")
    detail = _short(err.str())
    if _REFUSED[err.name()] == "authentication":
        user = kafka_config.get("sasl.username")
        mechanism = kafka_config.get("sasl.mechanism", "PLAIN")
        error = SetupError(
            f"Kafka at {bootstrap} refused the login of user {user!r} ({mechanism}): {detail}",
            "check kafka.sasl_username and kafka.sasl_password",
        )
    else:
        why = _tls_verify_message(str(bootstrap or ""), kafka_config.get("ssl.ca.location"))
        if why:  # librdkafka says only "certificate verify failed"; OpenSSL through Python says why
            detail = f"the broker's certificate was refused: {why}"
        error = SetupError(
            f"TLS with Kafka at {bootstrap} failed: {detail}",
            "check kafka.ssl_ca_location and that the broker's certificate names the host in kafka.bootstrap_servers",
        )
    error.refused = True  # type: ignore[attr-defined] - read by check_credentials: waiting cannot help
    return error


def _tls_verify_message(bootstrap: str, ca_location: str | None, timeout_s: float = 3.0) -> str | None:
    """Return why the first bootstrap server's certificate fails verification (host name, issuer...), or None.

    One TLS handshake with the same trust (``ca_location``, else the system's CAs)
    and host name check as librdkafka; nothing is sent after the handshake.
    """
    import socket
    import ssl

    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    if not host or not port.isdigit():
        return None
    host = host.strip("[]")
    try:
        context = ssl.create_default_context(cafile=ca_location or None)
        with (
            socket.create_connection((host, int(port)), timeout=timeout_s) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return None
    except ssl.SSLCertVerificationError as exc:
        return str(exc.verify_message or exc).rstrip(".")
    except (OSError, ValueError):
        return None


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
    metadata = cluster_metadata(kafka_config, timeout_s)
    admin = _admin(kafka_config)
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
        from connectors import clients

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
    :mod:`connectors.runtime.committed`).

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
    from connectors.exceptions import RetriableError
    from connectors.runtime.committed import latest_per_key

    try:
        return latest_per_key(kafka_config, topic, timeout_s)
    except RetriableError as exc:
        raise SetupError(str(exc)) from exc


def internal_topic_settings(
    brokers: int, replication_factor: int | None = None, min_insync_replicas: int | None = None
) -> tuple[int, int]:
    """The replication factor and ``min.insync.replicas`` of an internal topic.

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

    The factor and ``min.insync.replicas`` come from :func:`internal_topic_settings`.
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
    rf, isr = internal_topic_settings(len(metadata.brokers), replication_factor, min_insync_replicas)
    existing = metadata.topics.get(topic)
    if existing is not None and existing.error is None and existing.partitions:
        replicas = min(len(p.replicas) for p in existing.partitions.values())
        if replicas < rf:
            log.warning(
                "internal topic=%s has %d replica(s), fewer than the %d configured: losing a broker can lose it; "
                "raise it with a partition reassignment (kafka-reassign-partitions.sh)", topic, replicas, rf,
            )
    created = ensure_compacted_topic(
        kafka_config,
        topic,
        partitions=partitions,
        replication_factor=rf,
        configs={"min.insync.replicas": str(isr)},
        timeout_s=timeout_s,
    )
    if created:
        log.info("internal topic=%s replication_factor=%d min.insync.replicas=%d", topic, rf, isr)
    return created


def internal_topic_options(kafka: Any) -> dict[str, int | None]:
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
            if msg.error():
                continue
            if msg.key() is not None:
                keys.append(msg.key())
            if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                ends.pop(msg.partition(), None)
    finally:
        consumer.close()
    return keys
