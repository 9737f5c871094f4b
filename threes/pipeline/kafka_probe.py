"""What ``threes run`` reads from Kafka: topics, watermarks, stored positions, consumer groups.

Everything here is read-only and cheap (Kafka metadata, watermarks and committed
offsets), read about once a second by the supervisor. Nothing asks a sink's system:
the view shows what Kafka knows (records per topic, what each sync service committed),
which means the same for every kind of sink.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kernel.exceptions import SetupError
from kernel.kafka import clients

log = logging.getLogger(__name__)


class KafkaOutage(SetupError):
    """Kafka stopped answering after it had answered in this run (a broker restart, a network cut).

    The supervisor waits for it (up to its start timeout) instead of stopping the pipeline; a
    Kafka that never answered is a :class:`SetupError` at once (a wrong address, refused login).
    """

@dataclass
class Flow:
    """One reading of the pipeline from Kafka.

    Attributes:
        at: ``time.time()`` of the reading.
        topics: topic -> records in it (sum over partitions of high minus low watermark; ``None``: missing).
        committed: sync service -> records its consumer group committed on its topics.
        lag: sync service -> records of its topics not yet committed.
    """

    at: float
    topics: dict[str, int | None] = field(default_factory=dict)
    committed: dict[str, int] = field(default_factory=dict)
    lag: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class FlowPlan:
    """What a flow reading reads: plain names only, so it crosses to a reading child process.

    Attributes:
        topics: the pipeline's topics in flow order (:func:`pipeline_topics`).
        groups: ``(sync service, its consumer group, its topics sorted)`` per sync service.
    """

    topics: tuple[str, ...]
    groups: tuple[tuple[str, str, tuple[str, ...]], ...]

    @classmethod
    def of(cls, pipeline: Any) -> FlowPlan:
        """The plan of a pipeline config."""
        groups = tuple(
            (svc.name, svc.consumer_group(), tuple(sorted({t for s in svc.sinks for t in s.topics})))
            for svc in pipeline.sync
        )
        return cls(tuple(pipeline_topics(pipeline)), groups)

RENEW_AFTER_S = 5.0
"""Seconds of failing watermark reads after which :class:`KafkaProbe` renews its consumer."""


class KafkaProbe:
    """Reads topics, stored positions and consumer groups (clients kept open between readings).

    Args:
        kafka: the pipeline's ``KafkaConfig``.
        offsets_topic: where the sources keep their positions.
    """

    def __init__(self, kafka: Any, offsets_topic: str = "_threes_offsets"):
        from kernel.kafka.topics import GroupOffsets

        self.kafka = kafka
        self.offsets_topic = offsets_topic
        self._consumer = clients.kafka_consumer(kafka, f"threes-run-probe-{uuid.uuid4().hex[:8]}")
        self._suspect_since: float | None = None  # when a watermark read failed, until one succeeds
        self._renewed_at = time.monotonic()
        self._admin = clients.kafka_admin(kafka)
        self._groups = GroupOffsets(kafka)
        self._topics: tuple[float, dict[str, Any]] | None = None
        self.answered = False
        """Whether Kafka answered a metadata request of this probe once (later failures are outages)."""

    def topics(self, max_age_s: float = 1.0) -> dict[str, Any]:
        """Topic name -> metadata of every topic, listed at most ``max_age_s`` ago.

        Raises:
            SetupError: Kafka did not answer.
        """
        from kernel.kafka.topics import cluster_metadata

        now = time.monotonic()
        if self._topics is None or now - self._topics[0] >= max_age_s:
            try:
                meta = cluster_metadata(self.kafka.librdkafka_config(), self.kafka.request_timeout_s)
            except SetupError as exc:
                if self.answered:  # it answered earlier in this run: an outage, not a wrong address
                    raise KafkaOutage(str(exc)) from exc
                raise
            self.answered = True
            self._topics = (now, {t: m for t, m in meta.topics.items() if m.error is None and m.partitions})
        return self._topics[1]

    def missing(self, topics: Iterable[str]) -> list[str]:
        """Those of ``topics`` that do not exist (yet)."""
        present = self.topics()
        return [t for t in topics if t not in present]

    def stored_positions(self) -> set[str]:
        """Connectors with a position stored in the offsets topic (they have written to their topic)."""
        from connectors.runtime.offsets import OffsetStore

        if self.offsets_topic not in self.topics(max_age_s=0):
            return set()
        store = OffsetStore(self.kafka.librdkafka_config(), self.offsets_topic, self.kafka.request_timeout_s)
        return {p.connector for p in store.load_all().values()}

    def ensure_topic(self, topic: str, spec: Any) -> bool:
        """Create ``topic`` (``cleanup.policy=delete``) from a ``TopicSpec`` when it is missing.

        Returns:
            ``True`` when it was created here, ``False`` when it existed.

        Raises:
            SetupError: Kafka refused the creation.
        """
        from kernel.exceptions import SetupError
        from kernel.kafka.topics import create_topic, internal_topic_options

        if topic in self.topics(max_age_s=0):
            return False
        replication = internal_topic_options(self.kafka)
        if spec.replication_factor is not None:
            replication["replication_factor"] = spec.replication_factor
        try:
            created = create_topic(self.kafka.librdkafka_config(), topic, partitions=spec.partitions,
                                   configs=spec.configs, timeout_s=self.kafka.request_timeout_s, **replication)
        except SetupError as exc:
            raise SetupError(f"cannot create the events topic {topic!r}: {exc}",
                             "create it yourself, or fix stream.events.topic_spec") from exc
        if created is None:
            return False
        self._topics = None
        log.info("created events topic=%s partitions=%d replication_factor=%d", topic, spec.partitions, created[0])
        return True

    def watermarks(
        self, topic: str, partition: int, seen: dict[tuple[str, int], tuple[int, int] | None] | None = None
    ) -> tuple[int, int] | None:
        """``(low, high)`` of one partition; ``None`` when they cannot be read right now.

        A broker answers ``NOT_LEADER_FOR_PARTITION`` for a while after a topic is created or a
        leader moves: one unknown reading, never an error that stops the supervisor. ``seen``
        (one reading's answers so far) is asked first and filled, so a reading asks Kafka once
        per partition.
        """
        from confluent_kafka import KafkaException, TopicPartition

        if seen is not None and (topic, partition) in seen:
            return seen[(topic, partition)]
        if self._suspect_since is not None and time.monotonic() - self._renewed_at >= RENEW_AFTER_S:
            self._renew_consumer()
        try:
            marks = self._consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=5)
        except KafkaException as exc:
            log.info("run: watermarks of %s[%d] not readable yet: %s", topic, partition, exc)
            marks = None
            if self._suspect_since is None:
                self._suspect_since = time.monotonic()
        else:
            self._suspect_since = None
        if seen is not None:
            seen[(topic, partition)] = marks
        return marks

    def _renew_consumer(self) -> None:
        """Replace the watermark consumer (its reads have failed for ``RENEW_AFTER_S``).

        A consumer that is not assigned the partitions it asks about keeps its own view of the
        cluster; after a broker restart one was seen answering "unknown partition" for good
        while a new client read the same partition at once.
        """
        old = self._consumer
        self._consumer = clients.kafka_consumer(self.kafka, f"threes-run-probe-{uuid.uuid4().hex[:8]}")
        self._renewed_at = time.monotonic()
        log.info("run: watermark reads failing since %.0f s ago; the probe's consumer was renewed",
                 self._renewed_at - (self._suspect_since or self._renewed_at))
        old.close()

    def records(
        self, topic: str, seen: dict[tuple[str, int], tuple[int, int] | None] | None = None
    ) -> int | None:
        """Records in ``topic`` (high minus low watermark over its partitions).

        Returns ``None`` when the topic is missing or a partition's watermarks cannot be read right
        now (:meth:`watermarks`; ``seen`` as there).
        """
        meta = self.topics().get(topic)
        if meta is None:
            return None
        total = 0
        for p in meta.partitions:
            marks = self.watermarks(topic, p, seen)
            if marks is None:
                return None
            total += max(0, marks[1] - marks[0])
        return total

    def group_progress(
        self, group: str, topics: Iterable[str], seen: dict[tuple[str, int], tuple[int, int] | None] | None = None
    ) -> tuple[int, int]:
        """``(committed, lag)`` of a consumer group over ``topics``, in records.

        A partition whose watermarks cannot be read right now is left out of this reading
        (:meth:`watermarks`; ``seen`` as there).
        """
        partitions = {t: meta.partitions for t in topics if (meta := self.topics().get(t)) is not None}
        try:
            done = self._groups.read(group, [(t, p) for t, ps in partitions.items() for p in ps], 5)
        except SetupError as exc:
            log.info("run: committed offsets of %s not readable now: %s", group, exc)
            done = {}
        committed = lag = 0
        for topic, parts in partitions.items():
            for p in parts:
                marks = self.watermarks(topic, p, seen)
                if marks is None:
                    continue
                low, high = marks
                at = done.get((topic, p), low)
                committed += max(0, at - low)
                lag += max(0, high - max(at, low))
        return committed, lag

    def flow(self, pipeline: Any) -> Flow:
        """One reading of every topic of the pipeline and every sync service's progress.

        Args:
            pipeline: the pipeline, or its :class:`FlowPlan`.
        """
        plan = pipeline if isinstance(pipeline, FlowPlan) else FlowPlan.of(pipeline)
        reading = Flow(at=time.time())
        seen: dict[tuple[str, int], tuple[int, int] | None] = {}  # the sync services' topics were read above
        for topic in plan.topics:
            reading.topics[topic] = self.records(topic, seen)
        for name, group, topics in plan.groups:
            reading.committed[name], reading.lag[name] = self.group_progress(group, list(topics), seen)
        return reading

    def close(self) -> None:
        """Close the clients."""
        self._consumer.close()
        self._groups.close()


def pipeline_topics(pipeline: Any) -> list[str]:
    """The topics of a pipeline in flow order: state topics, events, enriched, updates, dead letters."""
    topics = [s.topic for s in pipeline.sources]
    stream = pipeline.stream
    if stream is not None:
        topics += [t for snap in stream.snapshots for t in snap.topics]
        topics += [stream.events.topic, stream.enriched_topic, *(u.topic for u in stream.updates)]
    for svc in pipeline.sync:
        topics += [t for s in svc.sinks for t in s.topics]
    dead = ([stream.dead_letter_topic] if stream is not None else []) + [
        svc.dead_letter_topic for svc in pipeline.sync
    ]
    return list(dict.fromkeys([*topics, *dead]))
