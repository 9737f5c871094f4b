"""The job's listener of its queries' progress (late events, a real-time query's epoch counts), and observed metrics.

Spark reports both through its asynchronous listener bus; :func:`observed` reads a micro-batch's
``Observation`` without the per-name Java exceptions of PySpark's own ``Observation.get``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from stream_app import metrics

log = logging.getLogger(__name__)


def observed(observation: Any, names: Sequence[str]) -> dict[str, Any]:
    """The metrics ``names`` of a PySpark ``Observation``, waiting for them as ``Observation.get`` does.

    ``Observation.get`` iterates the JVM's map through py4j, which ends every
    iteration with a Java exception that PySpark converts through a dozen JVM class
    lookups (each a scan of the driver's class path): one ``get`` per name instead.
    (So in pyspark 4.0; pyspark 4.2's ``get`` no longer raises one, and both read the same counts.)
    """
    jo = getattr(observation, "_jo", None)
    if jo is None:  # not the classic PySpark Observation
        return dict(observation.get)
    metrics = jo.getAsJava()
    return {name: metrics.get(name) for name in names}


class ProgressListener(StreamingQueryListener):
    """The job's listener of its queries' progress: late events, and a real-time query's epoch counts.

    **Late events.** Spark's event-time semantics drop events older than the watermark in the
    stateful operators (``dropDuplicatesWithinWatermark`` and the windowed aggregation) and only
    report how many in each micro-batch's progress (``stateOperators[].numRowsDroppedByWatermark``).
    So that none vanish silently, this listener adds them to ``threes_stream_late_events_total``
    (labels job, update topic) and logs a warning per micro-batch that dropped any. The events
    themselves stay in the enriched topic (and their updates in the projections); only the
    aggregate does not count them.

    **Epoch counts.** A real-time query has no ``foreachBatch`` where the job could read its
    counts: its observed metrics (``Dataset.observe`` under a name) arrive in each epoch's
    progress (``observedMetrics``), which :meth:`count` hands to a callback.
    """

    def __init__(self, job: str):
        super().__init__()
        self.job = job
        self.dropped: dict[str, int] = {}  # update topic -> events dropped so far
        self._topics: dict[str, str] = {}  # query id -> update topic
        self._counted: dict[str, Callable[[Any], None]] = {}  # query id -> what takes its progress
        self._ended = threading.Condition()
        self._expected: set[str] = set()  # run ids whose termination event will reach this listener
        self._terminated: set[str] = set()  # run ids whose termination event did

    def watch(self, query: Any, topic: str) -> None:
        """Count the late events of an aggregation query writing ``topic`` (started after the listener)."""
        self._topics[str(query.id)] = topic
        self.dropped.setdefault(topic, 0)
        self.expect(query)

    def count(self, query: Any, on_progress: Callable[[Any], None]) -> None:
        """Hand every progress of ``query`` (started after the listener) to ``on_progress``."""
        self._counted[str(query.id)] = on_progress
        self.expect(query)

    def expect(self, query: Any) -> None:
        """Wait for ``query``'s termination event in :meth:`wait_terminated` if it is running now.

        A query still active once the listener is registered posts its
        termination event after that, so the event reaches the listener; one
        that ended before may have had its event delivered already.
        """
        if query.isActive:
            with self._ended:
                self._expected.add(str(query.runId))

    def wait_terminated(self, timeout_s: float) -> bool:
        """Wait until the termination event of every expected query was delivered, up to ``timeout_s`` seconds.

        Spark's listener bus delivers a query's events in order, its
        termination last; so afterwards none of the expected queries' events
        is still on its way (call it once they are stopped).

        Returns:
            Whether all were delivered.
        """
        with self._ended:
            return self._ended.wait_for(lambda: self._expected <= self._terminated, timeout_s)

    def onQueryStarted(self, event: Any) -> None:  # Spark's listener interface
        """Nothing to do."""

    def onQueryProgress(self, event: Any) -> None:
        """Add a micro-batch's late events to the counter; hand a counted query's progress on."""
        progress = event.progress
        on_progress = self._counted.get(str(progress.id))
        if on_progress is not None:
            on_progress(progress)
        topic = self._topics.get(str(progress.id))
        if topic is None:
            return
        self._count_aggregation(topic, progress)
        dropped = sum(op.numRowsDroppedByWatermark for op in progress.stateOperators)
        if dropped:
            self.dropped[topic] += dropped
            metrics.LATE_EVENTS.labels(self.job, topic).inc(dropped)
            log.warning(
                "job=%s aggregation=%s batch=%d dropped %d late events (older than the watermark %s); total=%d",
                self.job,
                topic,
                progress.batchId,
                dropped,
                progress.eventTime.get("watermark"),
                self.dropped[topic],
            )

    def _count_aggregation(self, topic: str, progress: Any) -> None:
        """Count an aggregation query's update records (``threes_stream_records_total{kind="updates"}``).

        Spark's Kafka sink reports the rows it wrote (``sink.numOutputRows``); where a sink cannot
        (``-1``), the state operators' updated rows are what the update output mode emits.
        """
        written = int(getattr(progress.sink, "numOutputRows", -1))
        if written < 0:
            written = sum(int(op.numRowsUpdated) for op in progress.stateOperators)
        if written > 0:
            metrics.RECORDS.labels(self.job, "updates").inc(written)
            log.info("job=%s aggregation=%s batch=%d updates=%d", self.job, topic, progress.batchId, written)

    def onQueryIdle(self, event: Any) -> None:
        """Nothing to do."""

    def onQueryTerminated(self, event: Any) -> None:
        """Note that the query's last event was delivered."""
        with self._ended:
            self._terminated.add(str(event.runId))
            self._ended.notify_all()
