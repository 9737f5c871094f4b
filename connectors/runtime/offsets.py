"""Source positions in a compacted Kafka topic, keyed by connector name.

Like Kafka Connect's ``connect-offsets`` topic: each record's key is the
connector's name (``name#task`` for the tasks of a connector split in more than
one), its value a small JSON document; the topic is compacted, so it keeps the
latest position of every connector forever, and a tombstone (``threes offsets
reset``) forgets it, which makes the next run start with a full snapshot.

Value (UTF-8 JSON)::

    {"connector": "airports", "task": 0, "topic": "state.airports",
     "position": {...}, "updated_ms": 1732200000000}

A position is written only after every record before it was acknowledged by
the broker (see :class:`PositionTracker`), so a crash replays records (at
least once) but never loses one. With ``exactly_once`` (and always in
``--group`` mode) the position is written in the same Kafka transaction as the
records it covers (KIP-618), and read back ``read_committed``: a crash then
neither loses nor duplicates a record for ``read_committed`` readers.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kernel.exceptions import FatalError, SetupError
from kernel.kafka.committed import latest_per_key
from kernel.kafka.topics import ensure_internal_topic

log = logging.getLogger(__name__)

OFFSETS_TOPIC = "_threes_offsets"


def offsets_key(connector: str, task_id: int = 0, task_count: int = 1) -> str:
    """The offsets-topic key of a task: the connector name, ``name#i`` when split into several tasks."""
    return connector if task_count == 1 else f"{connector}#{task_id}"


@dataclass(frozen=True)
class StoredPosition:
    """One entry of the offsets topic.

    Attributes:
        key: the record key (connector name, ``name#task`` for split connectors).
        connector: the connector's name.
        task: the task index.
        topic: the state topic the position belongs to.
        position: the source position (connector-specific JSON).
        updated_ms: when it was written, epoch milliseconds.
    """

    key: str
    connector: str
    task: int
    topic: str | None
    position: dict[str, Any]
    updated_ms: int


