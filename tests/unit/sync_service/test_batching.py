from __future__ import annotations

from kernel.config.policies import BatchPolicy
from sync_service.batching import RECORD_OVERHEAD_BYTES, PartitionBuffer, message_size
from tests.unit.sync_service.fakes import FakeMessage


def buffer(**policy: int) -> PartitionBuffer:
    return PartitionBuffer("s", "t", 0, BatchPolicy(**policy))


def test_message_size_counts_key_value_headers_and_overhead() -> None:
    msg = FakeMessage(0, b"kk", b"vvvv", headers=[("version", b"12345678")])
    assert message_size(msg) == RECORD_OVERHEAD_BYTES + 2 + 4 + 7 + 8
    assert message_size(FakeMessage(0, None, None)) == RECORD_OVERHEAD_BYTES


def test_due_by_records() -> None:
    b = buffer(max_records=3, max_age_ms=60_000)
    for off in range(2):
        b.add(FakeMessage(off), 10, now=0.0)
    assert not b.due(now=0.0)
    b.add(FakeMessage(2), 10, now=0.0)
    assert b.full() and b.due(now=0.0)


def test_due_by_bytes() -> None:
    b = buffer(max_bytes=100, max_age_ms=60_000)
    b.add(FakeMessage(0), 60, now=0.0)
    assert not b.due(now=0.0)
    b.add(FakeMessage(1), 40, now=0.0)
    assert b.due(now=0.0)


def test_due_by_age_without_new_records() -> None:
    b = buffer(max_age_ms=500)
    b.add(FakeMessage(0), 10, now=10.0)
    assert not b.due(now=10.4)
    assert b.due(now=10.5)
    assert not buffer().due(now=1e9)  # empty: never due


def test_take_cuts_at_max_records_and_keeps_the_rest() -> None:
    b = buffer(max_records=2)
    msgs = [FakeMessage(o, b"k", b"v") for o in range(5)]
    for m in msgs:
        b.add(m, message_size(m))
    job = b.take()
    assert [m.offset() for m in job.raw] == [0, 1] and (job.first_offset, job.last_offset) == (0, 1)
    assert [m.offset() for m in b.records] == [2, 3, 4]
    assert b.bytes == 3 * message_size(msgs[0]) and job.size_bytes == 2 * message_size(msgs[0])
    assert b.total_bytes == 5 * message_size(msgs[0])


def test_safe_offset_is_first_record_not_yet_durable() -> None:
    b = buffer(max_records=2)
    assert b.safe_offset() is None
    for o in range(10, 14):
        b.add(FakeMessage(o), 1)
    assert b.safe_offset() == 10
    b.take()
    assert b.safe_offset() == 10  # in flight: not durable yet
    b.complete()
    assert b.safe_offset() == 12
    b.take()
    b.complete()
    assert b.safe_offset() == 14  # all durable: the next offset to consume


def test_due_when_idle_needs_records_and_the_policy() -> None:
    b = buffer(max_age_ms=60_000)
    assert not b.due_when_idle()  # empty
    b.add(FakeMessage(0), 10, now=0.0)
    assert b.due_when_idle() and not b.due(now=0.0)
    off = PartitionBuffer("s", "t", 0, BatchPolicy(max_age_ms=60_000, flush_when_idle=False))
    off.add(FakeMessage(0), 10, now=0.0)
    assert not off.due_when_idle()
