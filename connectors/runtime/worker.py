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

A record that cannot be encoded stops its task with an error naming the
connector, the record's key and the field: it is neither skipped nor is the
position moved past it. Other tasks go on.
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import fastavro
from confluent_kafka import KafkaException
from tenacity import Retrying, retry_if_exception_type, wait_random_exponential

from connectors.api.source import SourceBatch, SourceSchemas, SourceTask, TopicState
from connectors.registry import load_implementation
from connectors.runtime import metrics
from connectors.runtime.columnar import ColumnarEncoder, ColumnarUnsupported
from connectors.runtime.offsets import OffsetStore, PositionTracker, offsets_key, require_position_shape
from connectors.runtime.state import LiveKeys, live_keys
from kernel.config.models import KafkaConfig, RetryPolicy, SourceConnectorConfig
from kernel.exceptions import FatalError, RetriableError, SetupError, ThreesError
from kernel.kafka import clients
from kernel.kafka.topics import ensure_compacted_topic, recent_keys
from kernel.supervision import StopRequested, describe_retry, retry_stop, stoppable_sleep
from kernel.updates import with_source_ts
from schemas.evolution import TopicSchemaPlan, plan_topic_schemas
from schemas.exceptions import SerdeError
from schemas.serde import MARKER, AvroSerializer

log = logging.getLogger(__name__)

TRANSACTION_TIMEOUT_MS = 60_000
"""librdkafka's ``transaction.timeout.ms`` default: how long a dead producer's transaction holds readers back."""


@dataclass
class RunnerStats:
    """Progress of one task, read by the CLI's progress bar (plain ints: torn reads are harmless).

    Attributes:
        rows_read: rows/documents read from the system.
        produced: records handed to the producer.
        acked: records acknowledged by the broker.
        tombstones: tombstones produced.
        commits: positions written to the offsets topic.
        state: ``starting``, ``running``, ``caught_up``, ``stopped`` or ``failed``.
        error: the error that stopped the task, if any.
        position: the last position written.
        cycles: completed polling cycles.
        queue_full: times the producer's local queue was full and the task waited (backpressure).
    """

    rows_read: int = 0
    produced: int = 0
    acked: int = 0
    tombstones: int = 0
    commits: int = 0
    state: str = "starting"
    error: str | None = None
    position: dict[str, Any] | None = None
    cycles: int = 0
    queue_full: int = 0
    started: float = field(default_factory=time.monotonic)


