"""The source worker: runs source tasks, produces their records, stores their positions.

One :class:`TaskRunner` per task, each in its own thread with its own
idempotent producer (``acks=all``), so acknowledgements of one task never wait
on another. The runner owns everything a connector author must not touch
(Kafka Connect's ``WorkerSourceTask``):

* the state topic, created compacted (an existing non-compacted one is refused);
* the Avro serializers, with writer schemas registered in the schema store;
* the produce loop: a full local queue (``BufferError``) is waited out by
  serving delivery reports, never dropped;
* column-wise batches (``SourceBatch.columns``): keys and values encoded for
  the whole batch at once (:class:`~connectors.runtime.columnar.ColumnarEncoder`)
  and queued with one ``produce_batch`` call once the local queue has room for
  the batch; every record keeps its delivery report, so positions still move
  only after the broker acknowledged them;
* positions: a batch's position is written to the offsets topic only once it
  and every batch before it are acknowledged (:class:`PositionTracker`), at
  most every ``offset_flush_interval_s`` and on stop;
* retries of transient failures (tenacity, jittered exponential backoff) and
  key-set reconciliation on the connector's schedule;
* exactly once (``exactly_once: true``, and always in ``--group`` mode): a
  transactional producer whose ``transactional.id`` is the task's
  (:func:`transactional_id`) writes the records *and* the position record
  covering them in one Kafka transaction, committed every
  ``offset_flush_interval_s`` (KIP-618's ``transaction.boundary=interval``).
  ``init_transactions`` runs before the position is read, which fences any
  older instance of the task (a zombie worker can no longer commit) and
  resolves its open transaction; positions are then read ``read_committed``.
  A transaction the broker aborts rewinds the task to the last committed
  position.

A record that cannot be encoded stops its task with one error line naming the
connector, the record's key, the field and how to move on: it is neither skipped
nor is the position moved past it, and the task is not restarted (the same row
would fail again). Other tasks go on. With ``errors.tolerance: all`` it goes to
the source's dead letter topic instead (``dead_letter_topic``, default
``<topic>.dlq``; :mod:`connectors.runtime.dead_letters`) and the position moves
past it once the dead letter is acknowledged (with transactions, in the same
transaction).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tenacity import Retrying, retry_if_exception_type, wait_random_exponential

from connectors.api.source import SourceBatch, SourceSchemas, TopicState
from connectors.runtime import metrics
from connectors.runtime.columnar import ColumnarEncoder, ColumnarUnsupported
from connectors.runtime.dead_letters import SourceDeadLetters
from connectors.runtime.offsets import OffsetStore, PositionTracker, offsets_key, require_position_shape
from connectors.runtime.position_commits import transactional_id
from connectors.runtime.produce import RecordProducer
from connectors.runtime.runner_state import RunnerStats
from connectors.runtime.serializers import TopicSerializers
from connectors.runtime.state import LiveKeys, live_keys
from kernel.config.models import KafkaConfig, SourceConnectorConfig
from kernel.config.policies import RetryPolicy
from kernel.exceptions import FatalError, RetriableError, ThreesError
from kernel.kafka import clients
from kernel.kafka.topics import ensure_compacted_topic, ensure_dead_letter_topic
from kernel.supervision import StopRequested, describe_retry, retry_stop, stoppable_sleep
from schemas.evolution import TopicSchemaPlan
from schemas.serde import MARKER

log = logging.getLogger(__name__)


class TaskRunner(RecordProducer, TopicSerializers):
    """Run one source task until stopped (or caught up, with ``once``).

    Args:
        config: the connector config.
        connection: the connection it names.
        kafka: the pipeline's Kafka config.
        offsets: the offsets store.
        schema_store: where writer schemas are registered (``SchemaStore``).
        task_id: task index.
        task_count: tasks of this connector.
        retry: backoff of transient failures (attempts per failure streak).
        offset_flush_interval_s: how often positions are written, seconds (Kafka
            Connect's ``offset.flush.interval.ms``).
        producer_overrides: librdkafka properties for the producer (``.`` as ``_``).
        transactional: write records and positions in transactions even when the
            connector's ``exactly_once`` is off (``--group`` mode: zombie fencing).
    """

    def __init__(
        self,
        config: SourceConnectorConfig,
        connection: Any,
        *,
        kafka: KafkaConfig,
        offsets: OffsetStore,
        schema_store: Any,
        task_id: int = 0,
        task_count: int = 1,
        retry: RetryPolicy | None = None,
        offset_flush_interval_s: float = 1.0,
        producer_overrides: Mapping[str, Any] | None = None,
        transactional: bool = False,
    ):
        self.config = config
        self.kafka = kafka
        self.offsets = offsets
        self.schema_store = schema_store
        self.key = offsets_key(config.name, task_id, task_count)
        self.task_id = task_id
        self.task_count = task_count
        self.retry = retry or RetryPolicy()
        self.offset_flush_interval_s = offset_flush_interval_s
        self.producer_overrides = dict(producer_overrides or {})
        # the producer's queue.buffering.max.messages (as tuned, else librdkafka's default): a batch is queued
        # only once it fits
        self._queue_max_messages = int(
            clients.producer_config(kafka, **self.producer_overrides).get("queue.buffering.max.messages", 100_000)
        )
        self._connection = connection
        self.task = self._new_task()
        self.transactional = bool(transactional or getattr(config, "exactly_once", False))
        self.transactional_id = transactional_id(offsets.topic, self.key)
        self._tx_open = False
        self._tx_position = None
        self._tx_whole = True  # no part of a system transaction is waiting for its rest (SourceBatch.continues)
        self._tx_timeout_s = max(30.0, kafka.request_timeout_s)
        self._fenced = False
        self._live = None  # the state topic's live keys, kept between reconciliations
        self.stats = RunnerStats()
        self._tracker = PositionTracker()
        self._producer = None
        self._written = None
        self._last_write = 0.0
        self._reconcile_every = getattr(config, "reconcile_interval_s", None)
        self._label = config.name
        self._dead_letters = None
        self._reconciling = False

    # -- public ---------------------------------------------------------------------------------------

    def run(self, stop: threading.Event, once: bool = False) -> RunnerStats:
        """Run the task; returns when ``stop`` is set, when caught up (``once``), or on a fatal error.

        The error of a failed task is in ``stats.error`` (and logged); it is not raised,
        so one failed task does not stop the others.
        """
        try:
            self._run(stop, once)
            self.stats.state = "stopped" if not once or stop.is_set() else "caught_up"
        except StopRequested as exc:  # stopped while retrying: not a failure, nothing to restart
            self.stats.state = "stopped"
            log.info("source=%s task=%d stopped while retrying: %s", self._label, self.task_id, exc)
        except (ThreesError, Exception) as exc:  # a task failure must not kill the worker
            self.stats.state = "failed"
            self.stats.error = str(exc)
            metrics.ERRORS.labels(self._label, "fatal").inc()
            log.error(
                "source=%s task=%d failed: %s",
                self._label,
                self.task_id,
                exc,
                exc_info=not isinstance(exc, ThreesError),
            )
        finally:
            self._shutdown()
        return self.stats

    # -- loop -----------------------------------------------------------------------------------------

    def _run(self, stop: threading.Event, once: bool) -> None:
        cfg = self.config
        position, schemas = self._open_task(stop)
        if cfg.value_format == "confluent_avro":
            self._run_registry(stop, once, schemas, position)
            return
        plan = self._plan_schemas(schemas)
        if plan.rekey:  # re-snapshot under the new key, whatever the stored position says
            log.warning("source=%s topic=%s key schema changed: re-keying (old keys tombstoned, then a snapshot)",
                        cfg.name, cfg.topic)
            old = self.task
            old.close()
            self.task = type(old)(
                old.config, old.connection, kafka=old.kafka, task_id=old.task_id, task_count=old.task_count
            )
            schemas = self._retrying(stop, lambda: self.task.open(None))
            self._written = None
        self._serializers(schemas, plan)
        if self._producer is None:
            self._producer = clients.kafka_producer(self.kafka, **self.producer_overrides)
        self.stats.state = "running"
        plan.record_value(self.schema_store)
        if plan.rekey:
            self._retrying(stop, lambda: self._tombstone_old_keys(plan))
        else:
            plan.record_key(self.schema_store)
        self._loop(stop, once, position, plan)

    def _open_task(self, stop: threading.Event) -> tuple[dict[str, Any] | None, SourceSchemas]:
        """Create the compacted topic if missing, load the stored position and open the task from it.

        Returns:
            ``(position, the task's schemas)``; the position is ``None`` for a first snapshot.
        """
        cfg = self.config
        spec = cfg.topic_spec
        ensure_compacted_topic(
            self.kafka.librdkafka_config(),
            cfg.topic,
            partitions=spec.partitions,
            replication_factor=(
                spec.replication_factor if spec.replication_factor is not None
                else self.kafka.internal_replication_factor
            ),
            min_insync_replicas=self.kafka.internal_min_insync_replicas,
            configs=spec.configs,
            timeout_s=self.kafka.request_timeout_s,
        )
        if cfg.errors.tolerance == "all":
            dlq = cfg.dead_letter_topic_name
            limit = ensure_dead_letter_topic(self.kafka, dlq)
            self._dead_letters = SourceDeadLetters(cfg.topic, dlq, cfg.name, limit)
            self._dead_letters.load(self.kafka.librdkafka_config(), self.kafka.request_timeout_s)
        if self.transactional:
            # before the position is read: fences older instances of this task and ends their transactions
            self._producer = self._transactional_producer()
        position = require_position_shape(self.offsets.load(self.key), f"source {cfg.name!r}")
        self._written = position
        self.stats.position = position
        log.info("source=%s task=%d topic=%s resuming from position=%s", cfg.name, self.task_id, cfg.topic,
                 position if position is not None else "none (snapshot)")
        return position, self._retrying(stop, lambda: self.task.open(position))

    def _run_registry(self, stop: threading.Event, once: bool, schemas: Any, position: Any) -> None:
        """:meth:`_run` for a ``confluent_avro`` topic: schemas registered in the Schema Registry.

        Both subjects (``<topic>-key``, ``<topic>-value``) are registered before
        anything is produced; a schema the subject's compatibility level refuses
        stops the task (``IncompatibleSchemaError``) with nothing produced. The
        registry, not the schema topic, holds the versions.
        """
        from schemas.registry import RegistrySerializer, registry_client

        cfg = self.config
        if self.kafka.schema_registry is None:
            raise FatalError(f"source {cfg.name!r}: value_format confluent_avro needs kafka.schema_registry")
        client = registry_client(self.kafka.schema_registry.client_config())
        level = cfg.topic_spec.compatibility
        self._value_schema = schemas.value
        self._key_names = [f["name"] for f in schemas.key.get("fields", [])]
        self.key_ser = self._retrying(
            stop, lambda: RegistrySerializer(client, cfg.topic, schemas.key, is_key=True, default_level=level))
        self.value_ser = self._retrying(
            stop, lambda: RegistrySerializer(client, cfg.topic, schemas.value, default_level=level))
        try:
            # the Avro body is the same in both formats: only the prefix differs (5 bytes: magic, schema id)
            self._columnar = ColumnarEncoder(schemas.value, self.value_ser.header, schemas.key, self.key_ser.header)
        except ColumnarUnsupported as exc:
            self._columnar = None
            log.debug("source=%s batches are encoded record by record: %s", cfg.name, exc)
        if self._producer is None:
            self._producer = clients.kafka_producer(self.kafka, **self.producer_overrides)
        self.stats.state = "running"
        self._loop(stop, once, position, None)

    def _loop(self, stop: threading.Event, once: bool, position: Any, plan: TopicSchemaPlan | None) -> None:
        cfg = self.config
        last_reconcile: float | None = None
        while not stop.is_set():
            started = time.monotonic()
            complete = self._retrying(stop, lambda: self._cycle(stop))
            if not complete:
                break
            if plan is not None and plan.rekey:  # the snapshot under the new key is acknowledged: re-key done
                self._drain()
                plan.record_key(self.schema_store)
                plan.rekey = False
                log.info("source=%s topic=%s re-keyed", cfg.name, cfg.topic)
            self.stats.cycles += 1
            metrics.CYCLE_SECONDS.labels(self._label).observe(time.monotonic() - started)
            if self.stats.cycles == 1:  # read until caught up: from no stored position, the initial snapshot
                log.info(
                    "source=%s task=%d topic=%s %s done: rows_read=%d records=%d tombstones=%d elapsed_s=%.1f "
                    "position=%s",
                    cfg.name, self.task_id, cfg.topic,
                    "snapshot" if position is None else "catch-up from the stored position",
                    self.stats.rows_read, self.stats.produced, self.stats.tombstones,
                    time.monotonic() - started, self._written,
                )
            due = self._reconcile_every is not None and (
                last_reconcile is None or time.monotonic() - last_reconcile >= self._reconcile_every
            )
            if (due or self.task.wants_reconcile()) and self.task.reconciles():
                self._retrying(stop, self._reconcile)
                last_reconcile = time.monotonic()
            if once:
                break
            self.stats.state = "caught_up"
            self._idle(stop, cfg.poll_interval_s)
            self.stats.state = "running"

    def _retrying(self, stop: threading.Event, fn: Callable[[], Any]) -> Any:
        policy = self.retry

        def before_sleep(state: Any) -> None:
            metrics.ERRORS.labels(self._label, "retriable").inc()
            log.warning(
                "source=%s transient failure (attempt %d, retried %s), retrying: %s",
                self._label,
                state.attempt_number,
                describe_retry(self.config.errors, policy),
                state.outcome.exception(),
            )

        # a stop ends the streak: no attempt after it, and a backoff it interrupts raises StopRequested (a sleep
        # that only returned early would start the next attempt at once: a hot loop until the retry timeout)
        retrying = Retrying(
            retry=retry_if_exception_type(RetriableError),
            stop=retry_stop(self.config.errors, policy, stop),
            wait=wait_random_exponential(multiplier=policy.initial_backoff_s, max=policy.max_backoff_s),
            sleep=stoppable_sleep(stop),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            return retrying(fn)
        except RetriableError as exc:
            if stop.is_set():
                raise StopRequested(f"source {self._label!r}: stop requested while retrying: {exc}") from exc
            raise

    def _cycle(self, stop: threading.Event) -> bool:
        """One polling cycle; ``False`` when interrupted by ``stop``."""
        for batch in self.task.poll():
            self._send(batch)
            if stop.is_set():
                return False
        return True

    def _tombstone_old_keys(self, plan: TopicSchemaPlan) -> None:
        """A re-key's first step: a tombstone for every live key not framed with the new key schema.

        They are acknowledged (and, with transactions, committed) before the
        snapshot's first value, so a reader never deletes an entity after its
        new-key value arrived (the same entity under both keys decodes to the
        same primary key downstream).
        """
        self._drain()
        live, _ends = live_keys(self.kafka.librdkafka_config(), self.config.topic, None, self.kafka.request_timeout_s)
        new_header = MARKER + plan.key_fingerprint
        old = [key for key in live if key is not None and not key.startswith(new_header)]
        live.close()
        if old:
            self._send(SourceBatch([(key, None) for key in old], None))
            self._drain()
        log.info("source=%s re-key: %d old keys tombstoned in topic=%s", self._label, len(old), self.config.topic)

    def _reconcile(self) -> None:
        """Compare the task's system with the topic's live keys (kept on disk, caught up from the last run)."""
        self._drain()
        if self._live is None:
            self._live = LiveKeys(self.task.source_header)
        live = self._live
        ends = live.catch_up(self.kafka.librdkafka_config(), self.config.topic, self.kafka.request_timeout_s)
        state = TopicState(live=live, encode_key=self.key_ser, end_offsets=ends)
        before = self.stats.tombstones
        self._reconciling = True  # a row the topic lacks because it is a dead letter is not sent again
        try:
            for batch in self.task.reconcile(state):
                self._send(batch)
        finally:
            self._reconciling = False
        log.info(
            "source=%s reconciled topic=%s live_keys=%d tombstones=%d",
            self._label,
            self.config.topic,
            len(live),
            self.stats.tombstones - before,
        )

    def _idle(self, stop: threading.Event, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self._producer.poll(min(0.2, remaining))
            self._commit()

