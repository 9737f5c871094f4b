"""Kafka from the stream job: offset ranges, watermarks, the reads of a range.

Offsets are ``{topic: {partition: offset}}`` where ``offset`` is the *next*
offset to read (Kafka's position / high watermark convention), so a range
``[start, end)`` is empty when ``start == end``. JSON renderings use Spark's
``startingOffsets``/``endingOffsets`` format (``{"t":{"0":42}}``). The options
of Spark's Kafka source and sink are :mod:`stream_app.spark_kafka_options`.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from kernel.config.models import KafkaConfig
from kernel.exceptions import FatalError, SetupError
from stream_app.spark_kafka_options import source_options, spark_kafka_options

log = logging.getLogger(__name__)

Offsets = dict[str, dict[int, int]]

def offsets_json(offsets: Mapping[str, Mapping[int, int]]) -> str:
    """Render offsets in Spark's JSON format, keys sorted (stable in logs and headers)."""
    return json.dumps(
        {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(offsets.items())},
        separators=(",", ":"),
    )


def parse_offsets(text: str) -> Offsets:
    """Inverse of :func:`offsets_json`."""
    return {t: {int(p): int(o) for p, o in parts.items()} for t, parts in json.loads(text).items()}


def count_between(start: Mapping[str, Mapping[int, int]], end: Mapping[str, Mapping[int, int]]) -> int:
    """How many offsets lie in ``[start, end)`` over all partitions (records, an upper bound after compaction)."""
    return sum(max(0, o - start.get(t, {}).get(p, 0)) for t, parts in end.items() for p, o in parts.items())


def read_range(spark: Any, kafka: KafkaConfig, start: Offsets | None, end: Offsets, headers: bool = False) -> Any:
    """Batch-read the records in ``[start, end)`` of some topics with Spark's Kafka source.

    Args:
        spark: the SparkSession.
        kafka: the pipeline's Kafka config.
        start: first offsets to read; ``None`` reads from the earliest offsets.
            A partition missing from ``start`` is read from its earliest offset.
        end: offsets to stop before (exclusive); partitions with nothing to read
            are skipped.
        headers: also read the records' headers (column ``headers``).

    Returns:
        Spark's Kafka DataFrame (``key, value, topic, partition, offset,
        timestamp, timestampType[, headers]``), or ``None`` when the range is empty.
    """
    start = start or {}
    wanted: Offsets = {}
    first: dict[str, dict[str, int]] = {}
    for topic, parts in end.items():
        for partition, stop in parts.items():
            begin = start.get(topic, {}).get(partition, -2)  # -2: earliest
            if begin != -2 and begin >= stop:
                continue
            wanted.setdefault(topic, {})[partition] = stop
            first.setdefault(topic, {})[str(partition)] = begin
    if not wanted:
        return None
    reader = spark.read.format("kafka")
    for key, value in source_options(spark_kafka_options(kafka)).items():
        reader = reader.option(key, value)
    return (
        reader.option("assign", json.dumps({t: sorted(p) for t, p in wanted.items()}))
        .option("startingOffsets", json.dumps(first))
        .option("endingOffsets", offsets_json(wanted))
        # compaction deletes offsets inside a range: that is expected, not data loss
        .option("failOnDataLoss", "false")
        .option("includeHeaders", str(headers).lower())
        .load()
    )


