"""A source task's positions: stored once acknowledged, or with the records in one transaction (exactly once).

Without transactions a position is written to the offsets topic once it and every batch before it are
acknowledged, at most every ``offset_flush_interval_s`` and on stop. With them (``exactly_once``, ``--group``
mode) the records and the position record covering them are committed in one Kafka transaction; an aborted
one rewinds the task to the last committed position, a fenced producer stops it.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from connectors.runtime import metrics
from connectors.runtime.offsets import PositionTracker
from connectors.runtime.runner_state import RunnerState
from kernel.exceptions import FatalError, RetriableError, SetupError, ThreesError
from kernel.kafka import clients

# the runner's log lines keep the logger name they always had
log = logging.getLogger("connectors.runtime.worker")

TRANSACTION_TIMEOUT_MS = 60_000
"""librdkafka's ``transaction.timeout.ms`` default: how long a dead producer's transaction holds readers back."""


FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH})
"""Errors saying another producer with the task's ``transactional.id`` took over: this one is a zombie."""

ABORT_ATTEMPTS = 10
"""``abort_transaction`` calls made while each times out (it goes on in the background between them)."""


def transaction_action(err: KafkaError | None) -> str:
    """What a failed transactional call asks for, from librdkafka's flags on its error.

    Args:
        err: the ``KafkaError`` of the ``KafkaException`` raised (``None`` when it carried none).

    Returns:
        ``"fenced"``: another instance of the task runs (``PRODUCER_FENCED``, ``INVALID_PRODUCER_EPOCH``,
        ``_FENCED``), nothing more may be written; ``"restart"``: the producer failed for good
        (``fatal()``, or an error librdkafka gives no action for): the task starts again with a new
        producer; ``"abort"``: ``txn_requires_abort()``, abort the transaction and send its records
        again from the last committed position; ``"retry"``: ``retriable()``, make the same call again
        (a timed-out commit or abort goes on in the background).
    """
    if err is None:
        return "restart"
    if err.code() in FENCED_CODES:
        return "fenced"
    if err.fatal():
        return "restart"
    if err.txn_requires_abort():
        return "abort"
    if err.retriable():
        return "retry"
    return "restart"


def transactional_id(offsets_topic: str, key: str) -> str:
    """The ``transactional.id`` of a task: stable across restarts and workers, unique per offsets key.

    Kafka Connect uses ``<group>-<connector>-<task>``; the offsets topic plays
    the group's part here (two pipelines with their own offsets topics never
    fence each other).
    """
    return f"threes-source.{offsets_topic}.{key}"


