"""The sync service's partition hand-off: assignment, revoke (flush, await, commit), loss and shutdown."""

from __future__ import annotations

import logging
import queue
import time
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from sync_service.commits import OffsetCommits
from sync_service.dispatch import BatchDispatch
from sync_service.state import TP
from sync_service.status import ServiceStatus

# the service's log lines keep the logger name they always had
log = logging.getLogger("sync_service.service")


class PartitionHandoff(BatchDispatch, OffsetCommits, ServiceStatus):
    """Rebalance callbacks and the clean shutdown (a mixin of ``SyncService``, over the loop's other parts)."""

    # -- rebalance ------------------------------------------------------------------------------

    def _on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        tps = {(p.topic, p.partition) for p in partitions}
        if self.operator.active and partitions:
            # paused by the operator: these partitions deliver nothing either (a rebalance never resumes)
            self.consumer.incremental_assign(partitions)
            self.consumer.pause(partitions)
            self._paused |= tps
        was_ready = bool(self._assigned)
        self._assigned |= tps
        self.metrics.assigned.labels(self.config.name).set(len(self._assigned))
        log.info("assigned partitions=%s", sorted(tps))
        if self._assigned and not was_ready:
            log.info("sync service=%s ready: %d partition(s) assigned", self.config.name, len(self._assigned))
        if self._status_doc.get("state") == "waiting_for_partitions":
            self._update_status()  # ready now, not at the next second's refresh

    def _drain(self, tps: set[TP], timeout_s: float) -> bool:
        """Flush the buffers of ``tps`` and wait for their writes; ``False`` on timeout or failure."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._fatal is None:
            self._take_outcomes()
            self._dispatch(only=tps, force=True)
            busy = any(
                (buf.records or buf.inflight is not None)
                for slot in self.slots if slot.state == "running" for tp, buf in slot.buffers.items() if tp in tps
            )
            if not busy:
                return True
            time.sleep(0.01)
        return False

    def _forget(self, tps: set[TP]) -> None:
        for slot in self.slots:
            for tp in tps:
                slot.buffers.pop(tp, None)
        for tp in tps:
            self._committed.pop(tp, None)
        self._assigned -= tps
        self._paused -= tps
        self.metrics.assigned.labels(self.config.name).set(len(self._assigned))

    def _on_revoke(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        tps = {(p.topic, p.partition) for p in partitions}
        drained = self._drain(tps, self.config.revoke_timeout_s)
        self._commit(asynchronous=False, tps=tps & self._assigned)
        if not drained:
            log.warning("revoked partitions=%s before every write finished: the new owner writes them again "
                        "(harmless, updates are versioned)", sorted(tps))
        self._forget(tps)
        log.info("revoked partitions=%s", sorted(tps))

    def _on_lost(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        tps = {(p.topic, p.partition) for p in partitions}
        log.warning("lost partitions=%s (no commit: another member owns them now)", sorted(tps))
        self._forget(tps)

    # -- shutdown -------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        if self.consumer is None:
            return
        try:
            if self._fatal is None and self._assigned:
                # stop fetching but keep polling (membership) while the last writes finish
                self.consumer.pause([TopicPartition(t, p) for t, p in sorted(self._assigned)])
                deadline = time.monotonic() + self.config.revoke_timeout_s
                while time.monotonic() < deadline and self._fatal is None:
                    self._take_outcomes()
                    self._dispatch(force=True)
                    # a failed sink's batches are not waited for: its new owner or next start writes them
                    if not any(b.records or b.inflight for s in self.slots if s.state == "running"
                               for b in s.buffers.values()):
                        break
                    self.consumer.consume(num_messages=1, timeout=0.05)
            else:
                self._wait_inflight(10.0)
            self._commit(asynchronous=False)
            log.info("sync service=%s committed=%s", self.config.name, sorted(self._committed.items()))
        except KafkaException as exc:
            log.warning("final commit failed: %s", exc)
        finally:
            try:
                self.consumer.close()
            finally:
                for slot in self.slots:
                    slot.pool.shutdown(wait=True, cancel_futures=True)
                    slot.sink.close()
                if self.producer is not None:
                    self.producer.flush(10.0)
                self.consumer = None
                log.info("sync service=%s stopped", self.config.name)

    def _wait_inflight(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while any(s.inflight for s in self.slots) and time.monotonic() < deadline:
            try:
                self._apply_outcome(self._outcomes.get(timeout=0.1))
            except queue.Empty:
                continue
