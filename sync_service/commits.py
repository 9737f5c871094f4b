"""The sync service's commits: per partition, the first offset durable in every sink reading it.

Offsets are committed only after the writes they cover succeeded (Kafka Connect's ``preCommit``); a commit the
broker refuses is made again at the next turn. Also the consumer lag read from the partitions' end offsets.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from sync_service.state import TP, ServiceState

# the service's log lines keep the logger name they always had
log = logging.getLogger("sync_service.service")

# commit errors of a member whose group is rebalancing (its generation or membership is being renewed)
_REBALANCE_CODES = frozenset(
    (KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS, KafkaError.UNKNOWN_MEMBER_ID)
)
_REFUSAL_LOG_INTERVAL_S = 30.0  # a commit refused turn after turn is logged once per interval (then DEBUG)


class OffsetCommits(ServiceState):
    """Commit positions, commits and their results, lag (a mixin of ``SyncService``)."""

    # -- commits --------------------------------------------------------------------------------

    def _positions(self, tps: set[TP] | None = None) -> dict[TP, int]:
        """Per partition, the first offset not yet durable in every sink reading it."""
        out: dict[TP, int] = {}
        for tp in tps if tps is not None else self._assigned:
            offsets = []
            for slot in self._by_topic.get(tp[0], ()):
                buf = slot.buffers.get(tp)
                offsets.append(buf.safe_offset() if buf is not None else None)
            known = [o for o in offsets if o is not None]
            if offsets and len(known) == len(offsets):
                out[tp] = min(known)
        return out

    def _commit(self, asynchronous: bool, tps: set[TP] | None = None) -> None:
        todo = {tp: pos for tp, pos in self._positions(tps).items() if pos > self._committed.get(tp, -1)}
        if not todo:
            return
        offsets = [TopicPartition(t, p, pos) for (t, p), pos in sorted(todo.items())]
        try:
            self.consumer.commit(offsets=offsets, asynchronous=asynchronous)
        except KafkaException as exc:
            log.warning("commit of %s failed (retried at the next turn): %s", sorted(todo.items()), exc)
            return
        self._committed.update(todo)
        log.debug("committed %s", sorted(todo.items()))

    def _on_commit(self, err: Any, partitions: list[TopicPartition]) -> None:
        """The result of a commit, from librdkafka (called in ``consume()``, on the loop's thread).

        A refused commit (the whole request, or one partition) is forgotten, so the
        next turn's :meth:`_commit` makes it again: without this, an asynchronous
        commit refused during a rebalance stayed "done" and a partition that
        received nothing more kept its old committed offset (its lag never reached 0).
        """
        failed = [p for p in partitions if err is not None or p.error is not None]
        if not failed:
            return
        retry = []
        for p in failed:
            tp = (p.topic, p.partition)
            if self._committed.get(tp) == p.offset:  # not overtaken by a newer commit meanwhile
                del self._committed[tp]
                retry.append((tp, p.offset))
        if retry:  # (a refused synchronous commit raised in _commit, which logged it)
            error = err if err is not None else failed[0].error
            assert error is not None  # a failed partition carries its error
            # a commit made while the group rebalances is refused as a matter of course: not a warning;
            # a refusal that lasts (say, an ACL) is made again every turn but logged once per interval
            level = logging.INFO if error.code() in _REBALANCE_CODES else logging.WARNING
            now = time.monotonic()
            if now - self._refusals_logged.get(error.code(), -_REFUSAL_LOG_INTERVAL_S) < _REFUSAL_LOG_INTERVAL_S:
                level = logging.DEBUG
            else:
                self._refusals_logged[error.code()] = now
            log.log(level, "commit of %s refused (made again at the next turn): %s", sorted(retry), error)

    def _update_lag(self) -> None:
        self._last_lag = time.monotonic()
        lag: dict[str, int] = {}
        for tp in list(self._assigned):
            try:
                _low, high = self.consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
            except KafkaException:
                continue
            if high is None or high < 0:
                continue
            self._highs[tp] = high
            committed = self._committed.get(tp, 0)
            lag[tp[0]] = lag.get(tp[0], 0) + max(0, high - committed)
        for topic, value in lag.items():
            self.metrics.lag.labels(self.config.name, topic).set(value)

