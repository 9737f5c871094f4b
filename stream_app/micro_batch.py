"""One micro-batch of the enrich query (``foreachBatch``): readiness gate, snapshot views, records, write.

Before each micro-batch every snapshot catches up with its topics and the offsets it joins are
recorded, so a replayed batch joins the same snapshot versions; the batch's events are decoded,
enriched and written in one Kafka write (:class:`stream_app.batch.BatchPlan`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from kernel.exceptions import FatalError
from stream_app import metrics
from stream_app.batch import BatchPlan
from stream_app.checkpoint import BatchOffsetsLog
from stream_app.enrich import BoundLookup
from stream_app.job_counts import RecordCounts
from stream_app.records import write_records
from stream_app.snapshot.runtime import Snapshot
from stream_app.writers import WriterSchemas

log = logging.getLogger(__name__)

V1_SOURCES = "avro,csv,json,orc,parquet,text"  # Spark's default list without kafka


class MicroBatches(RecordCounts):
    """The micro-batch part of :class:`stream_app.job.StreamJob` (the enrich query's ``foreachBatch``)."""

    snapshots: dict[str, Snapshot]
    batches: int
    last_batch: dict[str, Any]
    gate_wait_s: float
    waiting_for: str | None
    _ready: threading.Event
    _bootstrap_error: BaseException | None
    _writers: WriterSchemas | None
    _offsets_log: BatchOffsetsLog | None
    _options: dict[str, str]
    _batch: BatchPlan

    def _views(self, batch_id: int, events: Callable[[], Any] | None = None) -> tuple[dict[str, Any], bool]:
        """Catch every snapshot up and record the offsets; or, for a replayed batch, the recorded offsets.

        Args:
            batch_id: the micro-batch.
            events: returns the batch's decoded events, read only when a lookup has ``wait_for_reference``
                (:meth:`_wait_for_references`).
        """
        recorded = self._offsets_log.get(batch_id) if self._offsets_log else None
        if recorded is not None:
            return {n: s.view(recorded.get(n)) for n, s in self.snapshots.items()}, True
        for snapshot in self.snapshots.values():
            snapshot.catch_up()
            snapshot.maybe_checkpoint()
        if events is not None:
            self._wait_for_references(batch_id, events)
        views = {n: s.view() for n, s in self.snapshots.items()}
        if self._offsets_log is not None:
            self._offsets_log.record(batch_id, {n: v.offsets for n, v in views.items()})
        return views, False

    def _wait_for_references(self, batch_id: int, events: Callable[[], Any]) -> None:
        """Hold the micro-batch until its ``as_of`` snapshots' stream time reaches its newest event time, or the bound.

        For each lookup with ``wait_for_reference``: the newest event time of the batch (its
        ``as_of`` event field, one aggregation of the decoded events) is compared with the
        snapshot's stream time (the newest source timestamp its versions hold); while it is
        later, the snapshot is caught up again (every 200 ms) until the stream time reaches
        it or ``wait_for_reference`` has passed since the wait began. The batch then
        records the offsets it joins, so a replay joins the same versions (see
        :mod:`stream_app.snapshot.versioned`, late reference data).
        """
        from pyspark.sql import functions as f

        from stream_app.snapshot.as_of_join import event_time_ms
        from stream_app.snapshot.data import ERROR

        frame = None
        for lookup in self.config.lookups:
            bound_s = lookup.wait_for_reference_s
            versions = self.snapshots[lookup.snapshot].versions
            if bound_s is None or lookup.as_of is None or versions is None:
                continue
            if frame is None:
                frame = events().filter(f.col(ERROR).isNull())  # undecodable events have no time
            column = lookup.as_of
            newest = frame.agg(f.max(event_time_ms(f.col(column), frame.schema[column].dataType))).collect()[0][0]
            started = time.monotonic()
            snapshot = self.snapshots[lookup.snapshot]
            self.waiting_for = lookup.snapshot
            while newest is not None and (versions.stream_time_ms is None or versions.stream_time_ms < newest):
                if time.monotonic() - started >= bound_s:
                    log.info("job=%s batch=%d snapshot=%s wait_for_reference expired after %.1f s: events up to %d "
                             "ms join versions up to %s ms", self.config.name, batch_id, lookup.snapshot, bound_s,
                             newest, versions.stream_time_ms)
                    break
                time.sleep(0.2)
                snapshot.catch_up()
            else:
                if newest is not None and time.monotonic() - started > 0.001:
                    log.info("job=%s batch=%d snapshot=%s waited %.2f s for versions up to %d ms", self.config.name,
                             batch_id, lookup.snapshot, time.monotonic() - started, newest)
            self.waiting_for = None

    def process_batch(self, batch: Any, batch_id: int) -> None:
        """Enrich one micro-batch and write its enriched events, updates and dead letters (``foreachBatch``)."""
        cfg = self.config
        started = time.monotonic()
        gate, ready = self._pass_gate(batch)
        views, replay = self._batch_views(batch, batch_id)
        refreshed = time.monotonic()
        out, seen_in, seen_out, filtered, lookups = self._batch_records(batch, batch_id, views)
        planned = time.monotonic()
        write_records(out, self._options)
        written = time.monotonic()
        self.batches += 1
        self.last_batch = {
            "batch_id": batch_id,
            "replay": replay,
            "snapshots": {n: v.offsets for n, v in views.items()},
            "elapsed_s": written - started,
        }
        metrics.BATCH_SECONDS.labels(cfg.name).observe(written - started)
        # Spark delivers observed metrics through its asynchronous listener bus, seconds late on a busy
        # driver: the batch does not wait for them, a reporter thread logs them when they arrive.
        timings = (ready - gate, refreshed - ready, planned - refreshed, written - planned, written - started)
        too_old = [(lk.config.snapshot, lk.too_old) for lk in lookups if lk.too_old is not None]
        self._reporter.submit(self._report, batch_id, replay, views, seen_in, seen_out, timings, filtered, too_old)

    def _pass_gate(self, batch: Any) -> tuple[float, float]:
        """Wait at the readiness gate (the snapshots loaded); returns when the wait began and ended.

        Raises:
            FatalError: the snapshots did not load.
        """
        # Kafka's V1 batch writer runs its input plan outside the command's query execution, so the
        # observed counts below would never arrive; the V2 writer runs it inside. The batch's session
        # belongs to this query only.
        batch.sparkSession.conf.set("spark.sql.sources.useV1SourceList", V1_SOURCES)
        gate = time.monotonic()
        self._ready.wait()  # the readiness gate
        ready = time.monotonic()
        self.gate_wait_s += ready - gate
        if self._bootstrap_error is not None:
            raise FatalError(f"the snapshots did not load: {self._bootstrap_error}") from self._bootstrap_error
        return gate, ready

    def _batch_views(self, batch: Any, batch_id: int) -> tuple[dict[str, Any], bool]:
        """The writer schemas refreshed, then the snapshot views the batch joins (:meth:`_views`)."""
        # the writer schemas first: a snapshot record or event written under a schema registered since the
        # last batch then decodes in this one
        writers, batch_plan = self._writers, self._batch
        assert writers is not None and batch_plan is not None  # set by start()
        writers.refresh()
        waiting = any(lk.wait_for_reference is not None for lk in self.config.lookups)

        def decoded() -> Any:  # the batch's events, to read their newest event time (wait_for_reference)
            writers.refresh()
            return batch_plan.frame(batch, writers(), writers.headers())

        return self._views(batch_id, decoded if waiting else None)

    def _batch_records(
        self, batch: Any, batch_id: int, views: dict[str, Any]
    ) -> tuple[Any, Any, Any, Any, list[BoundLookup]]:
        """The batch's output records, observed.

        Returns:
            The records; the ``Observation`` of the events as they enter (``None`` when the records
            count them), of the records, of the events ``where`` dropped (``None`` without one); the
            bound lookups (an ``as_of`` one observes its events older than the retention).
        """
        from pyspark.sql import Observation

        cfg = self.config
        writers = self._writers
        assert writers is not None  # set by start()
        counted_in, counted_out = self._count_columns()
        frame = self._batch.frame(batch, writers(), writers.headers())
        seen_in = None
        # One record per event: the events are the records. Else counted as they enter: an observation
        # is a stage of its own (it breaks the whole-stage code generation), so only when needed. A where
        # or an inner lookup drops events without a record: counted as they enter too (records alone
        # undercounted the events by the dropped ones)
        if not self._batch.one_record_per_event or self._batch.drops_events:
            seen_in = Observation(f"in-{batch_id}-{uuid.uuid4().hex[:6]}")
            frame = frame.observe(seen_in, counted_in)
        lookups = [
            BoundLookup(lookup, views[lookup.snapshot],
                        Observation(f"asof-{batch_id}-{uuid.uuid4().hex[:6]}") if lookup.as_of is not None else None)
            for lookup in cfg.lookups
        ]
        filtered = Observation(f"where-{batch_id}-{uuid.uuid4().hex[:6]}") if cfg.where is not None else None
        records = self._batch.records(frame, lookups, views, filtered)
        seen_out = Observation(f"out-{batch_id}-{uuid.uuid4().hex[:6]}")
        return records.observe(seen_out, *counted_out), seen_in, seen_out, filtered, lookups