class TopicWatermarks:
    """Low/high watermarks of topics, through one long-lived consumer (cheap to ask every micro-batch).

    Args:
        kafka: the pipeline's Kafka config.
        timeout_s: how long one metadata or watermark request may take, seconds.
    """

    def __init__(self, kafka: KafkaConfig, timeout_s: float | None = None):
        from kernel.kafka import clients

        self.timeout_s = timeout_s or kafka.request_timeout_s
        self._kafka = kafka
        self._admin: Any = None
        self._ids: dict[str, str] = {}  # topic -> its Kafka topic id when first asked (topic_ids)
        # read_committed: the end offsets are the last stable offsets, what a read_committed read can reach
        self._consumer = clients.kafka_consumer(
            kafka, f"threes-stream-watermarks-{uuid.uuid4().hex}", isolation_level="read_committed"
        )
        self._partitions: dict[str, tuple[float, list[int]]] = {}

    def partitions(self, topic: str, max_age_s: float = 30.0) -> list[int]:
        """The partitions of ``topic`` (metadata asked again after ``max_age_s`` seconds: partitions may be added).

        A topic whose id was asked (:meth:`topic_ids`) is checked to be the same topic at each refresh.

        Raises:
            SetupError: the topic does not exist or Kafka did not answer.
            FatalError: the topic was deleted, or deleted and created again, since it was first seen.
        """
        known = self._partitions.get(topic)
        if known is None or time.monotonic() - known[0] > max_age_s:
            from confluent_kafka import KafkaError, KafkaException

            try:
                meta = self._consumer.list_topics(topic, timeout=self.timeout_s).topics.get(topic)
            except KafkaException as exc:
                raise SetupError(f"Kafka did not answer metadata for topic {topic!r}: {exc}") from exc
            if meta is None or meta.error is not None or not meta.partitions:
                gone = meta is None or meta.error is not None and meta.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                if known is not None and gone:
                    raise FatalError(f"topic {topic!r} was deleted while the job ran; restart the job once it exists "
                                     "again (its snapshot would otherwise answer from the deleted topic's records)")
                raise SetupError(
                    f"topic {topic!r} does not exist",
                    "create it (the source connector creates its compacted topic) or fix the topic name",
                )
            if topic in self._ids:
                now = self._topic_id(topic, during_run=True)
                if now is not None and now != self._ids[topic]:
                    raise FatalError(
                        f"topic {topic!r} was deleted and created again while the job ran (topic id "
                        f"{self._ids[topic]}, now {now}); restart the job: it reads the new topic from its beginning "
                        "(its snapshot would otherwise mix the two topics' records)"
                    )
            known = (time.monotonic(), sorted(meta.partitions))
            self._partitions[topic] = known
        return known[1]

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str]:
        """Kafka's id of each topic (KIP-516): a topic deleted and created again has a new one.

        The first id seen is kept, and :meth:`partitions` checks it at each metadata refresh.

        Returns:
            Topic -> id (22 characters, base64).

        Raises:
            SetupError: a topic does not exist, or Kafka did not answer.
        """
        for topic in topics:
            if topic not in self._ids:
                found = self._topic_id(topic)
                assert found is not None  # at start-up an unanswered describe raises
                self._ids[topic] = found
        return {t: self._ids[t] for t in topics}

    def _topic_id(self, topic: str, during_run: bool = False) -> str | None:
        """Kafka's id of ``topic``.

        Args:
            topic: the topic.
            during_run: a check while the job runs: when Kafka does not answer (a controller or a leader
                moving, the timeout), ``None`` is returned and the next metadata refresh asks again, as
                the JVM store's topic check does; at start-up that is an error.

        Raises:
            SetupError: the topic does not exist, or (at start-up) Kafka did not answer.
        """
        from confluent_kafka import KafkaError, KafkaException, TopicCollection

        from kernel.kafka import clients

        if self._admin is None:
            self._admin = clients.kafka_admin(self._kafka)
        try:
            futures = self._admin.describe_topics(TopicCollection([topic]), request_timeout=self.timeout_s)
            description = futures[topic].result(self.timeout_s)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise SetupError(f"topic {topic!r} does not exist", "create it or fix the topic name") from exc
            if during_run:
                log.warning("topic=%s id not checked this time: Kafka did not answer (%s)", topic, exc)
                return None
            raise SetupError(f"Kafka did not describe topic {topic!r}: {exc}") from exc
        return str(description.topic_id)

    def _marks(self, topics: Iterable[str], which: int) -> Offsets:
        from kernel.kafka.topics import watermark_offsets

        out: Offsets = {}
        for topic in topics:
            out[topic] = {}
            for partition in self.partitions(topic):  # a leader moving is waited out up to the timeout
                try:
                    out[topic][partition] = watermark_offsets(self._consumer, topic, partition, self.timeout_s)[which]
                except SetupError:
                    self.partitions(topic, max_age_s=0)  # a topic deleted (or created again) says so
                    raise
        return out

    def end_offsets(self, topics: Iterable[str]) -> Offsets:
        """High watermarks: the next offset to be written, per partition."""
        return self._marks(topics, 1)

    def start_offsets(self, topics: Iterable[str]) -> Offsets:
        """Low watermarks: the first offset still stored, per partition."""
        return self._marks(topics, 0)

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()


