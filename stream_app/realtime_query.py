"""The real-time query (``stream.mode: realtime``): started as one query, stopped at once.

Kafka -> decode (a JVM UDF) -> ``where`` / ``derive`` -> JVM snapshot lookups -> encode -> Kafka,
every stage a Catalyst expression or a JVM UDF (:mod:`stream_app.realtime`); its counts arrive
per epoch (:class:`stream_app.job_counts.RecordCounts`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from kernel.config.models import KafkaConfig
from kernel.exceptions import ConfigError, ConfigProblem
from stream_app import metrics
from stream_app.batch import BatchPlan
from stream_app.enrich import BoundLookup
from stream_app.job_counts import EPOCH_IN, EPOCH_OUT, EPOCH_WHERE
from stream_app.job_queries import JobQueries
from stream_app.session import quiet_loggers
from stream_app.spark_checkpoint import child, default_fs, is_local_path
from stream_app.spark_kafka_options import sink_options

log = logging.getLogger(__name__)

REALTIME_STOP_LOGGERS = (
    "org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec",
    "org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.scheduler.DAGScheduler",
    "org.apache.spark.util.Utils",
)
"""The loggers of a real-time query's stop: the cancelled epoch's abort, its killed tasks."""


class RealtimeQuery(JobQueries):
    """The real-time part of :class:`stream_app.job.StreamJob`."""

    kafka: KafkaConfig
    queries: list[Any]
    _ready: threading.Event
    query_server: Any = None  # threes.store.QueryServer with stream.query_port

    def _start_realtime(self, available_now: bool) -> None:
        """Real-time mode: one query, Kafka -> decode -> where/derive -> JVM lookups -> encode -> Kafka.

        Every stage is a Catalyst expression or the JVM lookup UDF (:mod:`stream_app.realtime`), which
        real-time mode allows; the snapshots live in the executors' JVM stores, which pass their own
        readiness gate on their first lookup. Delivery into Kafka is at least once: a restart replays
        from the last checkpoint (at most ``checkpoint_interval`` of events), as a micro-batch replay does.

        Raises:
            ConfigError: ``--available-now`` (real-time mode runs until stopped).
            SetupError: the lookup component's jar was not built (``make jvm``).
        """
        from stream_app.realtime import checkpoint_interval_s, consumer_properties, lookup_jar

        cfg = self.config
        assert self.plan is not None and self._writers is not None
        if available_now:
            raise ConfigError([ConfigProblem("stream.mode", "real-time mode runs until stopped; --available-now "
                                                            "is for mode microbatch")])
        lookup_jar()  # a missing jar: SetupError naming `make jvm`, not a ClassNotFoundException from py4j
        consumer = consumer_properties(self.kafka.librdkafka_config())
        views, store_ids = self._register_stores(consumer)
        records = self._realtime_records(consumer, views)
        listener = self._progress_listener()
        writer = records.writeStream.format("kafka").outputMode("update")
        for key, value in sink_options(self._options).items():
            writer = writer.option(key, value)
        writer = writer.option("checkpointLocation", child(cfg.checkpoint_location, "realtime")).queryName(
            f"{cfg.name}-realtime-{uuid.uuid4().hex[:6]}"
        )
        interval = checkpoint_interval_s(cfg)
        query = writer.trigger(realTime=f"{interval} seconds").start()
        listener.count(query, self._count_epoch)
        self.queries.append(query)
        self._ready.set()
        for name in views:  # `threes status` and /metrics: the keys of this JVM's store (local[*]: every executor's)
            metrics.SNAPSHOT_KEYS.labels(cfg.name, name).set_function(partial(_store_keys, self.spark, store_ids[name]))
        log.info("job=%s mode=realtime checkpoint_interval_s=%d snapshots=%s", cfg.name, interval, sorted(views))
        token = None if cfg.metrics_token is None else cfg.metrics_token.get_secret_value()
        if cfg.metrics_port:
            metrics.serve(cfg.metrics_port, cfg.metrics_host, token)
        if cfg.query_port is not None:
            from stream_app.realtime import serve_queries

            self.query_server = serve_queries(self.spark, list(store_ids.values()), cfg.metrics_host, cfg.query_port,
                                              token)
            log.info("job=%s interactive queries on %s:%d (JVM state stores)", cfg.name, cfg.metrics_host,
                     self.query_server.port())

    def _register_stores(self, consumer: str) -> tuple[dict[str, Any], dict[str, str]]:
        """Register each snapshot's JVM store and lookup UDF; its view (mode ``jvm``) and store id, by snapshot."""
        from stream_app.realtime import register_lookup
        from stream_app.snapshot.view import SnapshotView

        cfg, plan = self.config, self.plan
        assert plan is not None
        # the stores' tables and offsets beside the checkpoint when it is local (a restart reads only the
        # tail); on a remote file system every start reads the compacted topics
        location = cfg.checkpoint_location
        state_dir = None
        if is_local_path(location, default_fs(self.spark)):
            state_dir = str(Path(location.removeprefix("file://")).resolve() / "realtime-stores")
        views: dict[str, SnapshotView] = {}
        store_ids: dict[str, str] = {}
        for name, snap in plan.snapshots.items():
            key_json = None if snap.config.key_format == "string" else snap.key.json
            udf = re.sub(r"\W", "_", f"threes_lookup_{cfg.name}_{name}")
            store_ids[name] = register_lookup(
                self.spark, udf, snap.config, key_json, snap.value.json, consumer, self.kafka.schema_topic,
                state_dir=state_dir, in_driver=cfg.query_port is not None,
            )
            views[name] = SnapshotView(name, snap.key.spark_type, snap.value.spark_type, {}, "jvm", 0,
                                       jvm=(udf, key_json, snap.value.json))
        return views, store_ids

    def _realtime_records(self, consumer: str, views: dict[str, Any]) -> Any:
        """The query's output records from the events topic, observed per epoch."""
        from stream_app.realtime import register_event_decoder

        cfg, plan, writers = self.config, self.plan, self._writers
        assert plan is not None and writers is not None
        # the events are decoded in the JVM, which reads a writer schema registered after the start on its
        # first record (a real-time query has no micro-batch boundary at which to learn it)
        decoder = register_event_decoder(
            self.spark, re.sub(r"\W", "_", f"threes_decode_{cfg.name}"), plan.events.json, consumer,
            self.kafka.schema_topic,
        )
        self._batch = BatchPlan(plan, jvm_decoder=decoder)
        events = cfg.events
        stream = (
            self._read_stream(events.topic, events.starting_offsets)
            .option("includeHeaders", "true")
            .option("failOnDataLoss", str(events.fail_on_data_loss).lower())
            .load()
        )
        # counted per epoch (observed metrics, in each epoch's progress: _count_epoch); events as they enter
        # only when they are not one record each (as process_batch does)
        counted_in, counted_out = self._count_columns()
        frame = self._batch.frame(stream, writers())
        if not self._batch.one_record_per_event or self._batch.drops_events:
            frame = frame.observe(EPOCH_IN, counted_in)
        return self._batch.records(
            frame, [BoundLookup(lk, views[lk.snapshot]) for lk in cfg.lookups], views,
            EPOCH_WHERE if cfg.where is not None else None,
        ).observe(EPOCH_OUT, *counted_out)

    def _stop_realtime_query(self, grace_s: float) -> None:
        """Stop the real-time query at once, its cancelled epoch's errors quiet, and wait until no task runs."""
        # Spark logs the cancelled epoch's abort as errors (write aborted, tasks killed): expected here
        log.info("job=%s stopping the real-time query: its open epoch is cancelled, and a restart replays "
                 "its events from the last checkpoint", self.config.name)
        with quiet_loggers(self.spark, REALTIME_STOP_LOGGERS):
            for query in self.queries:
                query.stop()
                query.awaitTermination(grace_s)
            # the killed tasks log their abort as they end, after the query and after their stage left the
            # active ones (a cancelled stage ends at once): wait until no task runs
            tracker, deadline = self.spark.sparkContext.statusTracker(), time.monotonic() + grace_s
            while (tracker.getActiveStageIds() or _running_tasks(self.spark)) and time.monotonic() < deadline:
                time.sleep(0.1)

    def _close_stores(self) -> None:
        """The query server stops; each store checkpoints its RocksDB folder (local[*]: the executors are this JVM)."""
        from stream_app.realtime import close_stores

        server = getattr(self, "query_server", None)
        if server is not None:
            server.close()
            self.query_server = None
        try:
            close_stores(self.spark)
        except Exception:  # a stop goes on; the next start reads more of the topics
            log.warning("job=%s could not close the snapshot stores", self.config.name, exc_info=True)


def _running_tasks(spark: Any) -> int:
    """How many tasks the executors run now, by the task scheduler (0 when Spark cannot tell).

    Not the status tracker's executor infos: they count no task of ``local[*]``'s driver executor.
    """
    try:
        counts = spark.sparkContext._jsc.sc().taskScheduler().runningTasksByExecutors().valuesIterator()
        running = 0
        while counts.hasNext():
            running += int(counts.next())
        return running
    except Exception:  # the session is stopping: nothing to wait for
        return 0


def _store_keys(spark: Any, store_id: str) -> float:
    """Keys in this JVM's real-time store ``store_id``; NaN once the session or the store is gone.

    By id, not by snapshot name: another job in the same JVM may have a snapshot of the same name.
    """
    from stream_app.realtime import store_status

    try:
        return float(store_status(spark)[store_id]["keys"])
    except Exception:  # a metric read must never fail the scrape
        return float("nan")
