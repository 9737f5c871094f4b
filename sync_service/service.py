"""The sync service: one consumer group applying update topics to sinks, with backpressure.

One thread owns the consumer (poll, pause, resume, commit); worker threads
(one pool per sink) decode and write batches. The loop, every ~100 ms:

1. ``consume()`` up to 1,000 messages and buffer them per (sink, topic, partition);
2. take the outcomes of finished writes: a durable batch advances the commit
   position, a backpressured one waits ``retry_after`` seconds, a failed one
   fails its sink's task: the sink's partitions pause and it is closed and
   opened again after an exponential backoff (``errors.restart_backoff_s``),
   then writes the failed batch first (Kafka Connect restarts a failed task;
   the other sinks go on, and nothing is committed past the failed batch); a
   *blocked* one (the target refuses any record: a revoked privilege, a dropped
   column, see :mod:`sync_service.isolation`) goes the same way, without bound,
   its sink's status saying ``blocked: <what the target said>``;
3. cut the batches that are due (records, bytes or age; or any buffered records
   when the turn's ``consume()`` returned fewer than it asked for: the input is
   drained for now, ``batch.flush_when_idle``) and hand them to the
   sink's pool while the sink has fewer batches in flight than its adaptive
   concurrency limit (:mod:`sync_service.concurrency`);
4. pause the partitions that feed a sink which is over its share of the memory
   bound, in backoff, or has a full buffer behind a batch in flight; resume
   the others. Paused partitions deliver nothing, but the loop keeps calling
   ``consume()``, so the group never evicts this member (``max.poll.interval.ms``);
5. commit, per partition, the first offset that is not yet durable in every
   sink reading it (Kafka Connect's ``preCommit``): offsets are committed only
   after the writes they cover succeeded. Commits are asynchronous; one the
   broker refuses (e.g. ``REBALANCE_IN_PROGRESS`` while the group rebalances)
   is reported to ``on_commit`` and made again at the next turn, so a partition
   that receives nothing more still gets its offset committed.

On revoke (cooperative-sticky, KIP-429) the revoked partitions are flushed,
their in-flight writes awaited, and their offsets committed before they go. On
SIGTERM everything is flushed and committed, then the consumer leaves the group.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from connectors import registry
from connectors.api.sink import Sink
from kernel.config.models import KafkaConfig
from kernel.exceptions import FatalError, SetupError
from kernel.kafka import clients
from kernel.kafka.topics import cluster_metadata, create_topic, internal_topic_options
from kernel.supervision import RestartBackoff
from kernel.updates import source_ts_of
from schemas.columnar import ColumnarDecoder
from schemas.serde import AvroDeserializer
from schemas.store import SchemaStore
from sync_service.batching import PartitionBuffer, message_size
from sync_service.concurrency import AdaptiveConcurrency
from sync_service.metrics import SyncMetrics
from sync_service.writer import BatchWriter, Outcome

log = logging.getLogger(__name__)

PREFETCH_SHARE = 8
"""librdkafka's prefetch queue gets ``buffer_max_bytes // PREFETCH_SHARE`` (inside the bound).

