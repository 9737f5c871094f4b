"""Record errors or target errors, judged by blast radius: the rule of every sink, applied once.

A record goes to the dead letter topic only when the target refused *it*: either
the target named its data as the reason (:attr:`RecordFailure.about_data`: a value
too long, an invalid value, a constraint on the data, a record over
``max_record_bytes``), or a retry of the record alone reproduces the refusal while
its neighbours in the batch are applied. An error that every record of the batch
hits is the target's (a revoked privilege, a dropped column, a read-only index), so
the batch is blocked (:class:`SinkBlockedError`): the partitions pause and the batch
is written again later, and nothing is dead-lettered. A batch of one record that
fails for a reason not about its data has no neighbour to tell the two apart: it
is blocked too, because dead-lettering a good record is the loss this rule exists to
prevent, and waiting for a target that was at fault costs only time.

To find the refused records of a write that failed as a whole
(:class:`BatchRefusedError`: a transaction or a ``COPY``), the batch is bisected:
each half is written alone, and a half that fails is split again until its refused
records stand alone. Debezium's JDBC sink does the same when a batch fails
(it "unrolls" the batch and retries its records one by one); bisecting needs
``2 k log2(n / k)`` writes for ``k`` bad records among ``n`` instead of ``n``.

The module is pure logic: the write is a callable, so unit tests drive it with a fake sink.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from connectors.api.sink_records import RecordFailure, SinkBatch, SinkRecord, latest_per_key
from kernel.exceptions import BatchRefusedError, SinkBlockedError, SkippableRecordError
from sync_service.batching import RECORD_OVERHEAD_BYTES

log = logging.getLogger(__name__)


def oversized(records: Sequence[SinkRecord], max_record_bytes: int | None) -> list[RecordFailure]:
    """The records over a per-record size limit, as failures about their data.

    Args:
        records: records of one batch.
        max_record_bytes: the limit, bytes of key and value as consumed (``SinkRecord.size_bytes``
            without the fixed per-record overhead); ``None``: no limit.

    Returns:
        One :class:`RecordFailure` (``about_data``, a :class:`SkippableRecordError` naming the
        record, its size and the limit) per record over the limit, in their order.
    """
    if max_record_bytes is None:
        return []
    out = []
    for record in records:
        size = record.size_bytes - RECORD_OVERHEAD_BYTES
        if size > max_record_bytes:
            out.append(RecordFailure(record, SkippableRecordError(
                f"{record.where()}: record of {size} bytes is over max_record_bytes ({max_record_bytes} bytes)"
            ), about_data=True))
    return out


@dataclass
class Isolated:
    """What became of a batch written with :func:`write_isolating`.

    Attributes:
        failures: the records to dead-letter, in offset order.
        writes: calls of the sink's ``write`` it took (1 when nothing was refused).
    """

    failures: list[RecordFailure] = field(default_factory=list)
    writes: int = 0


def subset(batch: SinkBatch, records: list[SinkRecord]) -> SinkBatch:
    """A batch of some of ``batch``'s records (their columnar values stay valid: rows index ``tables``).

    Args:
        batch: the whole batch.
        records: some of its records, in offset order.

    Returns:
        A :class:`SinkBatch` covering the same offsets (``first_offset``/``last_offset``), with ``records``.
    """
    return SinkBatch(batch.topic, batch.partition, batch.first_offset, batch.last_offset, records, batch.tables)


def bisect(write: Callable[[SinkBatch], list[RecordFailure]], batch: SinkBatch) -> Isolated:
    """Write ``batch``; when the write is refused as a whole, write halves until the refused records stand alone.

    Args:
        write: the sink's ``write`` (it may return failures, or raise :class:`BatchRefusedError`).
        batch: the batch.

    Returns:
        Every refused record, each with the error its own write (alone, or in the smallest
        part that named it) gave; nothing is judged here (see :func:`judge`).

    Raises:
        Whatever ``write`` raises other than :class:`BatchRefusedError` (backpressure, transient,
        blocked, fatal): the whole batch is written again later, which is harmless (writes are
        idempotent).
    """
    out = Isolated()
    parts: list[list[SinkRecord]] = [list(batch.records)]
    while parts:
        records = parts.pop()
        if not records:
            continue
        out.writes += 1
        try:
            out.failures += write(batch if len(records) == len(batch.records) else subset(batch, records))
        except BatchRefusedError as exc:
            if len(records) == 1:
                out.failures.append(RecordFailure(records[0], exc.error or exc, about_data=exc.about_data))
                continue
            mid = len(records) // 2
            parts += [records[mid:], records[:mid]]  # a stack: the first half is written first
    out.failures.sort(key=lambda f: f.record.offset)
    return out


def judge(batch: SinkBatch, failures: list[RecordFailure]) -> list[RecordFailure]:
    """Keep the failures that are the records' own; raise when the target refused the batch.

    Args:
        batch: the batch written.
        failures: the records the target refused (from :func:`bisect` or a sink's ``write``).

    Returns:
        The failures to dead-letter: all of them, when every one is about its data or another
        record of the batch was applied.

    Raises:
        SinkBlockedError: a record was refused for a reason not about its data and no record of
            the batch was applied: the target refuses them all (the message is the first such
            record's error, with how many records were refused).
    """
    if not failures or all(f.about_data for f in failures):
        return failures
    refused = {id(f.record) for f in failures}
    # neighbours are the records the sink writes: an update superseded in the batch by a newer
    # one of its key was never sent, so it proves nothing
    if any(id(r) not in refused for r in latest_per_key(batch.records)):
        return failures  # a neighbour was applied: the refusals are the records' own
    first = next(f for f in failures if not f.about_data)
    raise SinkBlockedError(
        f"{first.error} (every one of the batch's {len(batch.records)} record(s) refused, none applied: "
        "taken as the target's error, nothing dead-lettered)"
    )


def write_isolating(
    write: Callable[[SinkBatch], list[RecordFailure]], batch: SinkBatch, max_record_bytes: int | None = None
) -> list[RecordFailure]:
    """Write a batch by the blast-radius rule: records over the limit are refused unsent, the rest bisected, judged.

    Args:
        write: the sink's ``write``.
        batch: the batch.
        max_record_bytes: the sink's per-record limit, bytes (``None``: none).

    Returns:
        The records to dead-letter (stage ``write``), in offset order.

    Raises:
        SinkBlockedError: the target refused the batch as a whole (:func:`judge`), or the sink said so.
        SinkBackpressureError, RetriableError, FatalError: as the sink's ``write`` raised them.
    """
    too_big = oversized(batch.records, max_record_bytes)
    if too_big:
        big = {id(f.record) for f in too_big}
        log.warning("topic=%s partition=%d: %d record(s) over max_record_bytes=%d go to the dead letter topic unsent",
                    batch.topic, batch.partition, len(too_big), max_record_bytes)
        batch = subset(batch, [r for r in batch.records if id(r) not in big])
    result = bisect(write, batch) if batch.records else Isolated()
    if result.writes > 1:
        log.info("topic=%s partition=%d offsets=%d-%d: write refused, bisected in %d writes: %d record(s) refused",
                 batch.topic, batch.partition, batch.first_offset, batch.last_offset, result.writes,
                 len(result.failures))
    kept = judge(batch, result.failures)
    return sorted(too_big + kept, key=lambda f: f.record.offset)
