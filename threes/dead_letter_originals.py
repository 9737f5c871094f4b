"""The originals of dead letters written without parts of them (``dlq.omitted``), read back from their topics.

A dead letter larger than its topic takes is written without its value (:mod:`kernel.dlq`);
``threes dlq replay`` (:func:`threes.dead_letters.replay`) then reads the original record from
``dlq.topic`` at ``dlq.partition`` and ``dlq.offset``, while that topic still holds it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

from kernel.dlq import PREFIX
from kernel.exceptions import SetupError, ThreesError
from threes.dead_letters import Letter

log = logging.getLogger(__name__)


def with_originals(kafka: Any, letters: Sequence[Letter], timeout_s: float = 30.0) -> list[Letter]:
    """The letters, each one written without parts of its original (``dlq.omitted``) completed from it.

    The original is read from ``dlq.topic`` at ``dlq.partition`` and ``dlq.offset`` (no consumer group).

    Args:
        kafka: the pipeline's ``KafkaConfig``.
        letters: dead letters.
        timeout_s: the longest wait for one original record, seconds.

    Returns:
        The letters in order; a completed one carries the original key, value and headers after its
        ``dlq.*`` headers.

    Raises:
        ThreesError: an original is no longer in its topic (below its log start offset: deleted by
            retention; or the offset was compacted away), naming the dead letter and why.
        SetupError: Kafka did not answer.
    """
    partial = [letter for letter in letters if letter.omitted]
    if not partial:
        return list(letters)
    from confluent_kafka import Consumer

    consumer = Consumer({**kafka.librdkafka_config(), "group.id": f"threes-dlq-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "auto.offset.reset": "error"})
    try:
        done = {letter.id: _completed(consumer, letter, timeout_s) for letter in partial}
    finally:
        consumer.close()
    return [done.get(letter.id, letter) for letter in letters]


def _completed(consumer: Any, letter: Letter, timeout_s: float) -> Letter:
    """``letter`` with the original's key, value and headers, read at its ``dlq.*`` position."""
    from confluent_kafka import TopicPartition

    assert letter.context is not None  # omitted comes from the context
    ctx = letter.context
    where = f"{ctx.topic}[{ctx.partition}]@{ctx.offset}"
    parts = ",".join(letter.omitted)
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(ctx.topic, ctx.partition), timeout=10)
    except Exception as exc:  # a deleted topic raises UNKNOWN_TOPIC_OR_PART
        raise ThreesError(f"dead letter {letter.id} was written without its {parts} and its original {where} "
                          f"cannot be read: {exc}") from None
    if not low <= ctx.offset < high:
        raise ThreesError(
            f"dead letter {letter.id} was written without its {parts} (the original, {ctx.original_bytes} bytes, "
            f"was larger than the dead letter topic takes) and {ctx.topic} no longer holds it: partition "
            f"{ctx.partition} starts at offset {low} now (deleted by retention); it cannot be replayed")
    consumer.assign([TopicPartition(ctx.topic, ctx.partition, ctx.offset)])
    msg = _poll_one(consumer, timeout_s, where)
    if msg.offset() != ctx.offset:
        raise ThreesError(f"dead letter {letter.id} was written without its {parts} and offset {ctx.offset} of "
                          f"{ctx.topic}[{ctx.partition}] is gone (compacted away: the next record is at "
                          f"{msg.offset()}); it cannot be replayed")
    if "key" not in letter.omitted and msg.key() != letter.key:
        raise ThreesError(f"dead letter {letter.id}: the record at {where} has another key than the dead letter; "
                          "it cannot be replayed from there")
    ours = tuple((k, v) for k, v in letter.headers if k.startswith(PREFIX))
    original = tuple((k, v or b"") for k, v in (msg.headers() or []))
    log.info("dead letter %s: original read back from %s (%d bytes)", letter.id, where, len(msg.value() or b""))
    return Letter(letter.dlq_topic, letter.partition, letter.offset, letter.timestamp_ms, letter.context,
                  msg.key(), msg.value(), ours + original)


def _poll_one(consumer: Any, timeout_s: float, where: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error() is not None:
            raise SetupError(f"reading the original {where}: {msg.error()}")
        return msg
    raise SetupError(f"the original {where} was not read within {timeout_s} s")