The service's peak RSS comes when paused partitions resume and the queue is taken in a burst,
so a larger share raises the peak; an eighth keeps it lower than a quarter
(``benchmarks/sync_sinks.py --only rss``, benchmarks/RESULTS.md#sync_sinksrss).
"""
# commit errors of a member whose group is rebalancing (its generation or membership is being renewed)
_REBALANCE_CODES = frozenset(
    (KafkaError.ILLEGAL_GENERATION, KafkaError.REBALANCE_IN_PROGRESS, KafkaError.UNKNOWN_MEMBER_ID)
)
STUCK_WRITE_WARN_S = 60.0
"""A batch written for longer than this (s) is logged as a warning with its worker thread's stack, then again
each time as long again passes: a target that accepts connections but never answers shows in the log (the
clients' own timeouts and retries can hold one write for minutes)."""
_REFUSAL_LOG_INTERVAL_S = 30.0  # a commit refused turn after turn is logged once per interval (then DEBUG)

TP = tuple[str, int]


@dataclass
class _Reopened:
    """The result of opening a failed sink again (``error`` is ``None`` when it opened)."""

    slot: SinkSlot
    error: BaseException | None


@dataclass
class SinkSlot:
    """A sink with its runtime state: pool, limiter, buffers, in-flight count."""

    sink: Sink
    writer: BatchWriter
    limiter: AdaptiveConcurrency
    pool: ThreadPoolExecutor
    buffers: dict[TP, PartitionBuffer] = field(default_factory=dict)
    inflight: int = 0
    memory_paused: bool = False
    backoff: RestartBackoff | None = None
    state: str = "running"  # running, restarting (waiting for restart_at), recovering (one batch probes)
    restart_at: float = 0.0  # monotonic time of the next restart
    dead_letters: int = 0
    last_error: str | None = None
    blocked: bool = False  # the last failure was the target refusing any record (SinkBlockedError)

    def bytes(self) -> int:
        """Buffered plus in-flight bytes of this sink."""
        return sum(b.total_bytes for b in self.buffers.values())


class SyncService:
    """Consume update topics and apply them to sinks; commit only after durable writes.

    Delivery guarantee: at least once into every target, and effectively once
    in the targets' state, because every sink applies an update only when its
    version is newer (``kernel/updates.py``).

    Args:
        kafka: the pipeline's Kafka config.
        config: one ``sync`` entry (a ``SyncServiceConfig``).
        connections: the pipeline's connections by name.
        sinks: already built sinks (tests); built from ``config.sinks`` when ``None``.
        schema_store: resolves Avro writer schemas; a :class:`SchemaStore` on
            ``kafka.schema_topic`` when ``None``.
        metrics: the service's metrics (kept across restarts by the supervisor); new ones when ``None``.
        serve: serve ``/metrics`` and ``/status`` on ``config.metrics_port`` from :meth:`run` (the
            supervisor serves them itself, once for every restart).

    Raises:
        SetupError: Kafka or a target cannot be reached (from :meth:`run`).
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        config: Any,
        connections: dict[str, Any],
        *,
        sinks: list[Sink] | None = None,
        schema_store: Any = None,
        metrics: SyncMetrics | None = None,
        serve: bool = True,
    ):
        self.kafka = kafka
        self.config = config
        self.metrics = metrics or SyncMetrics(config.name)
        self._serve = serve
        self._status_doc: dict[str, Any] = {"service": config.name, "group": config.consumer_group(),
                                            "state": "starting", "sinks": [], "partitions": [], "paused": []}
        self._last_status = 0.0
        self._highs: dict[TP, int] = {}
        self._stop = threading.Event()
        self._outcomes: queue.SimpleQueue[Outcome | _Reopened] = queue.SimpleQueue()
        self._fatal: BaseException | None = None
        self._assigned: set[TP] = set()
        # not ready before the group gave this member partitions: a restarted member may wait out the old
        # member's session timeout (session.timeout.ms, 45 s by default) before its first assignment
        self.metrics.assigned.labels(config.name).set(0)
        self._paused: set[TP] = set()
        self._committed: dict[TP, int] = {}
        self._refusals_logged: dict[int, float] = {}  # commit error code -> when last logged (monotonic s)
        self._last_lag = 0.0
        self._step_bytes = 0  # most bytes one consume() returned lately
        # records per consume(): at most 1,000, and a 20th of the bound at 1 KiB per record
        self._step_records = max(10, min(1000, config.buffer_max_bytes // 20 // 1024))
        self._built_sinks = sinks
        self._schema_store = schema_store
        self._bridge: Any = None  # a RegistryBridge when kafka.schema_registry is set (open())
        self._connections = connections
        self.slots: list[SinkSlot] = []
        self._by_topic: dict[str, list[SinkSlot]] = {}
        self.consumer: Any = None
        self.producer: Any = None
        # librdkafka's prefetch limit per partition (queued.max.messages.kbytes), set by open()
        self.queued_kbytes = 0
        # the bound of the records the service holds: buffer_max_bytes less the prefetch share (open())
        self.buffer_bytes = config.buffer_max_bytes

    # -- setup ----------------------------------------------------------------------------------

    def _build_sinks(self) -> list[Sink]:
        if self._built_sinks is not None:
            return self._built_sinks
        sinks = []
        for sink_config in self.config.sinks:
            cls = registry.load_implementation(sink_config)
            sinks.append(cls(sink_config, self._connections[sink_config.connection]))
        return sinks

    def _ensure_dead_letter_topic(self) -> None:
        topic = self.config.dead_letter_topic
        # SetupError at once (one line) when the broker refuses the login or its certificate
        meta = cluster_metadata(self.kafka.librdkafka_config(), self.kafka.request_timeout_s)
        if topic in meta.topics:
            return
        try:
            create_topic(self.kafka.librdkafka_config(), topic, partitions=1, timeout_s=self.kafka.request_timeout_s,
                         metadata=meta, **internal_topic_options(self.kafka))
        except SetupError as exc:
            raise SetupError(f"cannot create dead letter topic {topic!r}: {exc}") from exc

    def open(self) -> None:
        """Connect: sinks, schema store, dead letter producer, consumer (subscribed).

        Raises:
            SetupError: a system cannot be reached.
            FatalError: a target cannot be prepared.
        """
        cfg = self.config
        kconf = self.kafka.librdkafka_config()
        store = self._schema_store or SchemaStore(kconf, self.kafka.schema_topic)
        deserializer = AvroDeserializer(store)
        columnar = ColumnarDecoder(store)
        if self.kafka.schema_registry is not None:
            from schemas.registry import RegistryBridge, registry_client

            # confluent_avro update topics: each message's Confluent prefix becomes the single-object header of
            # the same writer schema (schemas/registry.py), so the decoders below read both formats
            self._bridge = RegistryBridge(registry_client(self.kafka.schema_registry.client_config()), store)
        self._ensure_dead_letter_topic()
        self.producer = clients.kafka_producer(self.kafka, linger_ms=5)
        self._open_sinks(deserializer, columnar)
        consumer_conf = self._consumer_config()
        from confluent_kafka import Consumer

        # librdkafka's own log lines (rebalances, "leaving group") go through Python logging
        consumer_conf["logger"] = logging.getLogger("sync_service.rdkafka")
        consumer_conf["on_commit"] = self._on_commit  # refused asynchronous commits are made again
        try:
            self.consumer = Consumer({**clients.CONSUMER_DEFAULTS, **kconf, "group.id": cfg.consumer_group(),
                                      "enable.auto.commit": False, "auto.offset.reset": "earliest", **consumer_conf})
        except KafkaException as exc:
            raise SetupError(f"sync service {cfg.name!r}: cannot create the Kafka consumer: {exc}") from exc
        self.consumer.subscribe(sorted(self._by_topic), on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        log.info("sync service=%s group=%s topics=%s sinks=%s", cfg.name, cfg.consumer_group(),
                 sorted(self._by_topic), [s.sink.name for s in self.slots])

    def _open_sinks(self, deserializer: AvroDeserializer, columnar: ColumnarDecoder) -> None:
        """A slot per sink (writer, adaptive concurrency, thread pool), each sink opened; routes topics to slots.

        A sink whose target is down starts failed (restarted after a backoff); the others run.
        """
        cfg = self.config
        assert self.producer is not None
        for sink in self._build_sinks():
            max_limit = int(getattr(sink.config, "max_concurrency", 1))
            gauge = self.metrics.concurrency.labels(cfg.name, sink.name)
            limiter = AdaptiveConcurrency(sink.name, max_limit, on_change=gauge.set)
            sink.limiter = limiter
            writer = BatchWriter(cfg.name, sink, deserializer, self.producer, cfg.dead_letter_topic,
                                 cfg.retry, self.metrics, cfg.stop_on_error, columnar=columnar, stop=self._stop)
            pool = ThreadPoolExecutor(max_workers=max_limit, thread_name_prefix=f"sink-{sink.name}")
            slot = SinkSlot(sink, writer, limiter, pool, backoff=RestartBackoff(sink.config.errors))
            self.slots.append(slot)
            try:
                sink.open()
            except Exception as exc:  # noqa: BLE001 - its target is down: the sink starts failed, the others run
                writer.needs_open = True
                self._sink_failed(slot, exc)
            for topic in sink.config.topics:
                if topic in self._by_topic:
                    writer.decode_dlq_topics.discard(topic)
                self._by_topic.setdefault(topic, []).append(slot)

    def _consumer_config(self) -> dict[str, Any]:
        """The consumer's own librdkafka settings; sizes the prefetch queue and ``buffer_bytes`` inside the bound."""
        cfg = self.config
        # the fetch queue is memory too, inside the bound: librdkafka gets 1/PREFETCH_SHARE of it. Its
        # queued.max.messages.kbytes holds per partition (librdkafka fills each partition's queue up to
        # it), so the share is spread over every partition this member may be assigned,
        # at least 1 MB each; the service's own buffers get the rest (past partitions x 1 MB > the share, the
        # floor goes over the bound: the service's buffers keep 1 - 1/PREFETCH_SHARE of it)
        partitions = self._partitions(sorted(self._by_topic))
        queued_kb = self.queued_kbytes = max(
            1024, min(65536, cfg.buffer_max_bytes // PREFETCH_SHARE // partitions // 1024)
        )
        prefetch = min(queued_kb * 1024 * partitions, cfg.buffer_max_bytes // PREFETCH_SHARE)
        self.buffer_bytes = cfg.buffer_max_bytes - prefetch
        overrides: dict[str, Any] = {
            "partition_assignment_strategy": "cooperative-sticky",
            "enable_auto_offset_store": False,
            "max_poll_interval_ms": cfg.max_poll_interval_ms,
            "session_timeout_ms": cfg.session_timeout_ms,
            "queued_max_messages_kbytes": queued_kb,
        }
        consumer_conf = {k.replace("_", "."): v for k, v in overrides.items()}
        if cfg.group_instance_id:
            consumer_conf["group.instance.id"] = cfg.group_instance_id
        return consumer_conf

    def _partitions(self, topics: list[str]) -> int:
        """Partitions of ``topics`` together (a topic not created yet counts one), at least 1.

        Read from the dead letter producer's metadata; Kafka away counts one per topic
        (the consumer's own start then reports the broker).
        """
        try:
            meta = self.producer.list_topics(timeout=self.kafka.request_timeout_s).topics
        except KafkaException:
            return max(1, len(topics))
        return max(1, sum(len(meta[t].partitions) if t in meta and not meta[t].error else 1 for t in topics))

    # -- the loop -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the loop to flush, commit and exit (thread-safe; the SIGTERM handler calls it)."""
        self._stop.set()

    def run(self, stop: threading.Event | None = None) -> None:
        """Open (if needed) and run until :meth:`stop` or ``stop`` is set, then shut down cleanly.

        A failed sink does not end the loop: it is restarted with backoff (see the
        module docstring); :class:`~sync_service.supervisor.ServiceSupervisor`
        restarts the whole service when something else fails.

        Raises:
            SetupError: Kafka cannot be reached, or a fatal consumer error.
        """
        if stop is not None:
            self._stop = stop
        if self.consumer is None:
            self.open()
        for slot in self.slots:  # the writers' retries end on the event this loop stops on
            slot.writer.stop = self._stop
        if self.config.metrics_port and self._serve:
            token = self.config.metrics_token
            self.metrics.serve(self.config.metrics_port, self.config.metrics_host,
                               status=lambda: {"sync": [self.status()]},
                               token=token.get_secret_value() if token is not None else None)
        try:
            while not self._stop.is_set() and self._fatal is None:
                self.step()
        finally:
            self._shutdown()
        if self._fatal is not None:
            raise FatalError(f"sync service {self.config.name!r} stopped: {self._fatal}") from self._fatal

    def step(self, timeout_s: float = 0.1) -> None:
        """One turn of the loop (see the module docstring)."""
        msgs = self.consumer.consume(num_messages=self._step_records, timeout=timeout_s)
        if self._bridge is not None and msgs:
            self._bridge.convert_messages(msgs)
        step_bytes = 0
        # consecutive records of one partition are routed together: a turn's records come in runs
        run: list[Any] = []
        run_tp: TP = ("", -1)
        run_bytes = 0
        for msg in msgs:
            err = msg.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    log.warning("consumer error: %s", err)
                    if err.fatal():
                        raise SetupError(f"fatal Kafka consumer error: {err}")
                continue
            tp = (msg.topic(), msg.partition())
            if tp != run_tp:
                if run:
                    step_bytes += self._route(run_tp, run, run_bytes)
                run, run_tp, run_bytes = [], tp, 0
            run.append(msg)
            run_bytes += message_size(msg)
        if run:
            step_bytes += self._route(run_tp, run, run_bytes)
        # fewer records than asked for within the timeout: the input is drained for now, so partial
        # batches need not wait for their age (BatchPolicy.flush_when_idle)
        idle = len(msgs) < self._step_records
        # the memory bound must hold after the next consume() too: keep one turn's bytes of headroom
        self._step_bytes = max(int(self._step_bytes * 0.99), step_bytes)
        self._take_outcomes()
        self._dispatch(idle=idle)
        self._update_pauses()
        self._commit(asynchronous=True)
        if time.monotonic() - self._last_lag > 5.0:
            self._update_lag()
            self._warn_long_writes()
        if time.monotonic() - self._last_status >= 1.0:
            self._update_status()

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
        except Exception as exc:  # noqa: BLE001 - reported to the loop, which backs off again
            self._outcomes.put(_Reopened(slot, exc))
            return
        self._outcomes.put(_Reopened(slot, None))

    def _slot(self, name: str) -> SinkSlot:
        return next(s for s in self.slots if s.sink.name == name)

    def _apply_outcome(self, outcome: Outcome | _Reopened) -> None:
        if isinstance(outcome, _Reopened):
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

    def _warn_long_writes(self, now: float | None = None) -> list[Any]:
        """Log each batch written for over :data:`STUCK_WRITE_WARN_S`, with where its worker thread is.

        Returns:
            The jobs warned about this time.
        """
        now = time.monotonic() if now is None else now
        frames = None
        warned = []
        for slot in self.slots:
            for buf in slot.buffers.values():
                job = buf.inflight
                if job is None:
                    continue
                started = job.started_at  # read once: the worker thread clears it when the write returns
                if started is None or now - started < STUCK_WRITE_WARN_S or now - job.warned_at < STUCK_WRITE_WARN_S:
                    continue
                job.warned_at = now
                frames = sys._current_frames() if frames is None else frames  # noqa: SLF001 - the documented way
                frame = frames.get(job.thread_id) if job.thread_id is not None else None
                stack = "".join(traceback.format_stack(frame)) if frame is not None else "(thread not found)\n"
                log.warning("sink=%s topic=%s partition=%d offsets=%d-%d write in flight for %.0f s (attempt %d); "
                            "its thread is at:\n%s", slot.sink.name, job.topic, job.partition, job.first_offset,
                            job.last_offset, now - started, job.attempts, stack.rstrip())
                warned.append(job)
        return warned

    def _write_in_flight_s(self, slot: SinkSlot, now: float) -> float | None:
        starts = [b.inflight.started_at for b in slot.buffers.values()
                  if b.inflight is not None and b.inflight.started_at is not None]
        return round(now - min(starts), 3) if starts else None

    # -- status -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """The service's part of the status document (thread-safe: a copy made by the loop every second).

        Returns:
            ``{"service", "group", "state", "restarts", "lag", "dead_letters", "last_error", "paused":
            [[topic, partition]...], "partitions": [{"topic", "partition", "committed", "end_offset", "lag",
            "paused"}...], "sinks": [{"sink", "state", "restarts", "dead_letters", "last_error",
            "oldest_pending_age_s", "write_in_flight_s"}...]}``; offsets are Kafka offsets, ages seconds
            (``write_in_flight_s``: how long its longest running write has run, ``None`` when none runs).
            A sink's ``state`` is ``running``, ``restarting``, ``recovering`` or ``blocked`` (its target
            refuses any record; ``last_error`` then reads ``blocked: <what the target said>``).
        """
        return self._status_doc

    def _pending_age_s(self, slot: SinkSlot, now: float) -> float:
        oldest: float | None = None
        for buf in slot.buffers.values():
            msg = buf.first_pending()
            if msg is None:
                continue
            ts_ms = source_ts_of(msg.headers())
            if ts_ms is None:
                ts_ms = msg.timestamp()[1]
            if ts_ms > 0 and (oldest is None or ts_ms < oldest):
                oldest = ts_ms
        return 0.0 if oldest is None else max(0.0, now - oldest / 1000.0)

    def _update_status(self, state: str | None = None) -> None:
        """Refresh the pending-age and state gauges and the status document (the loop's thread, every second)."""
        self._last_status = time.monotonic()
        now = time.time()
        name = self.config.name
        sinks = []
        for slot in self.slots:
            age = self._pending_age_s(slot, now)
            self.metrics.oldest_pending_age.labels(name, slot.sink.name).set(age)
            for st in ("running", "restarting", "recovering"):
                self.metrics.sink_state.labels(name, slot.sink.name, st).set(1 if slot.state == st else 0)
            sinks.append({
                "sink": slot.sink.name, "type": slot.sink.config.type,
                "state": "blocked" if slot.blocked and slot.state != "running" else slot.state,
                "restarts": slot.backoff.restarts if slot.backoff else 0, "dead_letters": slot.dead_letters,
                "last_error": slot.last_error, "oldest_pending_age_s": round(age, 3),
                "write_in_flight_s": self._write_in_flight_s(slot, time.monotonic()),
                "next_restart_in_s": round(max(0.0, slot.restart_at - time.monotonic()), 1)
                if slot.state == "restarting" else None,
            })
        partitions = []
        for tp in sorted(self._assigned):
            committed = self._committed.get(tp)
            high = self._highs.get(tp)
            partitions.append({
                "topic": tp[0], "partition": tp[1], "committed": committed, "end_offset": high,
                "lag": None if high is None else max(0, high - (committed or 0)), "paused": tp in self._paused,
            })
        errors = [s["last_error"] for s in sinks if s["state"] != "running" and s["last_error"]]
        if state is None and not self._assigned:
            state = "waiting_for_partitions"  # not ready: the group has not given this member partitions (yet)
        if state is None:
            state = "running" if all(s["state"] == "running" for s in sinks) else "degraded"
        self._status_doc = {
            "service": name, "group": self.config.consumer_group(), "state": state,
            "restarts": int(self.metrics.value("threes_sync_service_restarts_total")),
            "lag": sum(p["lag"] or 0 for p in partitions), "dead_letters": sum(s["dead_letters"] for s in sinks),
            "last_error": errors[0] if errors else None,
            "paused": [list(tp) for tp in sorted(self._paused)], "partitions": partitions, "sinks": sinks,
        }

    # -- rebalance ------------------------------------------------------------------------------

    def _on_assign(self, _consumer: Any, partitions: list[TopicPartition]) -> None:
        tps = {(p.topic, p.partition) for p in partitions}
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
