"""Read a topic ``read_committed`` up to the end it had when the read began.

Topics written by transactional producers (``exactly_once`` sources, and every
source in ``--group`` mode) hold *control records* (commit/abort markers) that
a consumer never receives, and records of open or aborted transactions that a
``read_committed`` consumer skips or waits behind (Kafka's *last stable
offset*, KIP-98). So "the last record read has offset ``end - 1``" is no way to
know a read reached the end: the last offset may be a marker. This module
compares the consumer's *position* (which moves past markers and aborted
records) with the high watermark taken when the read began.

A transaction open at that moment holds the last stable offset back until it
commits or aborts (at most the producer's ``transaction.timeout.ms``), so a
read waits for it: that is the point, a committed position written just after
an open transaction of another task must not be missed.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from kernel.exceptions import RetriableError, SetupError
from kernel.kafka.clients import CONSUMER_DEFAULTS
from schemas.kafka_admin import watermark_offsets

log = logging.getLogger(__name__)

READ_COMMITTED = {"isolation.level": "read_committed"}
"""librdkafka properties of every consumer that reads state, positions or tasks' output."""


def high_watermarks(kafka_config: Mapping[str, Any], topic: str, timeout_s: float = 10.0) -> dict[int, int]:
    """The high watermark of every partition of ``topic`` (past open transactions, unlike the LSO).

    A ``read_committed`` consumer's watermark query answers the last stable
    offset, which stays behind an open transaction; this asks
    ``read_uncommitted``.

    Returns:
        Partition -> next offset to be written.

    Raises:
        SetupError: the topic does not exist or Kafka did not answer.
    """
    consumer = Consumer(
        {**kafka_config, "group.id": f"threes-meta-{uuid.uuid4().hex}", "isolation.level": "read_uncommitted"}
    )
    try:
        try:
            meta = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
        except KafkaException as exc:
            raise SetupError(f"Kafka did not answer metadata for topic {topic!r}: {exc}") from exc
        if meta is None or meta.error is not None:
            raise SetupError(f"topic {topic!r} does not exist")
        out: dict[int, int] = {}
        for p in meta.partitions:  # a leader moving is waited out up to the timeout
            out[p] = watermark_offsets(consumer, topic, p, timeout_s)[1]
        return out
    finally:
        consumer.close()


def read_committed(
    kafka_config: Mapping[str, Any],
    topic: str,
    ends: Mapping[int, int],
    starts: Mapping[int, int] | None = None,
    timeout_s: float = 30.0,
    batch: int = 10_000,
) -> Iterator[list[Any]]:
    """Yield the committed records of ``topic`` from ``starts`` up to ``ends``, in batches.

    Args:
        kafka_config: librdkafka properties.
        topic: the topic.
        ends: partition -> offset to read up to (exclusive), usually :func:`high_watermarks`.
        starts: partition -> first offset (default: each partition's beginning).
        timeout_s: the longest time without progress, seconds (an open transaction
            of another producer holds the read back until it ends).
        batch: records per ``consume`` call.

    Yields:
        Lists of ``confluent_kafka.Message`` (no errors, no markers), offsets below ``ends``.

    Raises:
        RetriableError: no progress within ``timeout_s`` (the broker is away, or a
            transaction stays open), or the consumer reported an error.
    """
    starts = starts or {}
    pending = {p: end for p, end in ends.items() if end > starts.get(p, 0)}
    if not pending:
        return
    consumer = _reader(kafka_config)
    try:
        consumer.assign([TopicPartition(topic, p, starts.get(p, 0)) for p in pending])
        last_progress = time.monotonic()
        last_positions: dict[int, int] = {}
        while pending:
            # consume() waits for the whole batch or the timeout: keep the timeout short
            msgs = consumer.consume(batch, timeout=0.2)
            out = _below_ends(topic, msgs, pending)
            if out:
                yield out
            moved = _drop_finished(consumer, topic, pending, last_positions)
            if msgs or moved:
                last_progress = time.monotonic()
            elif pending and time.monotonic() - last_progress > timeout_s:
                raise RetriableError(
                    f"topic {topic!r}: read stopped at {last_positions} before the end offsets {dict(ends)} "
                    f"for {timeout_s} s (broker away, or a transaction of another producer still open)"
                )
    finally:
        consumer.close()


def _reader(kafka_config: Mapping[str, Any]) -> Consumer:
    """A ``read_committed`` consumer of its own group that commits nothing (it only reads)."""
    return Consumer(
        {
            **CONSUMER_DEFAULTS,
            **kafka_config,
            **READ_COMMITTED,
            "group.id": f"threes-read-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }
    )


def _below_ends(topic: str, msgs: list[Any], pending: Mapping[int, int]) -> list[Any]:
    """The records of ``msgs`` below their partition's end offset.

    Raises:
        RetriableError: the consumer reported an error.
    """
    out = []
    for msg in msgs:
        if msg.error():
            raise RetriableError(f"topic {topic!r}: {msg.error()}")
        partition, offset = msg.partition(), msg.offset()
        end = pending.get(partition) if partition is not None else None
        if end is not None and offset is not None and offset < end:
            out.append(msg)
    return out


def _drop_finished(consumer: Consumer, topic: str, pending: dict[int, int], positions: dict[int, int]) -> bool:
    """Unassign the partitions whose position reached their end; note the positions of the others.

    Compaction leaves gaps and transactions leave markers: the position, not the last
    record, says where the read is.

    Returns:
        Whether a partition's position moved since the last call.
    """
    moved = False
    for tp in consumer.position([TopicPartition(topic, p) for p in pending]):
        if tp.offset >= pending[tp.partition]:
            pending.pop(tp.partition)
            consumer.incremental_unassign([TopicPartition(topic, tp.partition)])
        elif tp.offset != positions.get(tp.partition):
            positions[tp.partition] = tp.offset
            moved = True
    return moved


def latest_per_key(kafka_config: Mapping[str, Any], topic: str, timeout_s: float = 30.0) -> dict[bytes, bytes]:
    """Read a compacted topic ``read_committed`` to its end, keeping the latest value per key.

    Tombstones remove their key, as compaction would.

    Returns:
        Key bytes -> value bytes of every live key.

    Raises:
        SetupError: the topic does not exist.
        RetriableError: the end was not reached in time.
    """
    latest: dict[bytes, bytes] = {}
    ends = high_watermarks(kafka_config, topic, timeout_s)
    for msgs in read_committed(kafka_config, topic, ends, timeout_s=timeout_s):
        for msg in msgs:
            if msg.value() is None:
                latest.pop(msg.key(), None)
            else:
                latest[msg.key()] = msg.value()
    return latest
