"""A source's dead letters: the row or change that cannot be encoded, with where it came from and why.

With ``errors.tolerance: all`` a source sends a record its Avro schema cannot carry (a value out of its
type's range, a two-dimensional array in an ``int[]`` column, a zero date) to its dead letter topic
(``dead_letter_topic``, default ``<topic>.dlq``, created with
:func:`~kernel.kafka.topics.ensure_dead_letter_topic`) and goes on: the task's position moves past it
once the dead letter is acknowledged (with transactions, in the same Kafka transaction as the records
and the position). With ``tolerance: none`` (the default) the task stops at it, in one line that names
the record and how to move on (:func:`encode_failure_hint`), and is not restarted: the same row would
fail the same way. A row that a reconciliation emits again (the topic lacks it) while it is in the dead letter
topic unchanged is not dead-lettered twice (:meth:`SourceDeadLetters.repeated`, the topic read at start by
:meth:`SourceDeadLetters.load`).

The dead letter record (:meth:`kernel.dlq.DeadLetter.record`, stage ``encode``):

* key: the record's key encoded as in the topic (``None`` when the key itself cannot be encoded);
* value: the row as JSON text (UTF-8), each value as the connector read it (decimals, dates and times as
  text, bytes base64), since it has no Avro encoding;
* headers: the ``dlq.*`` context (``dlq.topic`` the source's topic, ``dlq.partition`` and ``dlq.offset``
  ``-1``: the record never reached it), then ``dlq.source.table`` (where the row was read,
  e.g. ``public.orders``), ``dlq.source.key`` (the key as JSON), ``dlq.source.column`` (the columns or fields
  that cannot be encoded, comma separated), ``dlq.source.position`` (the position of the batch that held
  it, JSON: the position the task moves to past it), then the batch's own headers.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
from collections.abc import Mapping, Sequence
from typing import Any

from kernel.dlq import DeadLetter

STAGE = "encode"
"""``dlq.stage`` of a source's dead letter."""

TABLE_HEADER = "dlq.source.table"
KEY_HEADER = "dlq.source.key"
COLUMN_HEADER = "dlq.source.column"
POSITION_HEADER = "dlq.source.position"

MAX_REMEMBERED = 100_000
"""Keys of dead-lettered rows remembered to send a row re-emitted unchanged only once (then forgotten)."""


COMPONENT_HEADER = "dlq.component"


def _digest(value: bytes | None) -> bytes:
    import hashlib

    return hashlib.sha256(value or b"").digest()