class PositionCommits(RunnerState):
    """Position writes, transactions and the clean stop (a mixin of ``TaskRunner``)."""

    def _produce_when_room(self, topic: str, value: bytes | None, key: bytes | None, **kwargs: Any) -> None:
        """Produce after the local queue was found full: serve delivery reports until there is room; never drop."""
        self.stats.queue_full += 1
        metrics.QUEUE_FULL.labels(self._label).inc()
        while True:
            self._producer.poll(0.05)
            try:
                self._producer.produce(topic, value, key, **kwargs)
                return
            except BufferError:
                continue

    # -- transactions (exactly once) ---------------------------------------------------------------------

    def _transactional_producer(self) -> Any:
        """A producer with the task's ``transactional.id``, initialised (older instances fenced).

        Raises:
            SetupError: the transaction coordinator did not answer.
        """
        overrides = {
            "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS,
            **self.producer_overrides,
            "transactional_id": self.transactional_id,
        }
        producer = clients.kafka_producer(self.kafka, **overrides)
        try:
            producer.init_transactions(self._tx_timeout_s)
        except KafkaException as exc:
            raise SetupError(
                f"source {self._label!r}: cannot initialise transactions (transactional.id "
                f"{self.transactional_id!r}): {exc}"
            ) from exc
        log.info(
            "source=%s task=%d transactional.id=%s initialised (older instances fenced)",
            self._label,
            self.task_id,
            self.transactional_id,
        )
        return producer

    def _begin(self, position: dict[str, Any] | None) -> None:
        """Open a transaction if none is open; remember the newest position it covers."""
        if not self._tx_open:
            try:
                self._producer.begin_transaction()
            except KafkaException as exc:
                self._transaction_failed(exc, "begin")
            self._tx_open = True
        if position is not None:
            self._tx_position = position

    def _commit_transaction(self, force: bool) -> None:
        """Add the position record to the open transaction and commit it (every flush interval unless forced).

        ``commit_transaction`` flushes every record first; once it returns, the
        records and the position are visible to ``read_committed`` readers
        together, or (after a crash before it) neither is.
        """
        _moved, acked = self._tracker.advance(raise_errors=False)  # progress only: failures surface at commit
        if acked:
            self.stats.acked += acked
            metrics.RECORDS_ACKED.labels(self._label).inc(acked)
        if not self._tx_open or not self._tx_whole:  # never in the middle of a system transaction
            return
        now = time.monotonic()
        if not force and now - self._last_write < self.offset_flush_interval_s:
            return
        position = self._tx_position
        if position is not None and position is not self._written:
            value = self.offsets.encode(self.key, self.config.name, self.task_id, self.config.topic, position)
            try:
                self._producer.produce(self.offsets.topic, value, self.key.encode())
            except BufferError:
                self._produce_when_room(self.offsets.topic, value, self.key.encode())
        while True:
            try:
                self._producer.commit_transaction(self._tx_timeout_s)
                break
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if transaction_action(err) == "retry":  # the commit goes on in the background: ask again
                    log.warning("source=%s commit of a transaction timed out, retrying: %s", self._label, err)
                    continue
                self._transaction_failed(exc, "commit")
        self._tx_open = False
        self._last_write = now
        _moved, acked = self._tracker.advance(raise_errors=False)
        if acked:
            self.stats.acked += acked
            metrics.RECORDS_ACKED.labels(self._label).inc(acked)
        metrics.IN_FLIGHT.labels(self._label).set(self.stats.produced - self.stats.acked)
        if position is not None and position is not self._written:
            self._written = position
            self.task.commit(position)
            self.stats.position = position
            self.stats.commits += 1
            metrics.POSITION_COMMITS.labels(self._label).inc()
            log.debug("source=%s committed transaction position=%s", self._label, position)

    def _transaction_failed(self, exc: KafkaException, step: str) -> None:
        """Handle a failed ``begin``/``commit``/``produce``: abort and rewind, restart, or stop when fenced.

        The action is librdkafka's (:func:`transaction_action`). A record refused at
        ``produce`` with ``_STATE`` means the transaction failed in the background (it
        is in its abortable state): it is aborted as well.

        Raises:
            RetriableError: the transaction was aborted; the task was rewound to
                the last committed position (the worker retries the cycle from it).
            FatalError: this producer was fenced (another instance of the task
                runs: this one is a zombie and must write nothing; ``_fenced`` set,
                the supervisor does not restart it), or it failed for good (a fatal
                error, or the abort failed): the supervisor restarts the task with a
                new producer, from the last committed position.
        """
        err = exc.args[0] if exc.args else None
        where = f"source {self._label!r} task {self.task_id} (transactional.id {self.transactional_id!r})"
        action = transaction_action(err)
        if step == "produce" and err is not None and err.code() == KafkaError._STATE:
            action = "abort"
        if action in ("abort", "retry"):
            self._abort(where, step, err)
            self._tx_open = False
            self._rewind()
            raise RetriableError(
                f"{where}: transaction aborted at {step} ({err}); resuming from the last committed position"
            ) from exc
        self._tx_open = False
        if action == "fenced":
            self._fenced = True
            raise FatalError(
                f"{where}: cannot {step} a transaction ({err}): another worker runs this task now (fenced); "
                "nothing more is written by this instance"
            ) from exc
        raise FatalError(
            f"{where}: cannot {step} a transaction ({err}): the producer failed for good; the task starts again "
            "with a new producer from the last committed position"
        ) from exc

    def _abort(self, where: str, step: str, err: KafkaError | None) -> None:
        """Abort the open transaction, asking again while the abort times out (at most :data:`ABORT_ATTEMPTS`).

        Raises:
            FatalError: the abort failed for good, or kept timing out (``_fenced`` set when fenced).
        """
        for attempt in range(1, ABORT_ATTEMPTS + 1):
            try:
                self._producer.abort_transaction(self._tx_timeout_s)
                return
            except KafkaException as abort_exc:
                abort_err = abort_exc.args[0] if abort_exc.args else None
                action = transaction_action(abort_err)
                if action == "retry" and attempt < ABORT_ATTEMPTS:
                    log.warning(
                        "source=%s abort of a transaction timed out (attempt %d), retrying: %s",
                        self._label,
                        attempt,
                        abort_err,
                    )
                    continue
                self._tx_open = False
                self._fenced = action == "fenced"
                raise FatalError(f"{where}: {step} failed ({err}) and the abort too: {abort_err}") from abort_exc

    def _rewind(self) -> None:
        """Start the task again from the last committed position (the aborted records are gone)."""
        self._tracker = PositionTracker()
        self._tx_position = None
        self._tx_whole = True
        try:
            self.task.close()
        except Exception as exc:  # the old instance is dropped either way
            log.warning("source=%s close before rewind failed: %s", self._label, exc)
        self.task = self._new_task()
        self.task.open(self._written)
        log.warning("source=%s task=%d rewound to position=%s", self._label, self.task_id, self._written)

    def _commit(self, force: bool = False, raise_errors: bool = True) -> None:
        """Write the newest acknowledged position (at most every flush interval unless forced)."""
        if self.transactional:
            self._commit_transaction(force)
            return
        _moved, acked = self._tracker.advance(raise_errors)
        if acked:
            self.stats.acked += acked
            metrics.RECORDS_ACKED.labels(self._label).inc(acked)
        metrics.IN_FLIGHT.labels(self._label).set(self.stats.produced - self.stats.acked)
        position = self._tracker.committable
        if position is None or position is self._written:
            return
        now = time.monotonic()
        if not force and now - self._last_write < self.offset_flush_interval_s:
            return
        value = self.offsets.encode(self.key, self.config.name, self.task_id, self.config.topic, position)
        try:
            self._producer.produce(self.offsets.topic, value, self.key.encode())
        except BufferError:
            self._produce_when_room(self.offsets.topic, value, self.key.encode())
        self._written = position
        self._last_write = now
        self.task.commit(position)
        self.stats.position = position
        self.stats.commits += 1
        metrics.POSITION_COMMITS.labels(self._label).inc()
        log.debug("source=%s position=%s", self._label, position)

    def _drain(self, timeout_s: float | None = None, raise_errors: bool = True) -> None:
        """Wait until every produced record is acknowledged (or failed), committing as acks arrive.

        With transactions the open one is committed: a ``read_committed``
        reader of the state topic (reconciliation) must see every record, and
        an open transaction of ours would hold its read back.
        """
        if self.transactional:
            self._commit_transaction(force=True)
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._tracker.in_flight > 0:
            if deadline is not None and time.monotonic() > deadline:
                raise RetriableError(
                    f"source {self._label!r}: {self._tracker.in_flight} records not acknowledged within {timeout_s} s"
                )
            self._producer.poll(0.1)
            if raise_errors and self._tracker.first_error():
                break
        self._commit(raise_errors=raise_errors)

    def _shutdown_transactional(self) -> None:
        """Commit the open transaction on a clean stop; abort it after a failure (records replay from the position)."""
        if self._fenced or not self._tx_open:
            pass
        elif self.stats.state == "failed" or not self._tx_whole:  # a half system transaction is read again
            try:
                self._producer.abort_transaction(self._tx_timeout_s)
            except KafkaException as exc:
                log.error("source=%s on stop: abort failed: %s", self._label, exc)
        else:
            try:
                self._commit_transaction(force=True)
            except ThreesError as exc:
                log.error("source=%s on stop: %s", self._label, exc)
        log.info(
            "source=%s stopped rows_read=%d acked=%d tombstones=%d position=%s",
            self._label,
            self.stats.rows_read,
            self.stats.acked,
            self.stats.tombstones,
            self.stats.position,
        )

    def _shutdown(self) -> None:
        try:
            if self._producer is not None and self.transactional:
                self._shutdown_transactional()
            elif self._producer is not None:
                try:
                    # store what is acknowledged, up to (not past) a failed batch: records replay on restart
                    self._drain(timeout_s=60.0, raise_errors=False)
                    self._commit(force=True, raise_errors=False)
                except ThreesError as exc:
                    log.error("source=%s on stop: %s", self._label, exc)
                remaining = self._producer.flush(30.0)
                if remaining:
                    log.error("source=%s on stop: %d records/positions not acknowledged", self._label, remaining)
                log.info(
                    "source=%s stopped rows_read=%d acked=%d tombstones=%d position=%s",
                    self._label,
                    self.stats.rows_read,
                    self.stats.acked,
                    self.stats.tombstones,
                    self.stats.position,
                )
        finally:
            if self._live is not None:
                self._live.close()
                self._live = None
            try:
                self.task.close()
            except Exception as exc:  # closing must not hide the real error
                log.warning("source=%s close failed: %s", self._label, exc)
