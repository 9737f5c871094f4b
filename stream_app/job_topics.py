"""The job's topics at start-up: input topics that must exist (snapshot topics compacted), output topics created.

:func:`check_input_topics` runs before Spark starts (``threes stream run``); :func:`check_topics`
when the job starts, with the job's own Kafka clients.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

from kernel.config.models import KafkaConfig
from kernel.exceptions import ConfigError, ConfigProblem, FatalError, SetupError
from kernel.kafka.topics import (
    cluster_metadata,
    create_topic,
    ensure_compacted_topic,
    ensure_dead_letter_topic,
    internal_topic_options,
    topic_configs,
)
from stream_app.config import StreamJobConfig
from stream_app.kafka_io import TopicWatermarks

log = logging.getLogger(__name__)


def missing_topic_error(config: StreamJobConfig, topic: str) -> SetupError:
    """The error for an input topic of the job (its events topic or a snapshot topic) that does not exist.

    It names the topic and its key in the config, and says what creates it: the events'
    producer (or ``threes run``, from ``stream.events.topic_spec``), or the snapshot's source.
    """
    if topic == config.events.topic:
        return SetupError(
            f"the events topic {topic!r} (stream.events.topic) does not exist",
            "start its producer first (`threes replay` creates it), create it, or run the pipeline with "
            "`threes run`, which creates it from stream.events.topic_spec",
        )
    where = next((f"stream.snapshots[{i}].topics" for i, s in enumerate(config.snapshots) if topic in s.topics),
                 "stream")
    return SetupError(
        f"the snapshot topic {topic!r} ({where}) does not exist",
        "start its source first (`threes source run` creates its compacted topic), or run the whole pipeline "
        "with `threes run`, which starts the job once the sources took their first snapshot",
    )


def check_input_topics(config: StreamJobConfig, existing: Collection[str]) -> None:
    """Fail before Spark starts when an input topic is missing (the job checks again when it starts).

    Args:
        config: the ``stream:`` section.
        existing: the names of the topics Kafka has (``cluster_metadata(...).topics``).

    Raises:
        SetupError: the first missing snapshot topic, else the missing events topic (:func:`missing_topic_error`).
    """
    for snap in config.snapshots:
        for topic in snap.topics:
            if topic not in existing:
                raise missing_topic_error(config, topic)
    if config.events.topic not in existing:
        raise missing_topic_error(config, config.events.topic)


def check_topics(config: StreamJobConfig, kafka: KafkaConfig, watermarks: TopicWatermarks) -> None:
    """Snapshot topics must be compacted; missing output topics are created.

    Raises:
        SetupError: Kafka refused the login or the broker's certificate, or an input topic is missing
            (:func:`missing_topic_error`).
        ConfigError: a snapshot topic is not compacted.
        FatalError: an output topic could not be created.
    """
    cfg, conf = config, kafka.librdkafka_config()
    # a refused login or an unverifiable broker certificate: SetupError in one line, at once
    cluster_metadata(conf, kafka.request_timeout_s)
    problems = []
    for i, snap in enumerate(cfg.snapshots):
        for topic in snap.topics:
            _require_topic(watermarks, topic, missing_topic_error(cfg, topic))
            policy = topic_configs(conf, topic).get("cleanup.policy", "")
            if "compact" not in policy.split(","):
                problems.append(
                    ConfigProblem(
                        f"stream.snapshots[{i}].topics",
                        f"topic {topic!r} has cleanup.policy={policy!r}: a snapshot reads compacted topics only",
                    )
                )
    if problems:
        raise ConfigError(problems)
    partitions = len(_require_topic(watermarks, cfg.events.topic, missing_topic_error(cfg, cfg.events.topic)))
    _create_output_topics(cfg, kafka, partitions)


def _create_output_topics(cfg: StreamJobConfig, kafka: KafkaConfig, partitions: int) -> None:
    """Create the enriched, dead letter and update topics when missing, with the events topic's partitions.

    Each is replicated by the project's rule (:func:`schemas.kafka_admin.create_topic`); the dead
    letter topic's ``max.message.bytes`` matches the producer's limit
    (:func:`kernel.kafka.topics.ensure_dead_letter_topic`), and a dead letter over it is written
    without its value (:func:`stream_app.records.dead_letter_fields`).
    """
    conf = kafka.librdkafka_config()
    replication = internal_topic_options(kafka)
    ensure_dead_letter_topic(kafka, cfg.dead_letter_topic, partitions=partitions)
    existing = cluster_metadata(conf, kafka.request_timeout_s)
    if cfg.enriched_topic not in existing.topics:
        try:  # already created by a concurrent start is fine (None)
            create_topic(conf, cfg.enriched_topic, partitions=partitions, timeout_s=kafka.request_timeout_s,
                         metadata=existing, **replication)
        except SetupError as exc:
            raise FatalError(f"cannot create topic {cfg.enriched_topic!r}: {exc}") from exc
    for update in cfg.updates:  # latest update per key is all a sink needs: compacted
        ensure_compacted_topic(conf, update.topic, partitions=partitions, **replication)


def _require_topic(watermarks: TopicWatermarks, topic: str, missing: SetupError) -> list[int]:
    """The partitions of ``topic``; a missing topic raises ``missing`` (which says what to do)."""
    try:
        return watermarks.partitions(topic)
    except SetupError as exc:
        if "does not exist" not in str(exc):
            raise
        raise missing from None
