"""Dead letters read, selected and replayed: what ``threes dlq list|show|replay`` do (:mod:`threes.dlq`).

The dead letter topics are the ones the config names (each sync service's and the stream job's
``dead_letter_topic``); their records follow :mod:`kernel.dlq` (original key and value bytes,
``dlq.*`` headers saying where from and why, the original headers after them).

Replay produces a record's original key, value and headers (its ``version`` among them) back to its
original topic and partition, or to ``--to TOPIC``. That is safe to repeat: every sink applies an
update only if its version is newer than what the target holds (DESIGN.md, "Update topics"), so a
replayed record older than the target's row changes nothing. Each replayed dead letter (its dead
letter topic, partition and offset) is then recorded in a compacted topic (``_threes_dlq_replays``,
like Kafka Connect's ``connect-offsets``), and a second replay of the same records is refused unless
``--force``: replaying is something to do once, on purpose.

A dead letter written without its value (``dlq.omitted``: the original was larger than the dead
letter topic takes, :mod:`kernel.dlq`) is replayed from its original: ``threes dlq replay`` reads
it back from ``dlq.topic`` at ``dlq.partition`` and ``dlq.offset`` first
(:mod:`threes.dead_letter_originals`), and refuses, naming the dead letter, when that topic no
longer holds it (deleted by retention, or compacted away).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from kernel.dlq import PREFIX, DeadLetter
from kernel.exceptions import SetupError, ThreesError
from kernel.redact import redact

log = logging.getLogger(__name__)

REPLAYS_TOPIC = "_threes_dlq_replays"
"""Compacted topic of replayed dead letters: key ``<dlq topic>:<partition>:<offset>``, value JSON."""

REPLAYED_FROM = "threes.replayed_from"
"""Header added to a replayed record: the dead letter it came from (``<dlq topic>:<partition>:<offset>``).
Not a ``dlq.*`` header: a replayed record dead-lettered again must carry only its new ``dlq.*`` context."""

IDEMPOTENCE_NOTE = (
    "replayed records keep their version header: each sink applies one only if it is newer than what the "
    "target holds, so a replay never overwrites a newer value and replaying twice changes nothing"
)

@dataclass(frozen=True)
class Letter:
    """One record of a dead letter topic.

    Attributes:
        dlq_topic: the dead letter topic.
        partition: its partition.
        offset: its offset.
        timestamp_ms: when it was dead-lettered (``dlq.timestamp_ms``, else the record's timestamp), epoch ms.
        context: the ``dlq.*`` headers read back, ``None`` when they are missing (not written by threes).
        key: the original key bytes.
        value: the original value bytes (``None``: a tombstone).
        headers: every header, ``dlq.*`` first.
    """

    dlq_topic: str
    partition: int
    offset: int
    timestamp_ms: int
    context: DeadLetter | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = field(default=())

    @property
    def id(self) -> str:  # the dead letter's name on the command line
        """``<dlq topic>:<partition>:<offset>`` (Kafka topic names have no ``:``)."""
        return f"{self.dlq_topic}:{self.partition}:{self.offset}"

    @property
    def reason(self) -> str:
        """``<error class>: <message>``, secrets masked."""
        if self.context is None:
            return "(no dlq.* headers)"
        return redact(f"{self.context.error_class}: {self.context.message}")

    def original_headers(self) -> list[tuple[str, bytes]]:
        """The headers the record had before it was dead-lettered (``version``...)."""
        return [(k, v) for k, v in self.headers if not k.startswith(PREFIX) and k != REPLAYED_FROM]

    @property
    def omitted(self) -> tuple[str, ...]:
        """The parts of the original this dead letter was written without (``value``, ``headers``, ``key``)."""
        return self.context.omitted if self.context is not None else ()


def dead_letter_topics(pipeline: Any) -> list[str]:
    """The dead letter topics a pipeline names: each sync service's, the stream job's, then each source's.

    A source has one when its ``errors.tolerance`` is ``all`` (``dead_letter_topic``, default ``<topic>.dlq``).
    """
    topics = [s.dead_letter_topic for s in pipeline.sync]
    if getattr(pipeline, "stream", None) is not None:
        topics.append(pipeline.stream.dead_letter_topic)
    topics.extend(s.dead_letter_topic_name for s in pipeline.sources if s.errors.tolerance == "all")
    return list(dict.fromkeys(topics))


def parse_time(text: str, now: datetime | None = None) -> int:
    """A point in time as epoch milliseconds: ISO 8601 (``2026-05-01T12:00``, UTC unless zoned) or an age.

    Args:
        text: ``2026-05-01``, ``2026-05-01T12:00:00+02:00``, or ``90s``/``15m``/``2h``/``3d`` ago.
        now: the present (tests).

    Raises:
        ThreesError: neither form.
    """
    now = now or datetime.now(UTC)
    age = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if age:
        seconds = float(age.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[age.group(2)]
        return int((now - timedelta(seconds=seconds)).timestamp() * 1000)
    try:
        at = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ThreesError(f"{text!r} is not a time: give ISO 8601 (2026-05-01T12:00) or an age (15m, 2h, 3d)") from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return int(at.timestamp() * 1000)


def read_letters(kafka: Any, topics: Sequence[str], *, since_ms: int | None = None,
                 timeout_s: float = 30.0) -> list[Letter]:
    """Read dead letter topics from ``since_ms`` (or their start) to their current end.

    Args:
        kafka: the pipeline's ``KafkaConfig``.
        topics: dead letter topics; one that does not exist yet holds no dead letters (skipped).
        since_ms: skip records older than this (the brokers' time index), epoch ms.
        timeout_s: the longest wait for the end of the topics, seconds.

    Returns:
        The records, by topic, partition and offset. Reading commits nothing (no consumer group is used).

    Raises:
        SetupError: Kafka did not answer, or the end was not reached within ``timeout_s``.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({**kafka.librdkafka_config(), "group.id": f"threes-dlq-{uuid.uuid4().hex}",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "earliest"})
    try:
        assignment: list[Any] = []
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if meta is None or meta.error is not None or not meta.partitions:
                log.info("dead letter topic=%s does not exist: no dead letters there", topic)
                continue
            for p in sorted(meta.partitions):
                assignment.append(TopicPartition(topic, p, since_ms if since_ms is not None else -2))
        if not assignment:
            return []
        if since_ms is not None:
            assignment = consumer.offsets_for_times(assignment, timeout=10)
        pending = {(tp.topic, tp.partition) for tp in assignment}
        consumer.assign(assignment)
        out: list[Letter] = []
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise SetupError(f"dead letter topics {sorted({t for t, _ in pending})} not read to their end "
                                 f"within {timeout_s} s")
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    pending.discard((msg.topic(), msg.partition()))
                    continue
                raise SetupError(f"reading dead letter topic {msg.topic()}: {error}")
            out.append(_letter(msg))
        return sorted(out, key=lambda letter: (letter.dlq_topic, letter.partition, letter.offset))
    finally:
        consumer.close()


def _letter(msg: Any) -> Letter:
    headers = tuple((k, v or b"") for k, v in (msg.headers() or []))
    try:
        context: DeadLetter | None = DeadLetter.from_headers(headers)
    except (KeyError, ValueError):
        context = None
    stamped = dict(headers).get("dlq.timestamp_ms")
    ts = int(stamped) if stamped and stamped.isdigit() else msg.timestamp()[1]
    return Letter(msg.topic(), msg.partition(), msg.offset(), ts, context, msg.key(), msg.value(), headers)


def select_letters(letters: Iterable[Letter], *, reason: str | None = None, topic: str | None = None,
                   since_ms: int | None = None, until_ms: int | None = None,
                   ids: Sequence[str] = ()) -> list[Letter]:
    """The dead letters that match every filter given.

    Args:
        letters: dead letters.
        reason: a case-insensitive part of ``<error class>: <message>``.
        topic: the original topic (``dlq.topic``).
        since_ms: dead-lettered at or after, epoch ms.
        until_ms: dead-lettered before, epoch ms.
        ids: only these ``<dlq topic>:<partition>:<offset>``.
    """
    wanted = set(ids)
    out = []
    for letter in letters:
        if wanted and letter.id not in wanted:
            continue
        if reason and reason.lower() not in letter.reason.lower():
            continue
        if topic and (letter.context is None or letter.context.topic != topic):
            continue
        if since_ms is not None and letter.timestamp_ms < since_ms:
            continue
        if until_ms is not None and letter.timestamp_ms >= until_ms:
            continue
        out.append(letter)
    return out


@dataclass
class ReplayResult:
    """What ``replay`` did (or, dry, would do).

    Attributes:
        sent: ``(dead letter id, target topic, target partition, target offset)``; offset -1 on a dry run.
        dry_run: nothing was produced.
    """

    sent: list[tuple[str, str, int, int]] = field(default_factory=list)
    dry_run: bool = False


def replayed_ids(kafka: Any, replays_topic: str = REPLAYS_TOPIC) -> dict[str, dict[str, Any]]:
    """The dead letters replayed before: id -> the record of the replay (``{"to", "partition", "offset", ...}``)."""
    from kernel.kafka.topics import read_latest_per_key

    try:
        latest = read_latest_per_key(kafka.librdkafka_config(), replays_topic)
    except SetupError:
        if _topic_exists(kafka, replays_topic):
            raise
        return {}  # never replayed anything
    return {k.decode(): json.loads(v) for k, v in latest.items()}


def _topic_exists(kafka: Any, topic: str) -> bool:
    from schemas.kafka_cluster import cluster_metadata

    meta = cluster_metadata(kafka.librdkafka_config()).topics.get(topic)
    return meta is not None and meta.error is None


def replay(kafka: Any, letters: Sequence[Letter], *, to: str | None = None, dry_run: bool = False,
           force: bool = False, replays_topic: str = REPLAYS_TOPIC) -> ReplayResult:
    """Produce dead letters back to their original topic and partition (or to ``to``), and record it.

    Args:
        kafka: the pipeline's ``KafkaConfig``.
        letters: the dead letters to replay, in order.
        to: another topic (partitioned by key) instead of each record's original topic and partition.
        dry_run: produce nothing, record nothing; say what would be sent.
        force: replay dead letters that were replayed before.
        replays_topic: the compacted topic recording replays (created if missing).

    Returns:
        The :class:`ReplayResult`.

    Raises:
        ThreesError: a dead letter was replayed before (without ``force``), or has no original topic and
            no ``to`` was given; nothing is sent then.
        SetupError: Kafka refused a record (the ones delivered before are recorded as replayed).
    """
    from kernel.kafka import clients
    from kernel.kafka.topics import internal_topic_options
    from schemas.kafka_admin import ensure_internal_topic
    _check_selection(letters, to, replayed_ids(kafka, replays_topic), force)
    result = ReplayResult(dry_run=dry_run)
    if dry_run:
        result.sent = [(letter.id, *_target(letter, to), -1) for letter in letters]
        return result
    if not letters:
        return result
    ensure_internal_topic(kafka.librdkafka_config(), replays_topic, **internal_topic_options(kafka))
    producer = clients.kafka_producer(kafka, linger_ms=5)
    delivered, errors = _produce(producer, letters, to)
    # recorded only once delivered: a crash before this leaves them replayable, which is harmless (versions)
    at = datetime.now(UTC).isoformat(timespec="seconds")
    for letter in letters:
        if letter.id in delivered:
            topic, partition, offset = delivered[letter.id]
            result.sent.append((letter.id, topic, partition, offset))
            producer.produce(replays_topic, key=letter.id.encode(), value=json.dumps(
                {"to": topic, "partition": partition, "offset": offset, "at": at}).encode())
    if producer.flush(60) != 0:
        errors.append(f"the record of the replays in {replays_topic} was not delivered")
    log.info("replayed dead_letters=%d to=%s errors=%d", len(result.sent), to or "original topics", len(errors))
    if errors:
        raise SetupError(f"{len(errors)} dead letter(s) not replayed ({len(result.sent)} were): {errors[:3]}")
    return result


def _check_selection(letters: Sequence[Letter], to: str | None, done: dict[str, dict[str, Any]],
                     force: bool) -> None:
    """Refuse a selection with dead letters of no original topic (without ``to``) or replayed before (without force).

    Raises:
        ThreesError: naming the first of them.
    """
    orphans = [letter.id for letter in letters if letter.context is None]
    if orphans and to is None:
        raise ThreesError(f"dead letter(s) {orphans[:5]} have no dlq.topic header: name a topic with --to")
    unencoded = [letter.id for letter in letters if _from_source_encoding(letter)]
    if unencoded and to is None:
        raise ThreesError(
            f"dead letter(s) {unencoded[:5]} are rows a source could not encode (dlq.stage encode, the row as "
            "JSON): there is no record to put back in its topic; fix the row or the source's type mapping and the "
            "source reads it again (a reconciliation or an update of the row), or name a topic with --to"
        )
    again = [letter.id for letter in letters if letter.id in done]
    if again and not force:
        raise ThreesError(
            f"{len(again)} of the {len(letters)} selected dead letter(s) were replayed before (e.g. {again[0]} "
            f"to {done[again[0]].get('to')} at {done[again[0]].get('at')}); narrow the selection, or --force "
            "to replay them again (" + IDEMPOTENCE_NOTE + ")"
        )


def _from_source_encoding(letter: Letter) -> bool:
    """Whether a dead letter is a row a source could not encode (no Avro record of it exists)."""
    return letter.context is not None and letter.context.stage == "encode" and letter.context.partition == -1


def _target(letter: Letter, to: str | None) -> tuple[str, int]:
    """``(topic, partition)`` a dead letter goes back to; partition -1 when ``to`` partitions by key."""
    if to:
        return to, -1
    assert letter.context is not None  # orphans need --to (_check_selection)
    return letter.context.topic, letter.context.partition


def _produce(producer: Any, letters: Sequence[Letter], to: str | None) -> tuple[dict[str, tuple[str, int, int]],
                                                                                list[str]]:
    """Produce the dead letters with their original headers and ``threes.replayed_from``, and wait for them.

    Returns:
        ``({letter id: (topic, partition, offset)} of the delivered ones, errors of the others)``.
    """
    delivered: dict[str, tuple[str, int, int]] = {}
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any, letter_id: str) -> None:
        if err is not None:
            errors.append(f"{letter_id}: {err}")
        else:
            delivered[letter_id] = (msg.topic(), msg.partition(), msg.offset())

    for letter in letters:
        headers = [*letter.original_headers(), (REPLAYED_FROM, letter.id.encode())]
        topic, partition = _target(letter, to)
        target: dict[str, Any] = {"topic": topic} if partition < 0 else {"topic": topic, "partition": partition}
        while True:
            try:
                producer.produce(key=letter.key, value=letter.value, headers=headers,
                                 on_delivery=lambda err, msg, i=letter.id: on_delivery(err, msg, i), **target)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    producer.flush(60)
    return delivered, errors

