"""Helpers of the stream-language tests (where, derive, chained lookups, delete_when): own schemas and topics.

The tests of ``conftest.Env`` use its flights and airports; these tests bring their own
event and snapshot schemas, written next to the test's checkpoint and produced with the
project's serializers into topics named after the test's unique suffix.
"""

from __future__ import annotations

import json
import time
from typing import Any

from kernel.kafka.topics import ensure_compacted_topic
from schemas.serde import AvroSerializer


def write_schema(env: Any, file_name: str, schema: dict[str, Any]) -> str:
    """Write ``schema`` as ``<tmp>/<file_name>`` (the job reads schema paths relative to ``env.tmp``)."""
    (env.tmp / file_name).write_text(json.dumps(schema))
    return file_name


def state_topic(env: Any, name: str, partitions: int = 2) -> str:
    """A compacted snapshot topic of this test."""
    topic = f"state.{name}.{env.unique}"
    ensure_compacted_topic(env.conf, topic, partitions=partitions)
    return topic


def produce(
    env: Any,
    topic: str,
    records: list[tuple[bytes | dict[str, Any], dict[str, Any] | None]],
    value_schema: dict[str, Any],
    key_schema: dict[str, Any] | None = None,
) -> None:
    """Produce ``(key, value)`` pairs; a dict key is encoded with ``key_schema``, a ``None`` value is a tombstone."""
    value_ser = AvroSerializer(value_schema, env.store)
    key_ser = AvroSerializer(key_schema, env.store) if key_schema is not None else None
    failed: list[Any] = []
    for key, value in records:
        raw_key = key_ser(key) if isinstance(key, dict) and key_ser is not None else key
        env.producer.produce(topic, key=raw_key, value=None if value is None else value_ser(value),
                             on_delivery=lambda err, _msg: failed.append(err) if err is not None else None)
    assert env.producer.flush(30) == 0
    assert not failed, f"{topic}: {len(failed)} record(s) not delivered: {failed[0]}"


def totals(job: Any, events: int, timeout_s: float = 60.0) -> dict[str, int]:
    """The job's counts summed over its micro-batches, once they cover ``events`` events.

    Spark delivers a batch's observed counts through its listener bus, after the batch: they are
    polled until they add up to ``events`` (or the timeout).
    """
    kinds = ("events", "filtered", "enriched", "dead_letters", "updates")
    deadline = time.monotonic() + timeout_s
    while True:
        got = {k: sum(c.get(k, 0) for c in list(job.counts.values())) for k in kinds}
        if got["events"] >= events or time.monotonic() > deadline:
            return got
        time.sleep(0.5)
