"""TaskRunner's transaction failures, by librdkafka's error flags: retry the call, abort and rewind, restart, or stop.

Logic only: the producer and its errors are stand-ins (``KafkaError`` built with the flags librdkafka sets;
the real broker paths are covered by tests/integration/sources/test_exactly_once.py, test_group_fencing.py
and the leader failover drill, tests/integration/ops/test_leader_failover.py).
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from connectors.runtime import position_commits
from connectors.runtime.offsets import PositionTracker
from connectors.runtime.position_commits import transaction_action, transactional_id
from connectors.runtime.runner_state import RunnerStats
from connectors.runtime.worker import TaskRunner
from kernel.exceptions import FatalError, RetriableError

TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "commit_transaction timed out", retriable=True)
ABORTABLE = KafkaError(KafkaError._MSG_TIMED_OUT, "1 message failed", txn_requires_abort=True)
FENCED = KafkaError(KafkaError.PRODUCER_FENCED, "fenced by a newer instance", fatal=True)
EPOCH = KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, "old epoch", fatal=True)
FATAL = KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence broken", fatal=True)
STATE = KafkaError(KafkaError._STATE, "Producing not allowed in transactional state AbortableError")


class Producer:
    """Raises the queued errors of each call, in order, then succeeds."""

    def __init__(self, commit: list[KafkaError] | None = None, abort: list[KafkaError] | None = None) -> None:
        self.errors = {"commit": list(commit or []), "abort": list(abort or [])}
        self.calls = {"commit": 0, "abort": 0}

    def _call(self, what: str) -> None:
        self.calls[what] += 1
        if self.errors[what]:
            raise KafkaException(self.errors[what].pop(0))

    def commit_transaction(self, _timeout: float) -> None:
        self._call("commit")

    def abort_transaction(self, _timeout: float) -> None:
        self._call("abort")

    def produce(self, *_args: Any, **_kwargs: Any) -> None:
        pass


class Task:
    opened: list[Any] = []

    def open(self, position: Any) -> None:
        Task.opened.append(position)

    def close(self) -> None:
        pass

    def commit(self, _position: Any) -> None:
        pass


class Config:
    name, topic = "src", "state.src"


class Offsets:
    topic = "_threes_offsets"

    def encode(self, *_args: Any) -> bytes:
        return b"position"


def _runner(producer: Producer | None = None) -> TaskRunner:
    runner = object.__new__(TaskRunner)
    runner._label, runner.task_id, runner.key = "src", 0, "src"
    runner.transactional, runner.transactional_id = True, transactional_id("_threes_offsets", "src")
    runner._producer, runner._tx_open, runner._fenced = producer or Producer(), True, False
    runner._tx_whole = True  # no part of a system transaction waits for its rest
    runner._tx_timeout_s, runner._tx_position = 1.0, {"after": 9}
    runner._written, runner._last_write, runner.offset_flush_interval_s = {"after": 5}, 0.0, 1.0
    runner._tracker, runner.stats, runner.offsets = PositionTracker(), RunnerStats(), Offsets()
    runner.task, runner.config = Task(), Config()
    runner._new_task = lambda: Task()  # type: ignore[method-assign]
    Task.opened = []
    return runner


def test_each_error_kind_gets_librdkafkas_action() -> None:
    assert transaction_action(TIMED_OUT) == "retry"
    assert transaction_action(ABORTABLE) == "abort"
    assert transaction_action(FENCED) == transaction_action(EPOCH) == "fenced"
    assert transaction_action(KafkaError(KafkaError._FENCED, "fenced", fatal=True)) == "fenced"
    assert transaction_action(FATAL) == "restart"  # fatal: only a new producer can go on
    assert transaction_action(STATE) == transaction_action(None) == "restart"


def test_a_timed_out_commit_is_asked_again_and_the_position_moves() -> None:
    runner = _runner(Producer(commit=[TIMED_OUT, TIMED_OUT]))
    runner._commit_transaction(force=True)
    assert runner._producer.calls == {"commit": 3, "abort": 0}
    assert runner._written == {"after": 9} and not runner._tx_open and Task.opened == []


def test_an_aborted_transaction_rewinds_the_task_to_the_committed_position() -> None:
    runner = _runner(Producer(commit=[ABORTABLE]))
    with pytest.raises(RetriableError, match="aborted"):
        runner._commit_transaction(force=True)
    assert runner._producer.calls == {"commit": 1, "abort": 1} and not runner._tx_open
    assert Task.opened == [{"after": 5}]  # a new task instance, from the last committed position
    assert runner._tx_position is None and not runner._fenced and runner._written == {"after": 5}


def test_a_timed_out_abort_is_asked_again_before_the_rewind() -> None:
    runner = _runner(Producer(commit=[ABORTABLE], abort=[TIMED_OUT, TIMED_OUT]))
    with pytest.raises(RetriableError, match="aborted"):
        runner._commit_transaction(force=True)
    assert runner._producer.calls == {"commit": 1, "abort": 3}
    assert Task.opened == [{"after": 5}] and not runner._fenced


def test_an_abort_that_keeps_timing_out_fails_the_task_for_a_restart() -> None:
    runner = _runner(Producer(commit=[ABORTABLE], abort=[TIMED_OUT] * position_commits.ABORT_ATTEMPTS))
    with pytest.raises(FatalError, match="abort too"):
        runner._commit_transaction(force=True)
    assert runner._producer.calls["abort"] == position_commits.ABORT_ATTEMPTS
    assert not runner._fenced and not runner._tx_open and Task.opened == []


def test_a_fenced_producer_stops_the_task_for_good() -> None:
    for err in (FENCED, EPOCH):
        runner = _runner(Producer(commit=[err]))
        with pytest.raises(FatalError, match="fenced"):
            runner._commit_transaction(force=True)
        assert runner._fenced and runner._producer.calls["abort"] == 0 and Task.opened == []


def test_a_fatal_error_fails_the_task_for_a_restart_with_a_new_producer() -> None:
    runner = _runner(Producer(commit=[FATAL]))
    with pytest.raises(FatalError, match="new producer"):
        runner._commit_transaction(force=True)
    # not fenced: the supervisor restarts the task (a new producer, from the last committed position)
    assert not runner._fenced and not runner._tx_open and runner._producer.calls["abort"] == 0
    assert runner._written == {"after": 5}


def test_a_record_refused_because_the_transaction_failed_aborts_and_rewinds() -> None:
    runner = _runner()
    pending = runner._tracker.add(3, {"after": 12}, "src")
    with pytest.raises(RetriableError, match="aborted at produce"):
        runner._refused(pending, 3, KafkaException(STATE))
    assert runner._producer.calls["abort"] == 1 and Task.opened == [{"after": 5}] and not runner._fenced


def test_a_record_refused_for_itself_still_stops_the_task() -> None:
    runner = _runner()
    pending = runner._tracker.add(1, {"after": 12}, "src")
    error = runner._refused(pending, 1, KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "too large")))
    assert isinstance(error, FatalError) and "refused" in str(error) and runner._producer.calls["abort"] == 0


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
    assert runner._producer.calls["abort"] == 1 and runner._producer.committed == 0
