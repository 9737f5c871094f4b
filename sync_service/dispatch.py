"""The sync service's batches: route consumed records to sink buffers, hand due batches to the sinks' pools.

Also the outcomes of finished writes (a durable batch, backpressure, a failed or blocked sink restarted after a
backoff) and the pausing of the partitions that feed a sink over its share of the memory bound.
"""

from __future__ import annotations

import logging
import queue
import time
from typing import Any

from confluent_kafka import TopicPartition

from sync_service.batching import PartitionBuffer
from sync_service.state import TP, Reopened, ServiceState, SinkSlot
from sync_service.writer import Outcome

# the service's log lines keep the logger name they always had
log = logging.getLogger("sync_service.service")


class BatchDispatch(ServiceState):
    """Buffers, dispatch, outcomes and backpressure of the sync service's loop (a mixin of ``SyncService``)."""

    def _route(self, tp: TP, msgs: list[Any], size: int) -> int:
        """Buffer consecutive records of one partition (``size`` bytes) for every sink of the topic."""
        self.metrics.records_in.labels(self.config.name, tp[0]).inc(len(msgs))
        for slot in self._by_topic.get(tp[0], ()):
            buf = slot.buffers.get(tp)
            if buf is None:
                buf = slot.buffers[tp] = PartitionBuffer(
                    slot.sink.name, tp[0], tp[1], slot.sink.batch_policy(self.config.batch)
                )
            buf.extend(msgs, size)
        return size

    def _submit(self, slot: SinkSlot, job: Any) -> None:
        slot.inflight += 1
        job.waiting = False
        future = slot.pool.submit(slot.writer.run, job)
        future.add_done_callback(lambda f: self._outcomes.put(f.result()))

    def _dispatch(self, only: set[TP] | None = None, force: bool = False, idle: bool = False) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.state == "restarting":
                if now < slot.restart_at:
                    continue
                slot.state = "recovering"
                assert slot.backoff is not None
                slot.backoff.restarting()
                self.metrics.restarts.labels(self.config.name, slot.sink.name).inc()
                log.info("sink=%s restarting (restart %d)", slot.sink.name, slot.backoff.restarts)
                if not any(b.inflight is not None for b in slot.buffers.values()):
                    # nothing failed to write (it failed opening): opening it again is the restart
                    slot.inflight += 1
                    slot.pool.submit(self._reopen, slot)
            eager = force or slot.memory_paused
            for tp, buf in slot.buffers.items():
                if only is not None and tp not in only:
                    continue
                job = buf.inflight
                if slot.state == "recovering" and slot.inflight > 0:
                    break  # one batch at a time until the restarted sink wrote one
                if job is not None:
                    if job.waiting and now >= job.not_before and slot.inflight < slot.limiter.limit:
                        job.not_before = 0.0
                        self._submit(slot, job)  # the backpressure or restart delay passed: write it again
                    continue
                if not buf.records or slot.inflight >= slot.limiter.limit:
                    continue
                if eager or buf.due(now) or (idle and buf.due_when_idle()):
                    self._submit(slot, buf.take())

    def _take_outcomes(self) -> None:
        while True:
            try:
                outcome = self._outcomes.get_nowait()
            except queue.Empty:
                return
            self._apply_outcome(outcome)

    def _sink_failed(self, slot: SinkSlot, error: BaseException, blocked: bool = False) -> None:
        """Fail the sink's task: its partitions pause and it is restarted (reopened) after a backoff.

        Its buffered and failed batches stay: the restart writes the failed batch
        first, so the committed offset never passes it. Other sinks go on.

        Args:
            slot: the sink.
            error: why.
            blocked: the target refuses any record (``SinkBlockedError``): ``last_error`` reads
                ``blocked: <error>`` and the sink's state in the status document ``blocked``
                until a batch is written.
        """
        assert slot.backoff is not None
        if slot.state == "restarting":
            return  # another in-flight batch failed with it: one failure, one restart
        delay = slot.backoff.failed(error)
        slot.state = "restarting"
        slot.restart_at = time.monotonic() + delay
        slot.blocked = blocked
        slot.last_error = (f"blocked: {error}" if blocked else str(error))[:2000]
        slot.writer.needs_open = True
        log.error("sink=%s task failed (%d in a row), restarting in %.1f s: %s", slot.sink.name,
                  slot.backoff.failures, delay, error)

    def _reopen(self, slot: SinkSlot) -> None:
        """Open a failed sink again (a worker thread); the loop learns the result through the outcomes queue."""
        try:
            slot.writer._reopen()
        except Exception as exc:  # reported to the loop, which backs off again
            self._outcomes.put(Reopened(slot, exc))
            return
        self._outcomes.put(Reopened(slot, None))

    def _slot(self, name: str) -> SinkSlot:
        return next(s for s in self.slots if s.sink.name == name)

    def _apply_outcome(self, outcome: Outcome | Reopened) -> None:
        if isinstance(outcome, Reopened):
            outcome.slot.inflight -= 1
            if outcome.error is None:
                outcome.slot.state = "running"
                log.info("sink=%s recovered: opened again", outcome.slot.sink.name)
            else:
                outcome.slot.state = "running"
                self._sink_failed(outcome.slot, outcome.error)
            return
        job = outcome.job
        slot = self._slot(job.sink)
        slot.inflight -= 1
        buf = slot.buffers.get((job.topic, job.partition))
        if buf is None or buf.inflight is not job:
            return  # the partition was revoked or lost meanwhile: its new owner writes it again
        name, sink = self.config.name, slot.sink.name
        if outcome.status == "done":
            buf.complete()
            self._done(slot, outcome)
        elif outcome.status == "backpressure":
            slot.limiter.backpressure()
            self.metrics.retries.labels(name, sink).inc()
            job.waiting = True
            job.not_before = time.monotonic() + outcome.retry_after
            log.warning("sink=%s topic=%s partition=%d offsets=%d-%d backpressure, pausing its partitions: %s",
                        sink, job.topic, job.partition, job.first_offset, job.last_offset, outcome.error)
        else:
            blocked = outcome.status == "blocked"
            log.error("sink=%s topic=%s partition=%d offsets=%d-%d %s: %s", sink, job.topic, job.partition,
                      job.first_offset, job.last_offset, "blocked" if blocked else "failed", outcome.error)
            # decoded again after the restart (dead letters of this attempt were not produced)
            job.decoded, job.dead = None, []
            if slot.state == "recovering":
                slot.state = "running"  # the probe failed: a new failure, a longer delay
            self._sink_failed(slot, outcome.error or RuntimeError("failed"), blocked=blocked)
            job.waiting = True
            job.not_before = slot.restart_at

    def _done(self, slot: SinkSlot, outcome: Outcome) -> None:
        """A durable batch: the sink is running (again), its counters, freshness and the flush's summary line."""
        job, name, sink = outcome.job, self.config.name, slot.sink.name
        slot.blocked = False
        if slot.state != "running":
            log.info("sink=%s recovered after restart %d", sink, slot.backoff.restarts if slot.backoff else 0)
            slot.state = "running"
        if slot.backoff is not None:
            slot.backoff.succeeded()
        if outcome.dead:
            slot.dead_letters += outcome.dead
        if outcome.tolerated is not None:
            slot.last_error = str(outcome.tolerated)[:2000]
        self.metrics.records_out.labels(name, sink).inc(outcome.applied)
        self.metrics.batch_latency.labels(name, sink).observe(outcome.elapsed_s)
        if job.oldest_source_ts_ms is not None and outcome.applied:
            self.metrics.source_freshness.labels(name, sink).observe(
                max(0.0, time.time() - job.oldest_source_ts_ms / 1000.0)
            )
        if outcome.newest_timestamp_ms > 0:
            age = max(0.0, time.time() - outcome.newest_timestamp_ms / 1000.0)
            self.metrics.freshness.labels(name, sink).set(age)
        log.info(
            "sink=%s topic=%s partition=%d offsets=%d-%d records=%d applied=%d dead=%d attempts=%d elapsed_s=%.3f",
            sink, job.topic, job.partition, job.first_offset, job.last_offset, len(job.raw),
            outcome.applied, outcome.dead, job.attempts, outcome.elapsed_s,
        )

    # -- backpressure -------------------------------------------------------------------------

    def _update_pauses(self) -> None:
        share = self.buffer_bytes // max(1, len(self.slots))
        bound = max(share // 4, share - self._step_bytes)
        want: set[TP] = set()
        total = 0
        for slot in self.slots:
            used = slot.bytes()
            total += used
            if used >= bound:
                slot.memory_paused = True
            elif used < bound // 2:
                slot.memory_paused = False
            backoff = slot.state == "restarting" or any(
                b.inflight is not None and b.inflight.waiting for b in slot.buffers.values()
            )
            for tp, buf in slot.buffers.items():
                if slot.memory_paused or backoff or (buf.inflight is not None and buf.full()):
                    want.add(tp)
        if self.operator.active:  # paused by the operator: every partition, the sinks get nothing
            want = set(self._assigned)
        want &= self._assigned
        self.metrics.buffered_bytes.labels(self.config.name).set(total)
        pause = want - self._paused
        resume = (self._paused - want) & self._assigned
        if pause:
            self.consumer.pause([TopicPartition(t, p) for t, p in sorted(pause)])
            log.info("paused partitions=%s buffered_bytes=%d", sorted(pause), total)
        if resume:
            self.consumer.resume([TopicPartition(t, p) for t, p in sorted(resume)])
            log.info("resumed partitions=%s buffered_bytes=%d", sorted(resume), total)
        self._paused = want
        self.metrics.paused.labels(self.config.name).set(len(want))

