"""Kafka client factories: the one place where threes builds Kafka clients from config.

Every part (sources, stream job, sync service, CLI checks, tests) gets its Kafka clients here,
so timeouts, credentials and loopback settings are the same everywhere. The clients of the
external systems are built by each technology's ``connection`` module
(:func:`connectors.rds.connection.sql_engine`, ...).
"""

from __future__ import annotations

from typing import Any

from kernel.config.models import KafkaConfig

FETCH_QUEUE_BACKOFF_MS = 50
"""librdkafka's ``fetch.queue.backoff.ms`` for threes' consumers (librdkafka's own default: 1000).

When a partition's prefetch queue passes ``queued.min.messages`` or ``queued.max.messages.kbytes``,
librdkafka waits this long before it fetches that partition again, however soon the application
drains the queue: with the default, a consumer working through a backlog stood still for about a
second each time its queue filled. Measured on the local broker (300k update records of ~100 bytes
in 4 partitions, one consumer draining as fast as it could): 1.28-1.30 s with 1000 ms (no record
for 0.95 s after the first 150k), 0.28-0.31 s with 10 or 50 ms. The queue's bounds, and so the
memory it holds, stay as they are: the fetcher only looks again sooner. ``kafka.client_config``
sets another value.
"""

CONSUMER_DEFAULTS: dict[str, Any] = {"fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS}
"""librdkafka properties of every consumer that reads records, under the pipeline's own ``kafka`` settings."""


PRODUCER_DEFAULTS: dict[str, Any] = {"compression.type": "lz4", "linger.ms": 20}
"""librdkafka properties of every producer, under the pipeline's ``kafka.client_config`` (which may tune them)."""


def producer_config(kafka: KafkaConfig, **overrides: Any) -> dict[str, Any]:
    """The librdkafka properties of :func:`kafka_producer`.

    :data:`PRODUCER_DEFAULTS`, then the pipeline's Kafka settings (``kafka.client_config``
    tunes ``linger.ms``, ``compression.type``...), then ``acks=all`` and idempotence, then
    ``overrides``.

    Args:
        kafka: the pipeline's Kafka config.
        **overrides: librdkafka properties with ``.`` written as ``_``
            (``linger_ms=50`` -> ``linger.ms``).
    """
    conf = {**PRODUCER_DEFAULTS, **kafka.librdkafka_config(), "acks": "all", "enable.idempotence": True}
    conf.update({k.replace("_", "."): v for k, v in overrides.items()})
    return conf


def kafka_producer(kafka: KafkaConfig, **overrides: Any) -> Any:
    """An idempotent producer (``acks=all``, ``enable.idempotence``; lz4 and ``linger.ms`` 20 unless tuned).

    Args:
        kafka: the pipeline's Kafka config.
        **overrides: librdkafka properties with ``.`` written as ``_``
            (``linger_ms=50`` -> ``linger.ms``).

    Returns:
        A :class:`confluent_kafka.Producer` configured by :func:`producer_config`.
    """
    from confluent_kafka import Producer

    return Producer(producer_config(kafka, **overrides))


def kafka_consumer(kafka: KafkaConfig, group_id: str, **overrides: Any) -> Any:
    """A consumer with manual commits (offsets are committed by the caller, after durable work).

    Its fetcher looks again 50 ms after its prefetch queue was full (:data:`FETCH_QUEUE_BACKOFF_MS`).

    Args:
        kafka: the pipeline's Kafka config.
        group_id: the consumer group.
        **overrides: librdkafka properties with ``.`` written as ``_``.

    Returns:
        A :class:`confluent_kafka.Consumer`.
    """
    from confluent_kafka import Consumer

    conf = {
        **CONSUMER_DEFAULTS,
        **kafka.librdkafka_config(),
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    conf.update({k.replace("_", "."): v for k, v in overrides.items()})
    return Consumer(conf)


def kafka_admin(kafka: KafkaConfig) -> Any:
    """An admin client for topic metadata and creation."""
    from confluent_kafka.admin import AdminClient

    return AdminClient(kafka.librdkafka_config())
