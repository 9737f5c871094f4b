"""A source task's records: encoded (record by record, or column-wise) and handed to the producer.

A full local queue (``BufferError``) is waited out by serving delivery reports, never dropped. A record that
cannot be encoded stops the task with an error naming the connector, the record's key and the field, and how to
move on; with ``errors.tolerance: all`` it goes to the source's dead letter topic instead, in its place in the
batch, so the batch's position is stored once the dead letter is acknowledged too
(:mod:`connectors.runtime.dead_letters`).
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Mapping
from typing import Any

import fastavro
from confluent_kafka import KafkaError, KafkaException

from connectors.api.source import SourceBatch
from connectors.runtime import metrics
from connectors.runtime.dead_letters import encode_failure_hint
from connectors.runtime.position_commits import PositionCommits
from kernel.exceptions import FatalError
from kernel.updates import with_source_ts
from schemas.exceptions import SerdeError

# the runner's log lines keep the logger name they always had
log = logging.getLogger("connectors.runtime.worker")


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
        except Exception as exc:  # any encoding failure is what we look for
            found.append((f["name"], str(exc)))
    return found


def _transaction_refusal(err: Any) -> bool:
    """A record refused because its transactional producer cannot take records now (``_STATE``, ``_FATAL``)."""
    return isinstance(err, KafkaError) and err.code() in (KafkaError._STATE, KafkaError._FATAL)


class RecordProducer(PositionCommits):
    """Encode and produce batches (a mixin of ``TaskRunner``, over the position commits)."""

    # -- produce --------------------------------------------------------------------------------------

    def _send(self, batch: SourceBatch) -> None:
        # freshness from the source (threes.source_ts): the commit time when the connector knows it, else now
        ts_ms = batch.source_ts_ms if batch.source_ts_ms is not None else int(time.time() * 1000)
        batch.headers = with_source_ts(batch.headers, ts_ms)
        if self.transactional:
            self._begin(batch.position)
            self._tx_whole = not batch.continues
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
        tombstones = dead = 0
        for i, (key, value) in enumerate(records):
            out_topic, out_headers = topic, headers
            try:
                kb = key if key.__class__ is bytes else key_ser(key)
                if value is None:
                    vb = None
                    tombstones += 1
                else:
                    vb = value_ser(value)
            except SerdeError as exc:
                if self._dead_letters is None:
                    error = self._encode_error(key, value, exc)
                    # nothing of this batch from here on is produced, and its position is never stored
                    self._tracker.abandon(pending, len(records) - i, str(error))
                    self.stats.produced += i - dead
                    self.stats.restartable = False  # the same row fails the same way after a restart
                    raise error from exc
                # in the record's place: the batch's position waits for the dead letter's acknowledgement too
                out_topic = self._dead_letters.dead_letter_topic
                dead += 1
                letter = self._dead_letter(key, value, exc, batch)
                if letter is None:  # a reconciliation emitted again a row that is a dead letter already
                    on_delivery(None, None)
                    continue
                kb, vb, out_headers = letter
            try:
                produce(out_topic, vb, kb, on_delivery=on_delivery, headers=out_headers)
            except BufferError:
                self._produce_when_room(out_topic, vb, kb, on_delivery=on_delivery, headers=out_headers)
            except KafkaException as exc:  # refused at once (too large...): the batch never commits
                self.stats.produced += i - dead
                raise self._refused(pending, len(records) - i, exc) from exc
        n = len(records) - dead
        self.stats.rows_read += batch.rows_read or 0
        self.stats.produced += n
        self.stats.dead_letters = self._dead_letters.count if self._dead_letters is not None else 0
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
        assert table is not None  # called for a column-wise batch only
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
                if self.transactional and failed and _transaction_refusal(failed[0]):
                    self._transaction_failed(KafkaException(failed[0]), "produce")
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
        if self.transactional and _transaction_refusal(exc.args[0] if exc.args else None):
            self._transaction_failed(exc, "produce")  # the transaction failed in the background: abort, or restart
        return error

    def _encode_error(self, key: Any, value: Any, exc: Exception) -> FatalError:
        where = f"source {self._label!r} (topic {self.config.topic!r}) {self.task.describe_key(key)}"
        hint = encode_failure_hint(self.config.dead_letter_topic_name)
        if value is not None:
            fields = bad_fields(self._value_schema, value)
            if fields:
                parts = "; ".join(f"{self.task.describe_field(f)}: {msg}" for f, msg in fields)
                return FatalError(f"{where}: value cannot be encoded as Avro: {parts}; {hint}")
        return FatalError(f"{where}: record cannot be encoded as Avro: {exc}; {hint}")

    def _dead_letter(
        self, key: Any, value: Any, exc: Exception, batch: SourceBatch
    ) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]] | None:
        """The dead letter record of a record that cannot be encoded, logged in one line.

        Returns:
            ``(key, value, headers)`` to produce, or ``None`` when a reconciliation emitted again a row that is
            in the dead letter topic already (:meth:`~connectors.runtime.dead_letters.SourceDeadLetters.repeated`);
            a change read again (CDC, a re-read) is a dead letter each time.
        """
        assert self._dead_letters is not None  # errors.tolerance: all
        try:
            kb = key if key.__class__ is bytes else self.key_ser(key)
        except SerdeError:
            kb = None  # the key itself cannot be encoded: dlq.source.key still names it
        if self._dead_letters.repeated(kb, value) and self._reconciling:
            log.debug("source=%s %s dead-lettered already", self._label, self.task.describe_key(key))
            return None
        fields = [] if value is None else bad_fields(self._value_schema, value)
        reason: Exception = exc
        if fields:
            reason = SerdeError("; ".join(f"{self.task.describe_field(f)}: {msg}" for f, msg in fields))
        metrics.ERRORS.labels(self._label, "dead_letter").inc()
        log.warning(
            "source=%s %s cannot be encoded as Avro (%s): sent to dead letter topic=%s (errors.tolerance: all)",
            self._label,
            self.task.describe_key(key),
            reason,
            self._dead_letters.dead_letter_topic,
        )
        return self._dead_letters.record(
            key_bytes=kb,
            key=key,
            value=value,
            error=reason,
            table=self.task.origin(),
            columns=[self.task.field_origin(f) for f, _msg in fields],
            position=batch.position,
            headers=batch.headers,
        )
