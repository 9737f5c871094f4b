"""``SinkContract``: what every sink must do, against its real target.

A sink test subclasses :class:`SinkContract` and provides two fixtures and one
method (Kafka is not needed: the contract hands the sink batches as the sync
service would):

* ``sink``: an opened sink writing to a fresh table/index/prefix;
* ``bad_sink``: the same sink with wrong credentials or address (not opened);
* ``state(sink)``: the target's state as ``{key_id: (version, value)}``.

The contract (CONVENTIONS.md, ``kernel/updates.py``): a batch is written
once; a replayed batch changes nothing; a tombstone deletes; an older version
never overwrites a newer one; ``check()`` fails fast on bad credentials.

The batches hold ``ITEM_SCHEMA`` records (:func:`item`); keys are the ints ``0..keys-1``,
and ``state`` keys them by ``str(key)``. Example::

    from threes.testing.sink import SinkContract

    class TestMySinkContract(SinkContract):
        @pytest.fixture
        def sink(self, tmp_path): ...        # opened, writing to a fresh target
        @pytest.fixture
        def bad_sink(self, tmp_path): ...    # wrong credentials, not opened
        def state(self, sink): ...           # {str(key): (version, value)}
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import fastavro
import pytest

from connectors.api.sink import Sink
from connectors.api.sink_records import SinkBatch, SinkRecord
from kernel.exceptions import SetupError
from schemas.serde import fingerprint

ITEM_SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Item",
    "namespace": "threes.test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "qty", "type": "int"},
        {"name": "updated_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
"""The Avro value schema of the contract's update records."""
PARSED = fastavro.parse_schema(ITEM_SCHEMA)
FP = fingerprint(ITEM_SCHEMA)
BASE_TIME = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
"""``updated_at`` of version 0; version ``v`` is ``v`` seconds later."""


def item(key: int, version: int, qty: int | None = None) -> dict[str, Any]:
    """The value of key ``key`` at ``version`` (fields derived from both, so a test can recognise them)."""
    return {
        "id": key,
        "name": f"item-{key}-v{version}",
        "qty": qty if qty is not None else version * 10 + key % 7,
        "updated_at": BASE_TIME + timedelta(seconds=version),
        "note": None if key % 2 else f"n{key}",
    }


def record(key: int, version: int, offset: int, *, delete: bool = False, topic: str = "updates.items",
           partition: int = 0) -> SinkRecord:
    """An update record of ``key`` at ``version`` (a tombstone with ``delete``), as the sync service decodes it."""
    value = None if delete else item(key, version)
    return SinkRecord(
        topic=topic, partition=partition, offset=offset, key=key, value=value, version=version,
        timestamp_ms=int(BASE_TIME.timestamp() * 1000) + offset, size_bytes=100,
        value_schema=None if delete else PARSED, value_fingerprint=None if delete else FP,
    )


def batch(records: list[SinkRecord]) -> SinkBatch:
    """One batch of ``records`` (of one topic partition), covering their offsets."""
    return SinkBatch(records[0].topic, records[0].partition, records[0].offset, records[-1].offset, records)


def expected(key: int, version: int) -> dict[str, Any]:
    """The value the target must hold for ``key`` at ``version``."""
    return item(key, version)


