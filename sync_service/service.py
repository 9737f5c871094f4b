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
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from connectors import registry
from connectors.api.sink import Sink
from kernel.config.models import KafkaConfig
from kernel.dlq import DEFAULT_MESSAGE_MAX_BYTES
from kernel.exceptions import FatalError, SetupError
from kernel.kafka import clients
from kernel.kafka.topics import ensure_dead_letter_topic
from kernel.supervision import RestartBackoff
from schemas.columnar import ColumnarDecoder
from schemas.serde import AvroDeserializer
from schemas.store import SchemaStore
from sync_service.batching import message_size
from sync_service.concurrency import AdaptiveConcurrency
from sync_service.metrics import SyncMetrics
from sync_service.pause import OperatorPause
from sync_service.rebalance import PartitionHandoff
from sync_service.state import TP, SinkSlot
from sync_service.writer import BatchWriter

log = logging.getLogger(__name__)

PREFETCH_SHARE = 8
"""librdkafka's prefetch queue gets ``buffer_max_bytes // PREFETCH_SHARE`` (inside the bound).

The service's peak RSS comes when paused partitions resume and the queue is taken in a burst,
so a larger share raises the peak; an eighth keeps it lower than a quarter
(``benchmarks/sync_sinks.py --only rss``, benchmarks/RESULTS.md#sync_sinksrss).
"""

class SyncService(PartitionHandoff):
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
        self.operator = OperatorPause.from_env()  # paused by the operator (threes run's management API)
        self._status_doc = {"service": config.name, "group": config.consumer_group(),
                            "state": "starting", "sinks": [], "partitions": [], "paused": []}
        self._last_status = 0.0
        self._highs = {}
        self._stop = threading.Event()
        self._outcomes = queue.SimpleQueue()
        self._fatal = None
        self._assigned = set()
        # not ready before the group gave this member partitions: a restarted member may wait out the old
        # member's session timeout (session.timeout.ms, 45 s by default) before its first assignment
        self.metrics.assigned.labels(config.name).set(0)
        self._paused = set()
        self._committed = {}
        self._refusals_logged = {}  # commit error code -> when last logged (monotonic s)
        self._last_lag = 0.0
        self._step_bytes = 0  # most bytes one consume() returned lately
        # records per consume(): at most 1,000, and a 20th of the bound at 1 KiB per record
        self._step_records = max(10, min(1000, config.buffer_max_bytes // 20 // 1024))
        self._built_sinks = sinks
        self._dead_letter_max_bytes = DEFAULT_MESSAGE_MAX_BYTES  # until open() has seen the dead letter topic
        self._schema_store = schema_store
        self._bridge: Any = None  # a RegistryBridge when kafka.schema_registry is set (open())
        self._connections = connections
        self.slots = []
        self._by_topic = {}
        self.consumer = None
        self.producer = None
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
        # SetupError at once (one line) when the broker refuses the login or its certificate; the topic's
        # limit and the producer's agree, and a larger dead letter is written without its value (kernel.dlq)
        self._dead_letter_max_bytes = ensure_dead_letter_topic(self.kafka, self.config.dead_letter_topic)

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
                                 cfg.retry, self.metrics, cfg.stop_on_error, columnar=columnar, stop=self._stop,
                                 dead_letter_max_bytes=self._dead_letter_max_bytes)
            pool = ThreadPoolExecutor(max_workers=max_limit, thread_name_prefix=f"sink-{sink.name}")
            slot = SinkSlot(sink, writer, limiter, pool, backoff=RestartBackoff(sink.config.errors))
            self.slots.append(slot)
            try:
                sink.open()
            except Exception as exc:  # its target is down: the sink starts failed, the others run
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
        was_paused = self.operator.active
        if not self.operator.check():
            self._dispatch(idle=idle)
        if was_paused != self.operator.active:
            log.info("sync service=%s %s by the operator", self.config.name,
                     "paused" if self.operator.active else "resumed")
        self._update_pauses()
        self._commit(asynchronous=True)
        if time.monotonic() - self._last_lag > 5.0:
            self._update_lag()
            self._warn_long_writes()
        if time.monotonic() - self._last_status >= 1.0:
            self._update_status()

