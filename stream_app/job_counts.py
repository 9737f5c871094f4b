"""The records the job's queries read and write, counted: metrics, a micro-batch's log line, a real-time epoch's.

A micro-batch observes its counts (``Dataset.observe``) and a reporter thread logs them when Spark
delivers them; a real-time query's counts arrive in each epoch's progress (:meth:`RecordCounts._count_epoch`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from stream_app import metrics
from stream_app.config import StreamJobConfig
from stream_app.kafka_io import offsets_json
from stream_app.progress import ProgressListener, observed

log = logging.getLogger(__name__)

# the names of a real-time query's observed metrics (each epoch's progress carries them)
EPOCH_IN, EPOCH_WHERE, EPOCH_OUT = "threes_events_in", "threes_where", "threes_records_out"


class RecordCounts:
    """The counting part of :class:`stream_app.job.StreamJob`: observed columns, metrics and log lines."""

    config: StreamJobConfig
    spark: Any
    counts: dict[int, dict[str, int]]
    too_old: dict[str, int]
    _reporter: ThreadPoolExecutor
    _listener: ProgressListener | None
    _counted: tuple[Any, list[Any]] | None

    def _progress_listener(self) -> ProgressListener:
        """The job's query listener, registered with Spark on first use."""
        if self._listener is None:
            self._listener = ProgressListener(self.config.name)
            self.spark.streams.addListener(self._listener)
        return self._listener

    def _count_columns(self) -> tuple[Any, list[Any]]:
        """The observed counts: events as they enter; enriched events, dead letters and records as they leave."""
        from pyspark.sql import functions as f

        cfg = self.config
        if self._counted is None:  # built once: each functions call is a dozen py4j round trips
            self._counted = (
                f.count(f.lit(1)).alias("events"),
                [
                    f.count_if(f.col("topic") == cfg.enriched_topic).alias("enriched"),
                    f.count_if(f.col("topic") == cfg.dead_letter_topic).alias("dead_letters"),
                    f.count(f.lit(1)).alias("records"),
                ],
            )
        return self._counted

    def _report(
        self,
        batch_id: int,
        replay: bool,
        views: dict[str, Any],
        seen_in: Any,
        seen_out: Any,
        timings: tuple[float, ...],
        filtered: Any = None,
        too_old: Sequence[tuple[str, Any]] = (),
    ) -> None:
        """Log a micro-batch's summary line and count its records (reporter thread)."""
        cfg = self.config
        try:
            counts = observed(seen_out, ("enriched", "dead_letters", "records"))
            if seen_in is not None:
                counts.update(observed(seen_in, ("events",)))
            if filtered is not None:
                counts.update(observed(filtered, ("filtered",)))
            counts.setdefault("events", counts["records"])
            old_events = [(snapshot, observed(seen, ("too_old",))["too_old"]) for snapshot, seen in too_old]
        except Exception as exc:  # the session stopped before the metrics arrived
            log.debug("job=%s batch=%d: no counts (%s)", cfg.name, batch_id, exc)
            return
        self._record_counts(counts)
        for snapshot, n in old_events:
            if n:
                metrics.AS_OF_TOO_OLD.labels(cfg.name, snapshot).inc(n)
                self.too_old[snapshot] = self.too_old.get(snapshot, 0) + n
                log.warning("job=%s batch=%d snapshot=%s: %d events older than the retention got no version",
                            cfg.name, batch_id, snapshot, n)
        self.counts[batch_id] = counts
        log.info(
            "job=%s batch=%d events=%d filtered=%d enriched=%d dead_letters=%d updates=%d replay=%s snapshots=%s "
            "gate_s=%.2f refresh_s=%.2f plan_s=%.2f write_s=%.2f elapsed_s=%.2f",
            cfg.name,
            batch_id,
            counts["events"],
            counts.get("filtered", 0),
            counts["enriched"],
            counts["dead_letters"],
            counts["updates"],
            replay,
            " ".join(f"{n}={offsets_json(v.offsets)}" for n, v in sorted(views.items())),
            *timings,
        )

    def _record_counts(self, counts: dict[str, int]) -> None:
        """Add a batch's (or an epoch's) counts to the metrics; ``counts`` gains ``updates``."""
        cfg = self.config
        counts["updates"] = counts["records"] - counts["enriched"] - counts["dead_letters"]
        for kind in ("events", "enriched", "dead_letters", "updates"):
            metrics.RECORDS.labels(cfg.name, kind).inc(counts[kind])
        if "filtered" in counts:
            metrics.FILTERED.labels(cfg.name).inc(counts["filtered"])

    def _count_epoch(self, progress: Any) -> None:
        """Count a real-time epoch from its progress's observed metrics (Spark's listener thread)."""
        cfg = self.config
        observed_metrics = progress.observedMetrics or {}
        out = observed_metrics.get(EPOCH_OUT)
        if out is None:  # an epoch cancelled by a stop: its events are counted when a restart replays them
            return
        counts = {k: int(out[k] or 0) for k in ("enriched", "dead_letters", "records")}
        seen_in, where = observed_metrics.get(EPOCH_IN), observed_metrics.get(EPOCH_WHERE)
        counts["events"] = int(seen_in["events"] or 0) if seen_in is not None else counts["records"]
        if where is not None:
            counts["filtered"] = int(where["filtered"] or 0)
        self._record_counts(counts)
        self.counts[progress.batchId] = counts
        log.info(
            "job=%s epoch=%d events=%d filtered=%d enriched=%d dead_letters=%d updates=%d",
            cfg.name, progress.batchId, counts["events"], counts.get("filtered", 0), counts["enriched"],
            counts["dead_letters"], counts["updates"],
        )