class SinkContract:
    """Subclass with fixtures ``sink`` and ``bad_sink`` and a ``state`` method (see module docstring)."""

    keys = 40

    def state(self, sink: Sink) -> dict[str, tuple[int, dict[str, Any]]]:  # pragma: no cover - abstract
        """The target's live entities: ``str(key)`` -> ``(version, value)``; deleted keys absent."""
        raise NotImplementedError

    def artifacts(self, sink: Sink) -> object:
        """What a replay must not change besides the state (S3: the object names). None by default."""
        return None

    def assert_value(self, got: dict[str, Any], want: dict[str, Any]) -> None:
        """Assert that a value read back from the target equals the one written (override for lossy targets)."""
        for field in ("id", "name", "qty", "note"):
            assert got[field] == want[field], (field, got, want)

    def test_batch_is_written_once(self, sink: Sink) -> None:
        """A batch's records are all in the target, each once, with its version."""
        recs = [record(k, 1, k) for k in range(self.keys)]
        assert sink.write(batch(recs)) == []
        state = self.state(sink)
        assert sorted(state) == sorted(str(k) for k in range(self.keys))
        for k in range(self.keys):
            version, value = state[str(k)]
            assert version == 1
            self.assert_value(value, expected(k, 1))

    def test_replayed_batch_changes_nothing(self, sink: Sink) -> None:
        """Batches written again after newer ones change neither the state nor the artifacts."""
        first = [record(k, 2, k) for k in range(self.keys)]
        second = [record(k, 3, self.keys + k) for k in range(0, self.keys, 2)]
        sink.write(batch(first))
        sink.write(batch(second))
        before, artifacts = self.state(sink), self.artifacts(sink)
        sink.write(batch(first))  # replay of an older batch after a newer one
        sink.write(batch(second))
        assert self.state(sink) == before
        assert self.artifacts(sink) == artifacts
        assert before["0"][0] == 3 and before["1"][0] == 2

    def test_tombstone_deletes(self, sink: Sink) -> None:
        """A newer tombstone deletes its key."""
        sink.write(batch([record(k, 1, k) for k in range(10)]))
        sink.write(batch([record(k, 2, 10 + k, delete=True) for k in range(0, 10, 3)]))
        state = self.state(sink)
        assert sorted(state, key=int) == [str(k) for k in range(10) if k % 3]

    def test_stale_tombstone_does_not_delete(self, sink: Sink) -> None:
        """A tombstone older than the row it would delete is ignored."""
        sink.write(batch([record(k, 5, k) for k in range(4)]))
        sink.write(batch([record(k, 4, 4 + k, delete=True) for k in range(4)]))
        state = self.state(sink)
        assert sorted(state, key=int) == ["0", "1", "2", "3"]
        assert all(v == 5 for v, _ in state.values())

    def test_update_older_than_a_delete_never_recreates_the_key(self, sink: Sink) -> None:
        """A late update older than a delete does not bring its key back."""
        sink.write(batch([record(k, 1, k) for k in range(4)]))
        sink.write(batch([record(k, 3, 4 + k, delete=True) for k in range(4)]))
        sink.write(batch([record(k, 2, 8 + k) for k in range(4)]))  # late, older than the delete
        # a delete of a key the target never held, then an older update of it
        sink.write(batch([record(20, 5, 12, delete=True)]))
        sink.write(batch([record(20, 4, 13)]))
        assert self.state(sink) == {}
        sink.write(batch([record(1, 4, 14)]))  # newer than the delete: the key lives again
        state = self.state(sink)
        assert list(state) == ["1"] and state["1"][0] == 4
        sink.write(batch([record(1, 3, 15)]))  # older than the new row: ignored
        assert self.state(sink)["1"][0] == 4

    def test_older_version_never_overwrites_newer(self, sink: Sink) -> None:
        """The newest version wins, across batches and within one."""
        sink.write(batch([record(k, 7, k) for k in range(6)]))
        sink.write(batch([record(k, 6, 6 + k) for k in range(6)]))
        # out of order inside one batch too: the newer version wins whatever the offsets
        sink.write(batch([record(10, 9, 20), record(10, 8, 21)]))
        state = self.state(sink)
        for k in range(6):
            assert state[str(k)][0] == 7
            self.assert_value(state[str(k)][1], expected(k, 7))
        assert state["10"][0] == 9
        self.assert_value(state["10"][1], expected(10, 9))

    def test_check_fails_fast_on_bad_credentials(self, bad_sink: Sink) -> None:
        """``check()`` raises ``SetupError`` on wrong credentials."""
        with pytest.raises(SetupError):
            bad_sink.check()
