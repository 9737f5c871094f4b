"""Dead letter queue records: the contract every part uses.

A record that cannot be processed is produced to a dead letter topic with its
original key and value bytes untouched, and headers that say where it came from
and why (after Kafka Connect's ``errors.deadletterqueue.context.headers.enable``
headers, ``__connect.errors.*``):

========================  =============================================
header                    value (UTF-8)
========================  =============================================
``dlq.topic``             original topic
``dlq.partition``         original partition (decimal)
``dlq.offset``            original offset (decimal)
``dlq.stage``             where it failed: ``decode``, ``transform``, ``write``...
``dlq.error.class``       exception class name
``dlq.error.message``     the error message (secrets masked by ``kernel.redact``)
``dlq.component``         which connector/service/job sent it
``dlq.timestamp_ms``      when it was dead-lettered, epoch milliseconds
``dlq.record.bytes``      the original record's key and value size, bytes (decimal)
``dlq.omitted``           only when parts were left out: ``value``, ``value,headers`` or ``value,headers,key``
========================  =============================================

The original headers are kept after these.

**A dead letter is always writable.** A sink accepts records larger than a Kafka producer's
``message.max.bytes`` (Elasticsearch's ``max_record_bytes`` is 100 MiB), and a record that large
would fail again on its way to the dead letter topic (``MSG_SIZE_TOO_LARGE``) and stop its
partition. So :meth:`DeadLetter.record` fits the record under the dead letter topic's limit
(:func:`dead_letter_limit`): when the original does not fit, its value is left out, then its
original headers, then its key, and ``dlq.omitted`` says which. The ``dlq.*`` context stays, so
``threes dlq replay`` reads the original back from ``dlq.topic`` at ``dlq.partition`` and
``dlq.offset`` while that topic still holds it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kernel.redact import redact

PREFIX = "dlq."

RECORD_BYTES_HEADER = "dlq.record.bytes"
OMITTED_HEADER = "dlq.omitted"

DEFAULT_MESSAGE_MAX_BYTES = 1_000_000
"""librdkafka's default ``message.max.bytes``: the largest record a producer sends unless the
pipeline's ``kafka.client_config`` raises it."""

FRAMING_BYTES = 4096
"""Room left under the limit for the record batch's, the record's and the headers' framing, bytes
(Kafka's record batch header is 61 bytes, each record and header adds a few varints)."""

Headers = Sequence[tuple[str, bytes | None]]


def dead_letter_limit(client_config: Mapping[str, object], topic_max_message_bytes: int | None = None) -> int:
    """The largest dead letter record a part can write, bytes.

    Args:
        client_config: the pipeline's ``kafka.client_config`` (its ``message.max.bytes``, if any, is the
            producer's limit; librdkafka's default otherwise).
        topic_max_message_bytes: the dead letter topic's ``max.message.bytes`` when it exists, ``None``
            when the topic is created with the producer's limit (:func:`dead_letter_topic_config`).

    Returns:
        The smaller of the producer's and the topic's limit.
    """
    producer = int(str(client_config.get("message.max.bytes", DEFAULT_MESSAGE_MAX_BYTES)))
    return producer if topic_max_message_bytes is None else min(producer, topic_max_message_bytes)


def dead_letter_topic_config(client_config: Mapping[str, object]) -> dict[str, str]:
    """Topic settings for a new dead letter topic: ``max.message.bytes`` equal to the producer's limit.

    The topic and the producer that writes it then agree on the largest record; the broker's own
    default (1 MiB) would refuse what a producer with a raised ``message.max.bytes`` sends.
    """
    return {"max.message.bytes": str(dead_letter_limit(client_config))}


def record_bytes(key: bytes | None, value: bytes | None, headers: Headers | None) -> int:
    """A record's payload size: key, value, and each header's name and value, bytes."""
    size = len(key or b"") + len(value or b"")
    for name, data in headers or ():
        size += len(name.encode()) + len(data or b"")
    return size