class OffsetStore:
    """Read and write source positions (see module docstring).

    Args:
        kafka_config: librdkafka properties (``KafkaConfig.librdkafka_config()``).
        topic: the offsets topic; created compacted when missing.
        timeout_s: admin and read timeouts, seconds.
        replication_factor: of the topic when created; ``None``: min(3, brokers)
            (:func:`kernel.kafka.topics.replication_settings`).
        min_insync_replicas: of the topic when created; ``None``: the default there.

    Raises:
        SetupError: Kafka cannot be reached.
        ConfigError: the topic exists and is not compacted.
    """

    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        topic: str = OFFSETS_TOPIC,
        timeout_s: float = 30.0,
        *,
        replication_factor: int | None = None,
        min_insync_replicas: int | None = None,
    ):
        self.kafka_config = dict(kafka_config)
        self.topic = topic
        self.timeout_s = timeout_s
        ensure_internal_topic(
            self.kafka_config,
            topic,
            partitions=1,
            replication_factor=replication_factor,
            min_insync_replicas=min_insync_replicas,
            timeout_s=timeout_s,
        )

    def load_all(self) -> dict[str, StoredPosition]:
        """Read the offsets topic to its end, ``read_committed``.

        Positions written in a transaction (``exactly_once`` sources, ``--group``
        workers) count only once committed; an open transaction of another task
        is waited out (see :mod:`kernel.kafka.committed`).

        Returns:
            Offsets key -> stored position, for every key not reset.
        """
        latest = latest_per_key(self.kafka_config, self.topic, self.timeout_s)
        out: dict[str, StoredPosition] = {}
        for raw_key, raw_value in latest.items():
            key = raw_key.decode()
            try:
                doc = json.loads(raw_value)
                out[key] = StoredPosition(
                    key=key,
                    connector=doc["connector"],
                    task=int(doc.get("task", 0)),
                    topic=doc.get("topic"),
                    position=doc["position"],
                    updated_ms=int(doc.get("updated_ms", 0)),
                )
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("offsets topic=%s key=%s holds an unreadable position (%s): ignored", self.topic, key, exc)
        return out

    def load(self, key: str) -> dict[str, Any] | None:
        """The stored position of one offsets key, or ``None`` (start with a snapshot)."""
        stored = self.load_all().get(key)
        return stored.position if stored else None

    def encode(self, key: str, connector: str, task: int, topic: str, position: Mapping[str, Any]) -> bytes:
        """The JSON value of a position record."""
        doc = {
            "connector": connector,
            "task": task,
            "topic": topic,
            "position": position,
            "updated_ms": int(time.time() * 1000),
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    def reset(self, keys: list[str], producer: Any) -> None:
        """Write tombstones for ``keys``: their connectors start with a snapshot next time.

        Args:
            keys: offsets keys to forget.
            producer: a confluent-kafka producer (idempotent, ``acks=all``).

        Raises:
            SetupError: the tombstones were not acknowledged within the timeout.
        """
        errors: list[Any] = []
        for key in keys:
            producer.produce(
                self.topic, key=key.encode(), value=None, on_delivery=lambda e, _m: errors.append(e) if e else None
            )
        if producer.flush(self.timeout_s) or errors:
            raise SetupError(f"offsets reset not acknowledged by topic {self.topic!r}: {errors or 'timeout'}")


class _Pending:
    """Acknowledgements still owed for one batch; ``ack`` is the producer's ``on_delivery``."""

    __slots__ = ("outstanding", "position", "records", "error", "context")

    def __init__(self, records: int, position: dict[str, Any] | None, context: str):
        self.outstanding = records
        self.records = records
        self.position = position
        self.error: str | None = None
        self.context = context

    def ack(self, err: Any, msg: Any) -> None:
        self.outstanding -= 1
        if err is not None and self.error is None:
            where = f"partition {msg.partition()}" if msg is not None else "unknown partition"
            self.error = f"{self.context}: delivery to {where} failed: {err}"


class PositionTracker:
    """Which position may be stored: the one after the longest prefix of fully acknowledged batches.

    Acknowledgements of different partitions arrive in any order, so a batch's
    position becomes committable only when it *and every batch before it* are
    fully acknowledged (Kafka Connect's ``SubmittedRecords`` does the same per
    record). Not thread-safe: the runner's thread produces and polls.
    """

    def __init__(self) -> None:
        self._pending: deque[_Pending] = deque()
        self._committable: dict[str, Any] | None = None
        self._acked_records = 0

    def add(self, records: int, position: dict[str, Any] | None, context: str = "") -> _Pending:
        """Register a batch about to be produced.

        Args:
            records: how many records the batch produces (each one calls ``ack`` once).
            position: the position after the batch, or ``None`` if it does not move it.
            context: names the batch in a delivery error.

        Returns:
            The object whose ``ack`` method is the ``on_delivery`` callback of the batch's records.
        """
        pending = _Pending(records, position, context)
        self._pending.append(pending)
        return pending

    def advance(self, raise_errors: bool = True) -> tuple[dict[str, Any] | None, int]:
        """Drop fully acknowledged batches from the head.

        Args:
            raise_errors: raise when the head batch failed; ``False`` on shutdown,
                where the positions before the failure are still stored.

        Returns:
            ``(position, records)``: the newest committable position (``None``
            if it did not move) and how many records became acknowledged.

        Raises:
            FatalError: a record of the head batch failed (delivery retries of the
                idempotent producer exhausted, or it could not be encoded): nothing
                from that batch on is committed.
        """
        moved: dict[str, Any] | None = None
        acked = 0
        failed: str | None = None
        while self._pending and self._pending[0].outstanding <= 0:
            head = self._pending[0]
            if head.error is not None:
                failed = head.error
                break
            self._pending.popleft()
            acked += head.records
            if head.position is not None:
                moved = head.position
        if moved is not None:
            self._committable = moved
        self._acked_records += acked
        if failed is not None and raise_errors:
            raise FatalError(failed)
        return moved, acked

    def abandon(self, pending: _Pending, not_produced: int, error: str) -> None:
        """Mark a batch that stopped half-way: its unproduced records owe no ack, and it never commits."""
        pending.outstanding -= not_produced
        pending.records -= not_produced
        if pending.error is None:
            pending.error = error

    def first_error(self) -> str | None:
        """The first delivery error of any batch still tracked (it stops the task)."""
        return next((p.error for p in self._pending if p.error is not None), None)

    @property
    def in_flight(self) -> int:
        """Records produced and not yet acknowledged."""
        return sum(p.outstanding for p in self._pending)

    @property
    def committable(self) -> dict[str, Any] | None:
        """The newest position covered by acknowledged records (``None`` before the first)."""
        return self._committable


def require_position_shape(position: Any, where: str) -> dict[str, Any] | None:
    """Check a loaded position is a JSON object (a hand-edited offsets topic can hold anything).

    Returns:
        ``position``, a dict, or ``None`` when nothing was stored.

    Raises:
        FatalError: it is not a dict.
    """
    if position is not None and not isinstance(position, dict):
        raise FatalError(f"{where}: stored position is not a JSON object; reset it with `threes offsets reset`")
    return position
