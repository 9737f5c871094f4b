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
========================  =============================================

The original headers are kept after these.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from kernel.redact import redact

PREFIX = "dlq."


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
    """

    topic: str
    partition: int
    offset: int
    stage: str
    error_class: str
    message: str
    component: str

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

    @classmethod
    def from_headers(cls, headers: Sequence[tuple[str, bytes | None]]) -> DeadLetter:
        """Read the context back from a dead letter record's headers.

        Raises:
            KeyError: a ``dlq.*`` header is missing.
        """
        h = {k: (v or b"").decode() for k, v in headers if k.startswith(PREFIX)}
        return cls(
            h["dlq.topic"],
            int(h["dlq.partition"]),
            int(h["dlq.offset"]),
            h["dlq.stage"],
            h["dlq.error.class"],
            h["dlq.error.message"],
            h["dlq.component"],
        )