@dataclass(frozen=True)
class DeadLetter:
    """Context of one dead-lettered record.

    Attributes:
        topic: original topic.
        partition: original partition.
        offset: original offset.
        stage: where it failed (``decode``, ``transform``, ``write``...).
        error_class: the exception class name.
        message: the error message.
        component: the connector, service or job that dead-lettered it.
        omitted: the parts of the original left out of the dead letter record (``value``, ``headers``,
            ``key``), read back from ``dlq.omitted``; empty when it is whole.
        original_bytes: the original record's key and value size (``dlq.record.bytes``), bytes;
            ``None`` when the dead letter was written without it.
    """

    topic: str
    partition: int
    offset: int
    stage: str
    error_class: str
    message: str
    component: str
    omitted: tuple[str, ...] = ()
    original_bytes: int | None = None

    @classmethod
    def from_exception(
        cls, exc: BaseException, *, topic: str, partition: int, offset: int, stage: str, component: str
    ) -> DeadLetter:
        """Build the context from an exception."""
        return cls(topic, partition, offset, stage, type(exc).__name__, str(exc)[:4000], component)

    def headers(self, original: Sequence[tuple[str, bytes | None]] | None = None) -> list[tuple[str, bytes]]:
        """Headers for the dead letter record, the original headers appended.

        Returns:
            ``(key, value)`` pairs for confluent-kafka ``produce(headers=...)``.
        """
        ours = [
            ("dlq.topic", self.topic),
            ("dlq.partition", str(self.partition)),
            ("dlq.offset", str(self.offset)),
            ("dlq.stage", self.stage),
            ("dlq.error.class", self.error_class),
            ("dlq.error.message", redact(self.message)),  # a driver's error can echo a URL or a value
            ("dlq.component", self.component),
            ("dlq.timestamp_ms", str(int(time.time() * 1000))),
        ]
        return [(k, v.encode()) for k, v in ours] + [(k, v or b"") for k, v in (original or [])]

    def record(self, key: bytes | None, value: bytes | None, original: Headers | None, *,
               max_bytes: int) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
        """The dead letter record of an original one, fitted under ``max_bytes``.

        Args:
            key: the original key bytes.
            value: the original value bytes (``None``: a tombstone).
            original: the original headers.
            max_bytes: the largest record the dead letter topic and its producer take
                (:func:`dead_letter_limit`), bytes.

        Returns:
            ``(key, value, headers)`` to produce: the original parts that fit, the ``dlq.*`` headers
            (``dlq.record.bytes`` always, ``dlq.omitted`` when a part was left out), then the original
            headers if they fit. Parts are left out in this order: value, original headers, key.
        """
        original = list(original or [])
        size = record_bytes(key, value, original)
        context = self.headers() + [(RECORD_BYTES_HEADER, str(record_bytes(key, value, None)).encode())]
        budget = max_bytes - FRAMING_BYTES - record_bytes(None, None, context) - 64  # 64: dlq.omitted itself
        omitted: list[str] = []
        if size > budget:
            value = None
            omitted.append("value")
            if record_bytes(key, None, original) > budget:
                original = []
                omitted.append("headers")
            if record_bytes(key, None, None) > budget:
                key = None
                omitted.append("key")
        if omitted:
            context.append((OMITTED_HEADER, ",".join(omitted).encode()))
        return key, value, context + [(k, v or b"") for k, v in original]

    @classmethod
    def from_headers(cls, headers: Sequence[tuple[str, bytes | None]]) -> DeadLetter:
        """Read the context back from a dead letter record's headers.

        Raises:
            KeyError: a ``dlq.*`` header is missing.
        """
        h = {k: (v or b"").decode() for k, v in headers if k.startswith(PREFIX)}
        size = h.get(RECORD_BYTES_HEADER, "")
        return cls(
            h["dlq.topic"],
            int(h["dlq.partition"]),
            int(h["dlq.offset"]),
            h["dlq.stage"],
            h["dlq.error.class"],
            h["dlq.error.message"],
            h["dlq.component"],
            tuple(part for part in h.get(OMITTED_HEADER, "").split(",") if part),
            int(size) if size.isdigit() else None,
        )
