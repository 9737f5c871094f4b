"""TaskRunner's transaction failures: an aborted transaction rewinds the task, a fenced producer stops it.

Logic only: the producer and its errors are stand-ins (the real broker paths are
covered by tests/integration/sources/test_exactly_once.py and test_group_fencing.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaException

from connectors.runtime.offsets import PositionTracker
from connectors.runtime.position_commits import transactional_id
from connectors.runtime.worker import TaskRunner
from kernel.exceptions import FatalError, RetriableError


class Err:
    def __init__(self, abortable: bool, fatal: bool) -> None:
        self._abortable, self._fatal = abortable, fatal

    def txn_requires_abort(self) -> bool:
        return self._abortable

    def fatal(self) -> bool:
        return self._fatal

    def retriable(self) -> bool:
        return False

    def __str__(self) -> str:
        return "abortable" if self._abortable else "fenced"


class Producer:
    def __init__(self) -> None:
        self.aborted = 0

    def abort_transaction(self, _timeout: float) -> None:
        self.aborted += 1


class Task:
    opened: list[Any] = []

    def open(self, position: Any) -> None:
        Task.opened.append(position)

    def close(self) -> None:
        pass


def _runner() -> TaskRunner:
    runner = object.__new__(TaskRunner)
    runner._label, runner.task_id = "src", 0
    runner.transactional_id = transactional_id("_threes_offsets", "src")
    runner._producer, runner._tx_open, runner._fenced = Producer(), True, False
    runner._tx_timeout_s, runner._tx_position = 1.0, {"after": 9}
    runner._written = {"after": 5}
    runner._tracker = PositionTracker()
    runner.task = Task()
    runner._new_task = lambda: Task()  # type: ignore[method-assign]
    return runner


def test_an_aborted_transaction_rewinds_the_task_to_the_committed_position() -> None:
    runner = _runner()
    Task.opened = []
    with pytest.raises(RetriableError, match="aborted"):
        runner._transaction_failed(KafkaException(Err(abortable=True, fatal=False)), "commit")
    assert runner._producer.aborted == 1 and not runner._tx_open
    assert Task.opened == [{"after": 5}]  # a new task instance, from the last committed position
    assert runner._tx_position is None and not runner._fenced


def test_a_fenced_producer_stops_the_task_for_good() -> None:
    runner = _runner()
    Task.opened = []
    with pytest.raises(FatalError, match="fenced"):
        runner._transaction_failed(KafkaException(Err(abortable=False, fatal=True)), "commit")
    assert runner._fenced and runner._producer.aborted == 0 and Task.opened == []


def test_transactional_ids_are_per_task_and_offsets_topic() -> None:
    assert transactional_id("_threes_offsets", "orders#1") == "threes-source._threes_offsets.orders#1"
    assert transactional_id("other", "orders#1") != transactional_id("_threes_offsets", "orders#1")


class Committing(Producer):
    def __init__(self) -> None:
        super().__init__()
        self.committed = 0

    def commit_transaction(self, _timeout: float) -> None:
        self.committed += 1


def test_no_kafka_transaction_ends_in_the_middle_of_a_system_transaction() -> None:
    """``SourceBatch.continues``: a change stream's large transaction is never split over Kafka transactions."""
    from connectors.runtime.runner_state import RunnerStats

    runner = _runner()
    runner._producer = Committing()
    runner.stats = RunnerStats()
    runner.offset_flush_interval_s, runner._last_write = 0.0, 0.0
    runner._tx_whole = False  # a part of a system transaction was sent, its rest follows
    runner._commit_transaction(force=True)
    assert runner._producer.committed == 0 and runner._tx_open
    runner.stats.state = "stopped"  # a clean stop in the middle: the open transaction is aborted (read again)
    runner._shutdown_transactional()
    assert runner._producer.aborted == 1 and runner._producer.committed == 0