def _json_default(value: Any) -> Any:
    if isinstance(value, decimal.Decimal):
        return format(value, "f") if value.is_finite() else str(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode()
    return str(value)


def json_text(value: Any) -> str:
    """``value`` as compact JSON text, whatever its Python types (decimals exact, bytes base64)."""
    return json.dumps(value, default=_json_default, ensure_ascii=False, separators=(",", ":"))


def encode_failure_hint(dead_letter_topic: str) -> str:
    """How to move on from a record that cannot be encoded (the end of the task's one error line)."""
    return (
        "to move on: fix the row at its source, or map the column to a type that carries the value "
        "(rds_source: decimal_handling, or a cast in a `mode: query` SELECT), or set errors.tolerance: all on the "
        f"source to send the row to the dead letter topic {dead_letter_topic!r} and go on"
    )


class SourceDeadLetters:
    """Builds a source's dead letter records.

    Args:
        topic: the source's topic (``dlq.topic``).
        dead_letter_topic: where the dead letters go.
        component: the source's name (``dlq.component``).
        max_bytes: the largest dead letter record (:func:`~kernel.kafka.topics.ensure_dead_letter_topic`).
    """

    def __init__(self, topic: str, dead_letter_topic: str, component: str, max_bytes: int):
        self.topic = topic
        self.dead_letter_topic = dead_letter_topic
        self.component = component
        self.max_bytes = max_bytes
        self.count = 0
        self._sent: dict[bytes | None, bytes] = {}  # key bytes -> digest of the row's JSON in the dead letter topic

    def repeated(self, key_bytes: bytes | None, value: Mapping[str, Any] | None) -> bool:
        """Whether this very row is in the dead letter topic already; remembers it.

        A reconciliation emits a row the topic lacks again, every ``reconcile_interval_s`` and after each
        restart: such a row is not sent twice. Knows the rows dead-lettered by this run and those
        :meth:`load` read from the topic.
        """
        digest = _digest(None if value is None else json_text(dict(value)).encode())
        if self._sent.get(key_bytes) == digest:
            return True
        self._remember(key_bytes, digest)
        return False

    def _remember(self, key_bytes: bytes | None, digest: bytes) -> None:
        if len(self._sent) >= MAX_REMEMBERED:
            self._sent.clear()
        self._sent[key_bytes] = digest

    def load(self, kafka_conf: Mapping[str, Any], timeout_s: float) -> None:
        """Remember the rows this source dead-lettered before (its ``dlq.component``), reading the topic to its end.

        Args:
            kafka_conf: librdkafka properties of the cluster.
            timeout_s: bound of each request, seconds.
        """
        import uuid

        from confluent_kafka import Consumer, TopicPartition

        from kernel.kafka.topics import end_offsets

        ends = {p: e for p, e in end_offsets(dict(kafka_conf), self.dead_letter_topic, timeout_s).items() if e > 0}
        if not ends:
            return
        consumer = Consumer({**kafka_conf, "group.id": f"threes-dlq-{uuid.uuid4().hex}", "enable.auto.commit": False,
                             "isolation.level": "read_committed"})
        component = self.component.encode()
        try:
            consumer.assign([TopicPartition(self.dead_letter_topic, p, 0) for p in ends])
            while ends:
                msgs = consumer.consume(1000, timeout=timeout_s)
                if not msgs:
                    break  # transaction markers can leave the last offsets unreadable
                for msg in msgs:
                    if msg.error() is not None:
                        continue
                    if (COMPONENT_HEADER, component) in (msg.headers() or []):
                        self._remember(msg.key(), _digest(msg.value()))
                    partition, offset = msg.partition() or 0, msg.offset() or 0
                    if offset + 1 >= ends.get(partition, 0):
                        ends.pop(partition, None)
        finally:
            consumer.close()

    def record(
        self,
        *,
        key_bytes: bytes | None,
        key: Any,
        value: Mapping[str, Any] | None,
        error: BaseException,
        table: str,
        columns: Sequence[str],
        position: Any,
        headers: Sequence[tuple[str, bytes | None]] | None,
    ) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
        """The dead letter record of a row that cannot be encoded.

        Args:
            key_bytes: the encoded key, ``None`` when it cannot be encoded.
            key: the key as read (for ``dlq.source.key``).
            value: the row as read; ``None`` for a tombstone.
            error: why it cannot be encoded (``dlq.error.*``).
            table: where the row was read (``dlq.source.table``).
            columns: the columns that cannot be encoded (``dlq.source.column``), empty when unknown.
            position: the position of the batch that held the row (``dlq.source.position``).
            headers: the batch's headers, kept after the context.

        Returns:
            ``(key, value, headers)`` to produce, fitted under ``max_bytes``.
        """
        context = DeadLetter.from_exception(
            error, topic=self.topic, partition=-1, offset=-1, stage=STAGE, component=self.component
        )
        ours: list[tuple[str, bytes | None]] = [
            (TABLE_HEADER, table.encode()),
            (KEY_HEADER, json_text(dict(key) if isinstance(key, Mapping) else key).encode()),
            (COLUMN_HEADER, ",".join(columns).encode()),
            (POSITION_HEADER, json_text(position).encode()),
        ]
        body = None if value is None else json_text(dict(value)).encode()
        self.count += 1
        return context.record(key_bytes, body, ours + list(headers or ()), max_bytes=self.max_bytes)