def bad_fields(schema: Mapping[str, Any], record: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Find the fields of ``record`` that do not encode with their Avro field schema.

    fastavro names the field of some errors and not others; writing each field
    alone names it every time.

    Args:
        schema: the (unparsed) Avro record schema.
        record: the value that failed to encode.

    Returns:
        ``(field name, error message)`` per failing field, in schema order.
    """
    found: list[tuple[str, str]] = []
    for f in schema.get("fields", []):
        probe = {"type": "record", "name": "probe", "fields": [f]}
        try:
            buf = io.BytesIO()
            fastavro.schemaless_writer(buf, fastavro.parse_schema(probe), {f["name"]: record.get(f["name"])})
        except Exception as exc:  # noqa: BLE001 - any encoding failure is what we look for
            found.append((f["name"], str(exc)))
    return found


def transactional_id(offsets_topic: str, key: str) -> str:
    """The ``transactional.id`` of a task: stable across restarts and workers, unique per offsets key.

    Kafka Connect uses ``<group>-<connector>-<task>``; the offsets topic plays
    the group's part here (two pipelines with their own offsets topics never
    fence each other).
    """
    return f"threes-source.{offsets_topic}.{key}"


class TaskRunner:
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
        # librdkafka's queue.buffering.max.messages (its default): a batch is queued only once it fits
        self._queue_max_messages = int(self.producer_overrides.get("queue_buffering_max_messages", 100_000))
        self._connection = connection
        self.task: SourceTask = self._new_task()
        self.transactional = bool(transactional or getattr(config, "exactly_once", False))
        self.transactional_id = transactional_id(offsets.topic, self.key)
        self._tx_open = False
        self._tx_position: dict[str, Any] | None = None
        self._tx_timeout_s = max(30.0, kafka.request_timeout_s)
        self._fenced = False
        self._live: LiveKeys | None = None  # the state topic's live keys, kept between reconciliations
        self.stats = RunnerStats()
        self._tracker = PositionTracker()
        self._producer: Any = None
        self._written: dict[str, Any] | None = None
        self._last_write = 0.0
        self._reconcile_every: float | None = getattr(config, "reconcile_interval_s", None)
        self._label = config.name

    def _new_task(self) -> SourceTask:
        impl: type[SourceTask] = load_implementation(self.config)
        return impl(self.config, self._connection, kafka=self.kafka, task_id=self.task_id, task_count=self.task_count)

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
        except (ThreesError, Exception) as exc:  # noqa: BLE001 - a task failure must not kill the worker
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
        if self.transactional:
            # before the position is read: fences older instances of this task and ends their transactions
            self._producer = self._transactional_producer()
        position = require_position_shape(self.offsets.load(self.key), f"source {cfg.name!r}")
        self._written = position
        self.stats.position = position
        log.info("source=%s task=%d topic=%s resuming from position=%s", cfg.name, self.task_id, cfg.topic,
                 position if position is not None else "none (snapshot)")
        return position, self._retrying(stop, lambda: self.task.open(position))

    def _plan_schemas(self, schemas: SourceSchemas) -> TopicSchemaPlan:
        """Schema evolution, checked before anything is produced (:func:`schemas.evolution.plan_topic_schemas`)."""
        cfg = self.config
        kconf = self.kafka.librdkafka_config()
        return plan_topic_schemas(
            self.schema_store,
            topic=cfg.topic,
            connector=cfg.name,
            key_schema=schemas.key,
            value_schema=schemas.value,
            compatibility=cfg.topic_spec.compatibility,
            rekey=cfg.rekey,
            tasks=self.task_count,
            topic_keys=lambda: recent_keys(kconf, cfg.topic, timeout_s=self.kafka.request_timeout_s),
        )

    def _serializers(self, schemas: SourceSchemas, plan: TopicSchemaPlan) -> None:
        """The key and value serializers of the topic's schemas, and the columnar encoder when it can write them."""
        self._value_schema = schemas.value
        self._key_names = [f["name"] for f in schemas.key.get("fields", [])]
        self.key_ser = AvroSerializer(schemas.key, self.schema_store, fp=plan.key_fingerprint)
        self.value_ser = AvroSerializer(schemas.value, self.schema_store)
        try:
            self._columnar: ColumnarEncoder | None = ColumnarEncoder(
                schemas.value, self.value_ser.header, schemas.key, self.key_ser.header
            )
        except ColumnarUnsupported as exc:
            self._columnar = None
            log.debug("source=%s batches are encoded record by record: %s", self.config.name, exc)

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
        for batch in self.task.reconcile(state):
            self._send(batch)
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

    # -- produce --------------------------------------------------------------------------------------

    def _send(self, batch: SourceBatch) -> None:
        # freshness from the source (threes.source_ts): the commit time when the connector knows it, else now
        ts_ms = batch.source_ts_ms if batch.source_ts_ms is not None else int(time.time() * 1000)
        batch.headers = with_source_ts(batch.headers, ts_ms)
        if self.transactional:
            self._begin(batch.position)
        if batch.columns is not None:
            self._send_columns(batch)
            return
        records = batch.records
        pending = self._tracker.add(len(records), batch.position, f"source {self._label!r} topic {self.config.topic!r}")
        on_delivery = pending.ack
        produce = self._producer.produce
        topic = self.config.topic
        headers = batch.headers
        key_ser, value_ser = self.key_ser, self.value_ser
        tombstones = 0
        for i, (key, value) in enumerate(records):
            try:
                kb = key if key.__class__ is bytes else key_ser(key)
                if value is None:
                    vb = None
                    tombstones += 1
                else:
                    vb = value_ser(value)
            except SerdeError as exc:
                error = self._encode_error(key, value, exc)
                # nothing of this batch from here on is produced, and its position is never stored
                self._tracker.abandon(pending, len(records) - i, str(error))
                self.stats.produced += i
                raise error from exc
            try:
                produce(topic, vb, kb, on_delivery=on_delivery, headers=headers)
            except BufferError:
                self._produce_when_room(topic, vb, kb, on_delivery=on_delivery, headers=headers)
            except KafkaException as exc:  # refused at once (too large...): the batch never commits
                self.stats.produced += i
                raise self._refused(pending, len(records) - i, exc) from exc
        n = len(records)
        self.stats.rows_read += batch.rows_read or 0
        self.stats.produced += n
        self.stats.tombstones += tombstones
        metrics.RECORDS_READ.labels(self._label).inc(batch.rows_read or 0)
        if tombstones:
            metrics.TOMBSTONES.labels(self._label).inc(tombstones)
        self._producer.poll(0)
        self._commit()

    def _send_columns(self, batch: SourceBatch) -> None:
        """Produce a column-wise batch: keys and values encoded in one call, queued with ``produce_batch``.

        A batch the columnar encoder cannot write (a null in a non-null field, a
        value out of its range) goes through the per-record path, which names
        the record and field that cannot be encoded, as for any batch.
        """
        table = batch.columns
        encoded: tuple[list[bytes], list[bytes]] | None = None
        if self._columnar is not None:
            try:
                encoded = self._columnar.encode(table)
            except (ValueError, TypeError, ArithmeticError) as exc:  # pyarrow's errors are ValueError/TypeError
                log.debug("source=%s batch encoded record by record: %s", self._label, exc)
        if encoded is None:
            names = self._key_names
            records: list[Any] = [({k: row[k] for k in names}, row) for row in table.to_pylist()]
            self._send(SourceBatch(records, batch.position, batch.headers, batch.rows_read))
            return
        keys, values = encoded
        n = len(values)
        pending = self._tracker.add(n, batch.position, f"source {self._label!r} topic {self.config.topic!r}")
        if batch.headers is None:
            self._produce_batch(keys, values, pending)
        else:  # produce_batch carries no headers
            produce, topic, headers, on_delivery = self._producer.produce, self.config.topic, batch.headers, pending.ack
            for i, (kb, vb) in enumerate(zip(keys, values, strict=True)):
                try:
                    produce(topic, vb, kb, on_delivery=on_delivery, headers=headers)
                except BufferError:
                    self._produce_when_room(topic, vb, kb, on_delivery=on_delivery, headers=headers)
                except KafkaException as exc:  # refused at once (too large...): the batch never commits
                    raise self._refused(pending, n - i, exc) from exc
        self.stats.rows_read += batch.rows_read or 0
        self.stats.produced += n
        metrics.RECORDS_READ.labels(self._label).inc(batch.rows_read or 0)
        self._producer.poll(0)
        self._commit()

    def _produce_batch(self, keys: list[bytes], values: list[bytes], pending: Any) -> None:
        """Hand a batch's records to librdkafka in one ``produce_batch`` call (keys partitioned as ``produce`` does).

        The local queue is first made to have room for the whole batch (delivery
        reports served until it has), so no record is refused for a full queue
        and the batch's records are queued in order. A record refused for any
        other reason (too large...) stops the task like a failed ``produce``:
        the batch's position is never stored.

        Raises:
            FatalError: a record was refused.
        """
        step = max(1, self._queue_max_messages // 2)  # a batch larger than the queue goes in parts
        for first in range(0, len(values), step):
            part = slice(first, first + step)
            messages = [{"key": kb, "value": vb} for kb, vb in zip(keys[part], values[part], strict=True)]
            room = self._queue_max_messages - len(messages)
            if len(self._producer) > room:
                self.stats.queue_full += 1
                metrics.QUEUE_FULL.labels(self._label).inc()
                while len(self._producer) > room:
                    self._producer.poll(0.05)
            queued = self._producer.produce_batch(self.config.topic, messages, on_delivery=pending.ack)
            if queued != len(messages):
                failed = [m["_error"] for m in messages if "_error" in m]
                first_error = str(failed[0]) if failed else "unknown"  # a KafkaError
                error = FatalError(
                    f"source {self._label!r} (topic {self.config.topic!r}): {len(failed)} record(s) of a batch "
                    f"refused by the producer, first: {first_error}"
                )
                # the refused records and the parts not produced owe no acknowledgement; the batch never commits
                self._tracker.abandon(pending, len(values) - first - queued, str(error))
                raise error

    def _refused(self, pending: Any, unsent: int, exc: KafkaException) -> FatalError:
        """The error that stops the task when librdkafka refuses a record of a batch at once (e.g. too large).

        The refused record and the ones after it owe no acknowledgement: the
        batch's position is never stored.
        """
        error = FatalError(
            f"source {self._label!r} (topic {self.config.topic!r}): a record of a batch refused by the producer: "
            f"{exc.args[0] if exc.args else exc}"
        )
        self._tracker.abandon(pending, unsent, str(error))
        return error

    def _produce_when_room(self, topic: str, value: bytes | None, key: bytes | None, **kwargs: Any) -> None:
        """Produce after the local queue was found full: serve delivery reports until there is room; never drop."""
        self.stats.queue_full += 1
        metrics.QUEUE_FULL.labels(self._label).inc()
        while True:
            self._producer.poll(0.05)
            try:
                self._producer.produce(topic, value, key, **kwargs)
                return
            except BufferError:
                continue

    def _encode_error(self, key: Any, value: Any, exc: Exception) -> FatalError:
        where = f"source {self._label!r} (topic {self.config.topic!r}) {self.task.describe_key(key)}"
        if value is not None:
            fields = bad_fields(self._value_schema, value)
            if fields:
                parts = "; ".join(f"{self.task.describe_field(f)}: {msg}" for f, msg in fields)
                return FatalError(f"{where}: value cannot be encoded as Avro: {parts}")
        return FatalError(f"{where}: record cannot be encoded as Avro: {exc}")

    # -- transactions (exactly once) ---------------------------------------------------------------------

    def _transactional_producer(self) -> Any:
        """A producer with the task's ``transactional.id``, initialised (older instances fenced).

        Raises:
            SetupError: the transaction coordinator did not answer.
        """
        overrides = {
            "transaction_timeout_ms": TRANSACTION_TIMEOUT_MS,
            **self.producer_overrides,
            "transactional_id": self.transactional_id,
        }
        producer = clients.kafka_producer(self.kafka, **overrides)
        try:
            producer.init_transactions(self._tx_timeout_s)
        except KafkaException as exc:
            raise SetupError(
                f"source {self._label!r}: cannot initialise transactions (transactional.id "
                f"{self.transactional_id!r}): {exc}"
            ) from exc
        log.info("source=%s task=%d transactional.id=%s initialised (older instances fenced)",
                 self._label, self.task_id, self.transactional_id)
        return producer

    def _begin(self, position: dict[str, Any] | None) -> None:
        """Open a transaction if none is open; remember the newest position it covers."""
        if not self._tx_open:
            try:
                self._producer.begin_transaction()
            except KafkaException as exc:
                self._transaction_failed(exc, "begin")
            self._tx_open = True
        if position is not None:
            self._tx_position = position

    def _commit_transaction(self, force: bool) -> None:
        """Add the position record to the open transaction and commit it (every flush interval unless forced).

        ``commit_transaction`` flushes every record first; once it returns, the
        records and the position are visible to ``read_committed`` readers
        together, or (after a crash before it) neither is.
        """
        _moved, acked = self._tracker.advance(raise_errors=False)  # progress only: failures surface at commit
        if acked:
            self.stats.acked += acked
            metrics.RECORDS_ACKED.labels(self._label).inc(acked)
        if not self._tx_open:
            return
        now = time.monotonic()
        if not force and now - self._last_write < self.offset_flush_interval_s:
            return
        position = self._tx_position
        if position is not None and position is not self._written:
            value = self.offsets.encode(self.key, self.config.name, self.task_id, self.config.topic, position)
            try:
                self._producer.produce(self.offsets.topic, value, self.key.encode())
            except BufferError:
                self._produce_when_room(self.offsets.topic, value, self.key.encode())
        while True:
            try:
                self._producer.commit_transaction(self._tx_timeout_s)
                break
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if err is not None and err.retriable() and not err.txn_requires_abort() and not err.fatal():
                    log.warning("source=%s commit of a transaction timed out, retrying: %s", self._label, err)
                    continue
                self._transaction_failed(exc, "commit")
        self._tx_open = False
        self._last_write = now
        _moved, acked = self._tracker.advance(raise_errors=False)
        if acked:
            self.stats.acked += acked
            metrics.RECORDS_ACKED.labels(self._label).inc(acked)
        metrics.IN_FLIGHT.labels(self._label).set(self.stats.produced - self.stats.acked)
        if position is not None and position is not self._written:
            self._written = position
            self.task.commit(position)
            self.stats.position = position
            self.stats.commits += 1
            metrics.POSITION_COMMITS.labels(self._label).inc()
            log.debug("source=%s committed transaction position=%s", self._label, position)

    def _transaction_failed(self, exc: KafkaException, step: str) -> None:
        """Handle a failed ``begin``/``commit``: abort and rewind, or stop when fenced.

        Raises:
            RetriableError: the transaction was aborted; the task was rewound to
                the last committed position (the worker retries the cycle from it).
            FatalError: this producer was fenced (another instance of the task
                runs: this one is a zombie and must write nothing), or the
                producer is in a state it cannot leave.
        """
        err = exc.args[0] if exc.args else None
        where = f"source {self._label!r} task {self.task_id} (transactional.id {self.transactional_id!r})"
        if err is not None and err.txn_requires_abort() and not err.fatal():
            try:
                self._producer.abort_transaction(self._tx_timeout_s)
            except KafkaException as abort_exc:
                raise FatalError(f"{where}: {step} failed ({err}) and the abort too: {abort_exc}") from abort_exc
            self._tx_open = False
            self._rewind()
            raise RetriableError(
                f"{where}: transaction aborted at {step} ({err}); resuming from the last committed position"
            ) from exc
        self._tx_open = False
        self._fenced = True
        raise FatalError(
            f"{where}: cannot {step} a transaction ({err}): another worker runs this task now (fenced) or the "
            "producer failed for good; nothing more is written by this instance"
        ) from exc

    def _rewind(self) -> None:
        """Start the task again from the last committed position (the aborted records are gone)."""
        self._tracker = PositionTracker()
        self._tx_position = None
        try:
            self.task.close()
        except Exception as exc:  # noqa: BLE001 - the old instance is dropped either way
            log.warning("source=%s close before rewind failed: %s", self._label, exc)
        self.task = self._new_task()
        self.task.open(self._written)
        log.warning("source=%s task=%d rewound to position=%s", self._label, self.task_id, self._written)

    def _commit(self, force: bool = False, raise_errors: bool = True) -> None:
        """Write the newest acknowledged position (at most every flush interval unless forced)."""
        if self.transactional:
            self._commit_transaction(force)
            return
        _moved, acked = self._tracker.advance(raise_errors)
        if acked:
            self.stats.acked += acked
            metrics.RECORDS_ACKED.labels(self._label).inc(acked)
        metrics.IN_FLIGHT.labels(self._label).set(self.stats.produced - self.stats.acked)
        position = self._tracker.committable
        if position is None or position is self._written:
            return
        now = time.monotonic()
        if not force and now - self._last_write < self.offset_flush_interval_s:
            return
        value = self.offsets.encode(self.key, self.config.name, self.task_id, self.config.topic, position)
        try:
            self._producer.produce(self.offsets.topic, value, self.key.encode())
        except BufferError:
            self._produce_when_room(self.offsets.topic, value, self.key.encode())
        self._written = position
        self._last_write = now
        self.task.commit(position)
        self.stats.position = position
        self.stats.commits += 1
        metrics.POSITION_COMMITS.labels(self._label).inc()
        log.debug("source=%s position=%s", self._label, position)

    def _drain(self, timeout_s: float | None = None, raise_errors: bool = True) -> None:
        """Wait until every produced record is acknowledged (or failed), committing as acks arrive.

        With transactions the open one is committed: a ``read_committed``
        reader of the state topic (reconciliation) must see every record, and
        an open transaction of ours would hold its read back.
        """
        if self.transactional:
            self._commit_transaction(force=True)
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._tracker.in_flight > 0:
            if deadline is not None and time.monotonic() > deadline:
                raise RetriableError(
                    f"source {self._label!r}: {self._tracker.in_flight} records not acknowledged within {timeout_s} s"
                )
            self._producer.poll(0.1)
            if raise_errors and self._tracker.first_error():
                break
        self._commit(raise_errors=raise_errors)

    def _shutdown_transactional(self) -> None:
        """Commit the open transaction on a clean stop; abort it after a failure (records replay from the position)."""
        if self._fenced or not self._tx_open:
            pass
        elif self.stats.state == "failed":
            try:
                self._producer.abort_transaction(self._tx_timeout_s)
            except KafkaException as exc:
                log.error("source=%s on stop: abort failed: %s", self._label, exc)
        else:
            try:
                self._commit_transaction(force=True)
            except ThreesError as exc:
                log.error("source=%s on stop: %s", self._label, exc)
        log.info(
            "source=%s stopped rows_read=%d acked=%d tombstones=%d position=%s",
            self._label, self.stats.rows_read, self.stats.acked, self.stats.tombstones, self.stats.position,
        )

    def _shutdown(self) -> None:
        try:
            if self._producer is not None and self.transactional:
                self._shutdown_transactional()
            elif self._producer is not None:
                try:
                    # store what is acknowledged, up to (not past) a failed batch: records replay on restart
                    self._drain(timeout_s=60.0, raise_errors=False)
                    self._commit(force=True, raise_errors=False)
                except ThreesError as exc:
                    log.error("source=%s on stop: %s", self._label, exc)
                remaining = self._producer.flush(30.0)
                if remaining:
                    log.error("source=%s on stop: %d records/positions not acknowledged", self._label, remaining)
                log.info(
                    "source=%s stopped rows_read=%d acked=%d tombstones=%d position=%s",
                    self._label,
                    self.stats.rows_read,
                    self.stats.acked,
                    self.stats.tombstones,
                    self.stats.position,
                )
        finally:
            if self._live is not None:
                self._live.close()
                self._live = None
            try:
                self.task.close()
            except Exception as exc:  # noqa: BLE001 - closing must not hide the real error
                log.warning("source=%s close failed: %s", self._label, exc)