class RangeReader:
    """Reads small offset ranges on the driver with one long-lived consumer (raw bytes, not decoded).

    A Spark batch read of a few hundred records costs a job and fresh Kafka
    consumers in the executors, most of a second; a snapshot refresh between
    micro-batches usually has a few records to read. Decoding still happens
    in the JVM (the bytes become a DataFrame).

    Args:
        kafka: the pipeline's Kafka config.
        timeout_s: the longest wait for records known to exist, seconds.
    """

    def __init__(self, kafka: KafkaConfig, timeout_s: float = 30.0):
        from kernel.kafka import clients

        self.timeout_s = timeout_s
        self._consumer = clients.kafka_consumer(
            kafka, f"threes-stream-ranges-{uuid.uuid4().hex}", isolation_level="read_committed"
        )

    def read(self, start: Offsets, end: Offsets) -> Any:
        """The records in ``[start, end)`` (a missing start partition reads from its beginning).

        Returns:
            A ``pyarrow.Table``: ``key, value`` (binary), ``topic`` (string),
            ``partition`` (int32), ``offset`` (int64).

        Raises:
            SetupError: the end offsets were not reached within ``timeout_s``.
        """
        import pyarrow as pa
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        wanted = {
            (t, p): (start.get(t, {}).get(p, OFFSET_BEGINNING), stop)
            for t, parts in end.items()
            for p, stop in parts.items()
            if start.get(t, {}).get(p, 0) < stop
        }
        cols: dict[str, list[Any]] = {"key": [], "value": [], "topic": [], "partition": [], "offset": []}
        if wanted:
            self._consumer.assign([TopicPartition(t, p, first) for (t, p), (first, _) in wanted.items()])
            pending = dict(wanted)
            left = sum(stop - max(first, 0) for first, stop in wanted.values())  # at most, after compaction
            deadline = time.monotonic() + self.timeout_s
            try:
                while pending:
                    if time.monotonic() > deadline:
                        raise SetupError(f"could not read offsets up to {offsets_json(end)} within {self.timeout_s} s")
                    # consume() returns early only once it has num_messages: ask for what can still come
                    for msg in self._consumer.consume(num_messages=max(1, min(10_000, left)), timeout=0.1):
                        if msg.error():
                            continue
                        left -= 1
                        tp = (msg.topic(), msg.partition())
                        if tp not in pending or msg.offset() >= pending[tp][1]:
                            continue
                        cols["key"].append(msg.key())
                        cols["value"].append(msg.value())
                        cols["topic"].append(tp[0])
                        cols["partition"].append(tp[1])
                        cols["offset"].append(msg.offset())
                    # compaction leaves gaps: a partition is done when its position reached the end offset
                    positions = self._consumer.position([TopicPartition(t, p) for t, p in pending])
                    for tp in positions:
                        if tp.offset >= pending[(tp.topic, tp.partition)][1]:
                            pending.pop((tp.topic, tp.partition))
            finally:
                self._consumer.unassign()
        return pa.table(
            {
                "key": pa.array(cols["key"], pa.binary()),
                "value": pa.array(cols["value"], pa.binary()),
                "topic": pa.array(cols["topic"], pa.string()),
                "partition": pa.array(cols["partition"], pa.int32()),
                "offset": pa.array(cols["offset"], pa.int64()),
            }
        )

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()

