"""Read the live keys of a compacted state topic (for key-set reconciliation).

A source without change data capture learns about deletes by comparing the keys
its system holds with the keys it emitted. The keys it emitted are exactly the
live keys of its compacted topic (latest record per key not a tombstone), so
the topic itself is the memory: nothing is kept in the worker between runs, and
a restart or a second worker sees the same set.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from connectors.exceptions import RetriableError
from connectors.topics import end_offsets

log = logging.getLogger(__name__)


def live_keys(
    kafka_config: Mapping[str, Any],
    topic: str,
    header: str | None = None,
    timeout_s: float = 30.0,
) -> tuple[dict[bytes, str | None], dict[int, int]]:
    """Read ``topic`` from its start to its current end offsets, keeping keys only.

    Values are not kept (only whether the latest one is a tombstone), so a
    million keys of any size cost the memory of the keys.

    Args:
        kafka_config: librdkafka properties.
        topic: the compacted state topic.
        header: a header whose latest value per key is returned with it (UTF-8),
            e.g. the S3 object a row came from; ``None`` for none.
        timeout_s: the longest wait for one record, seconds.

    Returns:
        ``(live, ends)``: key bytes -> header value (or ``None``) for every key
        whose latest record is not a tombstone, and the end offsets read to.

    Raises:
        RetriableError: the end was not reached in time (the broker is slow or away).
    """
    ends = end_offsets(kafka_config, topic, timeout_s)
    live: dict[bytes, str | None] = {}
    pending = {p for p, end in ends.items() if end > 0}
    if not pending:
        return live, ends
    consumer = Consumer(
        {
            **kafka_config,
            "group.id": f"threes-reconcile-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in pending])
        last_progress = time.monotonic()
        while pending:
            # consume() waits for the whole batch or the timeout: keep the timeout short
            msgs = consumer.consume(10_000, timeout=0.2)
            if not msgs:
                if time.monotonic() - last_progress > timeout_s:
                    raise RetriableError(
                        f"topic {topic!r}: no record within {timeout_s} s before its end offsets {ends}"
                    )
                continue
            last_progress = time.monotonic()
            for msg in msgs:
                if msg.error():
                    raise RetriableError(f"topic {topic!r}: {msg.error()}")
                p = msg.partition()
                if p not in pending:
                    continue
                if msg.offset() < ends[p]:
                    if msg.value() is None:
                        live.pop(msg.key(), None)
                    else:
                        tag = None
                        if header is not None:
                            for name, val in msg.headers() or ():
                                if name == header and val is not None:
                                    tag = val.decode()
                        live[msg.key()] = tag
                if msg.offset() + 1 >= ends[p]:
                    pending.discard(p)
    finally:
        consumer.close()
    log.debug("read live keys topic=%s keys=%d ends=%s", topic, len(live), ends)
    return live, ends
