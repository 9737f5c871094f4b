"""Read the live keys of a compacted state topic (for key-set reconciliation).

A source without change data capture learns about deletes by comparing the keys
its system holds with the keys it emitted. The keys it emitted are exactly the
live keys of its compacted topic (latest record per key not a tombstone), so
the topic itself is the memory: nothing is kept in the worker between runs, and
a restart or a second worker sees the same set.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from connectors.runtime.committed import high_watermarks, read_committed

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
    ends = high_watermarks(kafka_config, topic, timeout_s)
    live: dict[bytes, str | None] = {}
    for msgs in read_committed(kafka_config, topic, ends, timeout_s=timeout_s):
        for msg in msgs:
            if msg.value() is None:
                live.pop(msg.key(), None)
            else:
                tag = None
                if header is not None:
                    for name, val in msg.headers() or ():
                        if name == header and val is not None:
                            tag = val.decode()
                live[msg.key()] = tag
    log.debug("read live keys topic=%s keys=%d ends=%s", topic, len(live), ends)
    return live, ends
