"""The blast-radius rule (sync_service/isolation.py) with a fake sink: pure logic, no services.

A record is dead-lettered only when the target named its data, or when its
neighbours in the batch were applied; an error every record hits blocks the batch.
"""

from __future__ import annotations

import pytest

from connectors.api.sink_records import RecordFailure, SinkBatch, SinkRecord
from kernel.exceptions import BatchRefusedError, SinkBlockedError
from sync_service.batching import RECORD_OVERHEAD_BYTES
from sync_service.isolation import bisect, judge, write_isolating


def _batch(n: int, sizes: dict[int, int] | None = None) -> SinkBatch:
    records = [SinkRecord("t", 0, i, i, {"id": i}, version=1,
                          size_bytes=RECORD_OVERHEAD_BYTES + (sizes or {}).get(i, 10)) for i in range(n)]
    return SinkBatch("t", 0, 0, n - 1, records)


class StatementSink:
    """Writes all records of a call in one statement, refused as a whole when it holds a bad record.

    Args:
        bad: offsets the target refuses; ``about_data`` says whether it names their data.
        everything: refuse every statement (a revoked privilege reported as a statement error).
    """

    def __init__(self, bad: set[int] = frozenset(), about_data: bool = True, everything: bool = False):
        self.bad, self.about_data, self.everything = set(bad), about_data, everything
        self.applied: set[int] = set()
        self.calls: list[list[int]] = []

    def write(self, batch: SinkBatch) -> list[RecordFailure]:
        offsets = [r.offset for r in batch.records]
        self.calls.append(offsets)
        if self.everything or self.bad & set(offsets):
            raise BatchRefusedError("refused", ValueError("22001: value too long"), about_data=self.about_data)
        self.applied |= set(offsets)
        return []


def test_bisecting_finds_the_refused_records_and_applies_every_other() -> None:
    sink = StatementSink(bad={3, 700})
    failures = write_isolating(sink.write, _batch(1_000))
    assert [f.record.offset for f in failures] == [3, 700]
    assert all(f.about_data and "22001" in str(f.error) for f in failures)
    assert sink.applied == set(range(1_000)) - {3, 700}
    # about 2 k log2(n / k) writes, far fewer than one per record
    assert len(sink.calls) < 50


def test_a_batch_without_refusals_is_one_write() -> None:
    sink = StatementSink()
    assert write_isolating(sink.write, _batch(100)) == []
    assert sink.calls == [list(range(100))]


def test_an_error_every_record_hits_blocks_the_batch_and_dead_letters_nothing() -> None:
    sink = StatementSink(about_data=False, everything=True)
    with pytest.raises(SinkBlockedError, match="every one of the batch's 8 record"):
        write_isolating(sink.write, _batch(8))
    assert sink.applied == set()


def test_an_unknown_refusal_with_applied_neighbours_is_the_records_own() -> None:
    sink = StatementSink(bad={5}, about_data=False)
    failures = write_isolating(sink.write, _batch(8))
    assert [(f.record.offset, f.about_data) for f in failures] == [(5, False)]
    assert sink.applied == set(range(8)) - {5}


def test_a_lone_record_refused_for_an_unknown_reason_is_blocked_not_dead_lettered() -> None:
    # the table is gone and the batch has one record: nothing tells its error from the target's
    sink = StatementSink(bad={0}, about_data=False)
    with pytest.raises(SinkBlockedError):
        write_isolating(sink.write, _batch(1))


def test_a_lone_record_refused_for_its_data_is_dead_lettered() -> None:
    sink = StatementSink(bad={0}, about_data=True)
    failures = write_isolating(sink.write, _batch(1))
    assert [f.record.offset for f in failures] == [0]


def test_every_record_refused_for_its_data_is_dead_lettered() -> None:
    sink = StatementSink(about_data=True, everything=True)
    assert [f.record.offset for f in write_isolating(sink.write, _batch(4))] == [0, 1, 2, 3]


def test_per_item_refusals_are_judged_by_their_neighbours() -> None:
    batch = _batch(4)

    def per_item(refused: list[int]) -> list[RecordFailure]:
        return [RecordFailure(r, RuntimeError("429 after 5 retries")) for r in batch.records if r.offset in refused]

    assert [f.record.offset for f in judge(batch, per_item([2]))] == [2]
    with pytest.raises(SinkBlockedError, match="429 after 5 retries"):
        judge(batch, per_item([0, 1, 2, 3]))


def test_an_update_superseded_in_the_batch_is_no_applied_neighbour() -> None:
    records = [SinkRecord("t", 0, 0, "k", {"v": 1}, version=1), SinkRecord("t", 0, 1, "k", {"v": 2}, version=2)]
    batch = SinkBatch("t", 0, 0, 1, records)
    with pytest.raises(SinkBlockedError):
        judge(batch, [RecordFailure(records[1], RuntimeError("refused"))])


def test_records_over_max_record_bytes_are_dead_lettered_unsent() -> None:
    sink = StatementSink()
    failures = write_isolating(sink.write, _batch(5, sizes={2: 5_000}), max_record_bytes=4_096)
    assert [f.record.offset for f in failures] == [2]
    assert failures[0].about_data and "5000 bytes is over max_record_bytes (4096 bytes)" in str(failures[0].error)
    assert sink.applied == {0, 1, 3, 4} and all(2 not in call for call in sink.calls)


def test_a_batch_of_only_oversized_records_sends_nothing() -> None:
    sink = StatementSink()
    failures = write_isolating(sink.write, _batch(2, sizes={0: 100, 1: 100}), max_record_bytes=50)
    assert len(failures) == 2 and sink.calls == []


def test_bisect_passes_on_what_is_not_a_refusal() -> None:
    def busy(_batch: SinkBatch) -> list[RecordFailure]:
        raise SinkBlockedError("permission denied for table items")

    with pytest.raises(SinkBlockedError, match="permission denied"):
        bisect(busy, _batch(3))
