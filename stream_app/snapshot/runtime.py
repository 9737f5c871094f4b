"""The live snapshot: loaded behind a readiness gate, caught up before every micro-batch, checkpointed.

A :class:`Snapshot` keeps:

* a **base**: the latest value per key up to ``base_offsets``: up to
  ``broadcast_max_rows`` keys a small Arrow table on the driver, cached as a
  DataFrame that Spark broadcasts per batch (or, opt-in from
  ``index_min_rows``, shipped once to the executors' Python workers and indexed
  there); above, a DataFrame the executors keep partitioned by key and write
  as versions in the checkpoint location
  (:mod:`stream_app.snapshot.partitioned`): the driver holds its offsets and
  counts only;
* an **overlay log** on the driver: the records read since the base (updates and
  tombstones, with their offsets), in read order, at most ``overlay_max_rows``.

Before each micro-batch :meth:`Snapshot.catch_up` reads only the new offset
ranges ``[offsets, end offsets)`` from Kafka into the overlay (a few records:
one long-lived consumer on the driver, decoded there by fastavro,
:mod:`stream_app.snapshot.delta`; many: Spark's Kafka source, decoded in the
JVM), so a refresh costs what was written since the last one, not the
snapshot's size. A bootstrap of a topic holding at most ``overlay_max_rows``
records is read the same way (no Spark job in a JVM that has not run one yet).
When the overlay passes ``overlay_max_rows`` it is merged
into a new base (a new driver table, or a new version written by the
executors); a larger delta of a partitioned snapshot is read, decoded and
merged by the executors without reaching the driver. This is the base + delta
design of log-structured stores (LSM trees) and of Kafka Streams'
restore-then-tail.

Because the overlay keeps offsets, :meth:`Snapshot.view` can give the
snapshot *as of* earlier offsets: a micro-batch replayed after a crash joins
against exactly what it joined the first time.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kernel.config.models import KafkaConfig
from stream_app import metrics
from stream_app.checkpoint import SnapshotCheckpoint
from stream_app.columns import rows_where
from stream_app.kafka_io import Offsets, RangeReader, TopicWatermarks, count_between, offsets_json, read_range
from stream_app.plan.model import SnapshotPlan
from stream_app.plan.writer_match import writers_for
from stream_app.session import job_description
from stream_app.snapshot.data import (
    DELETED,
    ERROR,
    LH,
    LK,
    OFFSET,
    PARTITION,
    RANK,
    TOPIC,
    RecordFormats,
    SnapshotView,
    apply_changes,
    arrow_schema,
    below,
    dedupe_last,
    fill_unavailable,
    latest_per_key,
    nullable_schema,
    nullable_table,
    record_decoder,
    unavailable_columns,
)
from stream_app.snapshot.delta import DriverDecoder, simple_key_field, supported_schema
from stream_app.snapshot.engines import DeadLetterProducer, SnapshotBase
from stream_app.snapshot.versioned import TS, VersionedStore

log = logging.getLogger(__name__)


def _covers(upto: Mapping[str, Mapping[int, int]], base: Mapping[str, Mapping[int, int]]) -> bool:
    return all(upto.get(t, {}).get(p, 0) >= o for t, parts in base.items() for p, o in parts.items())


class Snapshot:
    """One GlobalKTable-like snapshot of compacted topics (see module docstring).

    Args:
        spark: the SparkSession.
        kafka: the pipeline's Kafka config.
        plan: the snapshot's config and schemas.
        writers: returns the known writer schemas (fingerprint -> JSON).
        watermarks: end offsets of the topics.
        checkpoint: where its checkpoints go, or ``None``.
        dead_letters: where undecodable records go.
        job: the job's name (metric label).
        headers: returns the registry's Confluent prefixes -> single-object headers
            (``key_format``/``value_format: confluent_avro``).
    """

    def __init__(
        self,
        spark: Any,
        kafka: KafkaConfig,
        plan: SnapshotPlan,
        writers: Callable[[], dict[bytes, str]],
        watermarks: TopicWatermarks,
        checkpoint: SnapshotCheckpoint | None,
        dead_letters: DeadLetterProducer,
        job: str = "stream",
        headers: Callable[[], Mapping[bytes, bytes]] | None = None,
    ):
        self.spark, self.kafka, self.plan, self.writers = spark, kafka, plan, writers
        self.headers = headers or dict
        self.cfg = plan.config
        self.debezium = self.cfg.envelope == "debezium"
        self._unavailable = unavailable_columns(plan.value.spark_type) if self.debezium else []
        self.name = self.cfg.name
        self.watermarks, self.checkpoint, self.dead_letters = watermarks, checkpoint, dead_letters
        self.rank = {t: i for i, t in enumerate(self.cfg.topics)}
        self.value_names = list(plan.value.spark_type.fieldNames())
        self.offsets: Offsets = {}
        self.base_offsets: Offsets = {}
        self.caught_up_at = 0.0  # epoch seconds at which the snapshot was known to reach the end offsets
        self.base = SnapshotBase(spark, self.cfg, self.value_names, self._empty_base(), checkpoint)
        self._log: pa.Table | None = None
        self._view: SnapshotView | None = None
        self._last_checkpoint: tuple[float, dict[str, dict[int, int]] | None] = (time.monotonic(), None)
        self._checkpoint_thread: threading.Thread | None = None
        self._ranges = RangeReader(kafka)
        self._decoder: tuple[frozenset[bytes], Callable[[Any], Any]] | None = None
        self._driver: tuple[frozenset[bytes], DriverDecoder] | None = None
        self._log_schema: pa.Schema | None = None
        # who decoded the last read (a refresh, or a bootstrap from the topics): "driver" (fastavro) or "spark"
        self.decoded_by = ""
        self._metrics = metrics.snapshot_metrics(job, self.name, lambda: time.time() - self.caught_up_at)
        self.versions: VersionedStore | None = None  # with ``retention``: the versions of as-of lookups
        if self.cfg.retention_ms is not None:
            self.versions = VersionedStore(
                spark, kafka, self.name, self.cfg.retention_ms, plan.value.spark_type, self._versions_decoder,
                self.base.store.partitions, self.cfg.broadcast_max_rows, checkpoint, plan.schema_id,
            )

    # -- reading Kafka ------------------------------------------------------------------------

    def _relevant_writers(self) -> dict[bytes, str]:
        """The known writer schemas that resolve to the key or the value reader schema (fingerprint -> JSON)."""
        writers = self.writers()
        avro_keys = self.cfg.key_format in ("avro", "confluent_avro")
        keys = writers_for(writers, self.plan.key.avro) if avro_keys else {}
        if self.cfg.value_format == "connect_json":
            return keys
        value = self.plan.envelope if self.plan.envelope is not None else self.plan.value
        return {**keys, **writers_for(writers, value.avro)}

    def _formats(self, relevant: Mapping[bytes, str]) -> RecordFormats:
        """How the records are framed; the registry ids of the relevant writer schemas."""
        return RecordFormats(
            value_format=self.cfg.value_format,
            headers={p: h for p, h in self.headers().items() if h[2:] in relevant} if self.cfg.registry_formats
            else {},
            debezium=self.debezium,
            envelope_json=self.plan.envelope.json if self.plan.envelope is not None else None,
            value_type=self.plan.value.spark_type,
        )

    def _decode(self, raw: Any) -> Any:
        relevant = self._relevant_writers()
        formats = self._formats(relevant)
        known = frozenset([*relevant, *formats.headers])
        if self._decoder is None or self._decoder[0] != known:
            decode = record_decoder(
                relevant,
                self.plan.key.json,
                self.plan.value.json,
                self.plan.key.spark_type,
                self.rank,
                self.cfg.key_format,
                formats=formats,
            )
            self._decoder = (known, decode)
        return self._decoder[1](raw)

    def _versions_decoder(self) -> Callable[[Any], Any]:
        """The record decoder of the versioned store: the snapshot's, carrying the records' time (``__ts``)."""
        relevant = self._relevant_writers()
        return record_decoder(relevant, self.plan.key.json, self.plan.value.json, self.plan.key.spark_type,
                              self.rank, self.cfg.key_format, carry=(TS,), formats=self._formats(relevant))

    def _previous_rows(self, keys: list[str]) -> dict[str, dict[str, Any] | None]:
        """The snapshot's current rows of ``keys`` (overlay over base), for Debezium's TOASTed columns."""
        from pyspark.sql import functions as f

        found: dict[str, dict[str, Any] | None] = {}
        if self.base.table is not None:
            base = self.base.table.filter(pc.is_in(self.base.table.column(LK), value_set=pa.array(keys, pa.string())))
        elif self.base.df is not None:  # partitioned: the few keys' rows from the executors
            base = self.base.df.filter(f.col(LK).isin(keys)).toArrow()
        else:
            base = None
        if base is not None:
            for row in base.to_pylist():
                found[row[LK]] = row
        if self._log is not None and self._log.num_rows:
            overlay = self._log.filter(pc.is_in(self._log.column(LK), value_set=pa.array(keys, pa.string())))
            for row in overlay.to_pylist():  # read order: the last row of a key wins
                found[row[LK]] = None if row[DELETED] else row
        return found

    def _empty_base(self) -> pa.Table:
        from pyspark.sql import types as T

        spark_type = T.StructType(
            [T.StructField(LK, T.StringType()), T.StructField(LH, T.LongType()), *self.plan.value.spark_type.fields]
        )
        return nullable_table(arrow_schema(spark_type).empty_table())

    def _dead_letter_errors(self, decoded: Any, stage: str = "snapshot") -> int:
        # not a filter, which Spark pushed below the decode: every record decoded again per check of the reason
        bad = rows_where(decoded, decoded[ERROR].isNotNull(), [TOPIC, PARTITION, OFFSET, ERROR, "key", "value"])
        return self.dead_letters.send(bad.toArrow(), stage)

    def _empty_log(self) -> pa.Table:
        """An empty overlay log table: ``__lk, __lh, __deleted, __topic, __partition, __offset`` + values."""
        if self._log_schema is None:
            base = list(self._empty_base().schema)
            extra = [(DELETED, pa.bool_()), (TOPIC, pa.string()), (PARTITION, pa.int32()), (OFFSET, pa.int64())]
            self._log_schema = nullable_schema(pa.schema([*base[:2], *extra, *base[2:]]))
        return self._log_schema.empty_table()

    def _driver_decoder(self) -> DriverDecoder | None:
        """The fastavro decoder of small deltas, ``None`` when the schemas need the JVM's decoding."""
        key_field = simple_key_field(self.plan.key.spark_type)
        if key_field is None or not supported_schema(self.plan.value.avro) or not supported_schema(self.plan.key.avro):
            return None
        if self.debezium or "connect_json" in (self.cfg.key_format, self.cfg.value_format):
            return None  # envelopes and Connect JSON are decoded by the JVM path only
        relevant = self._relevant_writers()
        if self._driver is None or self._driver[0] != frozenset(relevant):
            decoder = DriverDecoder(
                relevant,
                self.plan.key.json,
                self.plan.value.json,
                key_field,
                self._empty_log().schema,
                self.rank,
                self.cfg.key_format,
            )
            self._driver = (frozenset(relevant), decoder)
        return self._driver[1]

    def _read_changes(self, start: Offsets, ends: Offsets, pending: int) -> pa.Table:
        """Records in ``[start, ends)``: the whole log when small, else the latest per key (tombstones kept).

        A few records are read on the driver by one long-lived consumer and
        decoded there by fastavro (:mod:`stream_app.snapshot.delta`: no Spark
        job), or in the JVM when fastavro cannot reproduce Spark's decoding;
        many are read and decoded by Spark.
        """
        from pyspark.sql import Observation
        from pyspark.sql import functions as f

        self.decoded_by = "spark"
        if pending > self.cfg.overlay_max_rows:
            raw = read_range(self.spark, self.kafka, start, ends)
        else:
            records = self._ranges.read(start, ends)
            if records.num_rows:
                records = self._single_object(records)
                decoder = self._driver_decoder()
                table = decoder.decode(records) if decoder is not None else None
                if table is not None:
                    self.decoded_by = "driver"
                    return table
            raw = self.spark.createDataFrame(records) if records.num_rows else None
        if raw is None:  # every offset in the range was compacted away
            return self._empty_log()
        decoded = self._decode(raw)
        if pending > self.cfg.overlay_max_rows:
            seen = Observation(f"snapshot-{self.name}-{uuid.uuid4().hex[:8]}")
            observed = decoded.observe(seen, f.count_if(f.col(ERROR).isNotNull()).alias("errors"))
            changes = latest_per_key(observed, keep_deleted=True, unavailable=self._unavailable, unresolved="keep")
            changes = changes.toArrow()
            if seen.get["errors"]:
                self._dead_letter_errors(decoded)
            order = [(TOPIC, "ascending"), (PARTITION, "ascending"), (OFFSET, "ascending")]
            return self._as_log(changes.sort_by(order))
        rows = decoded.select(LK, LH, DELETED, TOPIC, PARTITION, OFFSET, RANK, ERROR, "key", "value", "__v.*")
        table = rows.toArrow().sort_by([(RANK, "ascending"), (PARTITION, "ascending"), (OFFSET, "ascending")])
        errors = table.column(ERROR).is_valid()
        if pc.any(errors).as_py():
            self.dead_letters.send(table.filter(errors), "snapshot")
            table = table.filter(pc.invert(errors))
        return self._as_log(table)

    def _single_object(self, records: pa.Table) -> pa.Table:
        """Records read on the driver with their Confluent prefixes swapped for single-object headers."""
        if not self.cfg.registry_formats:
            return records
        headers = self.headers()

        def swap(data: bytes | None) -> bytes | None:
            if data is None or len(data) < 5:
                return data
            header = headers.get(bytes(data[:5]))
            return data if header is None else header + data[5:]

        for name in ("key", "value"):
            if f"{name}_format" in self.cfg.registry_formats:
                column = pa.array([swap(v) for v in records.column(name).to_pylist()], records.schema.field(name).type)
                records = records.set_column(records.column_names.index(name), name, column)
        return records

    def _as_log(self, table: pa.Table) -> pa.Table:
        """A table from Spark as an overlay log table (the one schema both decoders give)."""
        schema = self._empty_log().schema
        return table.select(schema.names).cast(schema)

    # -- the base ---------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """The join engine of the current base: ``broadcast``, ``indexed`` or ``partitioned``."""
        return self.base.mode

    @property
    def base_rows(self) -> int:
        """Keys in the base."""
        return self.base.rows

    def _install(
        self, table: pa.Table | None = None, df: Any = None, ipc: bytes | None = None, offsets: Offsets | None = None
    ) -> None:
        self.base.install(table, df, ipc=ipc, offsets=offsets)
        self._view = None

    def _apply_changes(self, changes: pa.Table, offsets: Offsets) -> None:
        self.base.apply(changes, offsets)
        self._view = None

    def merge(self) -> None:
        """Fold the overlay into a new base (the base then covers :attr:`offsets`)."""
        if self._log is not None and self._log.num_rows:
            started = time.monotonic()
            self._apply_changes(dedupe_last(self._log), self.offsets)
            log.info(
                "snapshot=%s merged overlay records=%d keys=%d mode=%s elapsed_s=%.2f",
                self.name,
                self._log.num_rows,
                self.base_rows,
                self.mode,
                time.monotonic() - started,
            )
        self._log = None
        self.base_offsets = {t: dict(p) for t, p in self.offsets.items()}
        self._view = None

    # -- lifecycle ----------------------------------------------------------------------------

    def bootstrap(self) -> dict[str, Any]:
        """The readiness gate: load the snapshot up to the end offsets its topics have now.

        Loads the newest usable checkpoint and reads the topics' tail from its
        offsets, or reads the topics from their earliest offsets. With the
        indexed engine, "loaded" includes the Python workers holding the
        base's index (the pre-load is waited for), so the first micro-batch
        does not pay for it.

        Returns:
            ``keys``, ``source`` (``checkpoint`` | ``topics``), ``records`` read,
            ``elapsed_s``.

        Raises:
            SetupError: a topic is missing or Kafka does not answer.
        """
        with job_description(self.spark, f"threes snapshot {self.name}: bootstrap"):
            return self._bootstrap()

    def _bootstrap(self) -> dict[str, Any]:
        started, now = time.monotonic(), time.time()
        ends = self.watermarks.end_offsets(self.cfg.topics)
        loaded = self._usable_checkpoint(ends)
        if loaded is not None:
            if loaded.table is None:  # a partitioned version: registered (and cached) by the executors
                self.base.restore(loaded)
                self._view = None
            else:
                self._install(loaded.table, ipc=loaded.ipc)
            self.offsets = {t: dict(p) for t, p in loaded.offsets.items() if t in self.rank}
            self.base_offsets = {t: dict(p) for t, p in self.offsets.items()}
            records = self.catch_up(ends, at=now, merge=False)
            source = "checkpoint"
        else:
            records = count_between({}, ends)
            if 0 < records <= self.cfg.overlay_max_rows:
                # a topic no bigger than a refresh: read and decoded the way a refresh is (on the driver, no
                # Spark job when fastavro decodes it), not by a Spark read, decode and window
                changes = self._read_changes({}, ends, records)
                if self.debezium:
                    changes = fill_unavailable(changes, lambda keys: {})
                changes = dedupe_last(changes)
                self._install(apply_changes(self._empty_base(), changes), offsets=ends)  # partitioned: its manifest
            elif (raw := read_range(self.spark, self.kafka, None, ends)) is None:
                self._install(self._empty_base())
            else:
                self._load_all(raw, records, ends)
            self.offsets = {t: dict(p) for t, p in ends.items()}
            self.base_offsets = {t: dict(p) for t, p in ends.items()}
            self.caught_up_at = now
            source = "topics"
        if self.versions is not None:
            self.versions.bootstrap(self.watermarks.start_offsets(self.cfg.topics), self.offsets)
        loaded_at = time.monotonic()
        # part of "loaded": the Python workers hold the base's index before the gate opens (indexed engine)
        self.base.wait_warm()
        elapsed = time.monotonic() - started
        keys = self.live_keys()
        log.info(
            "snapshot=%s ready keys=%d mode=%s source=%s records_read=%d offsets=%s elapsed_s=%.2f "
            "(driver %.2f s, workers' index %.2f s)",
            self.name,
            self.base_rows,
            self.mode,
            source,
            records,
            offsets_json(self.offsets),
            elapsed,
            loaded_at - started,
            elapsed - (loaded_at - started),
        )
        self._update_metrics()
        if source == "topics":
            self.maybe_checkpoint(force=True)
        return {"keys": keys, "source": source, "records": records, "elapsed_s": elapsed}

    def _load_all(self, raw: Any, records: int, ends: Offsets) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as f

        self.decoded_by = "spark"
        decoded = self._decode(raw)
        seen = Observation(f"snapshot-{self.name}-{uuid.uuid4().hex[:8]}")
        # partitioned like the base's buckets: the version is written without another shuffle or sort
        latest = latest_per_key(
            decoded.observe(seen, f.count_if(f.col(ERROR).isNotNull()).alias("errors")),
            partitions=self.base.store.partitions,
            unavailable=self._unavailable,
        )
        if records <= self.cfg.broadcast_max_rows:
            self._install(latest.toArrow())
        else:  # maybe too big to broadcast: built partitioned by the executors (collected only if it is small)
            self._install(df=latest, offsets=ends)
        if seen.get["errors"]:
            log.warning("snapshot=%s has %d undecodable records", self.name, seen.get["errors"])
            self._dead_letter_errors(decoded)

    def _usable_checkpoint(self, ends: Offsets) -> Any:
        """The newest checkpoint if it still describes the topics, else ``None`` (read them all)."""
        if self.checkpoint is None:
            return None
        loaded = self.checkpoint.load()
        if loaded is None:
            return None
        starts = self.watermarks.start_offsets(self.cfg.topics)
        for topic, parts in loaded.offsets.items():
            for partition, offset in parts.items():
                low = starts.get(topic, {}).get(partition, 0)
                high = ends.get(topic, {}).get(partition, 0)
                if not low <= offset <= high:
                    log.warning(
                        "snapshot=%s checkpoint offset %s[%d]=%d outside [%d, %d]: reading the topics",
                        self.name,
                        topic,
                        partition,
                        offset,
                        low,
                        high,
                    )
                    return None
        age = time.time() - loaded.written_at
        retention = self._tombstone_retention_s()
        if retention is not None and age >= retention:
            log.warning(
                "snapshot=%s checkpoint is %.0f s old, past delete.retention.ms (%.0f s): tombstones may "
                "be gone, reading the topics",
                self.name,
                age,
                retention,
            )
            return None
        return loaded

    def _tombstone_retention_s(self) -> float | None:
        from kernel.kafka.topics import topic_configs

        values = []
        for topic in self.cfg.topics:
            value = topic_configs(self.kafka.librdkafka_config(), topic).get("delete.retention.ms")
            if value is not None:
                values.append(int(value) / 1000)
        return min(values) if values else None

    def catch_up(self, ends: Offsets | None = None, at: float | None = None, merge: bool = True) -> int:
        """Read what was written since the last refresh (updates and tombstones) into the overlay.

        Args:
            ends: offsets to read up to; the topics' current end offsets when ``None``.
            at: when ``ends`` were read (epoch seconds), for the age metric.
            merge: fold the overlay into a new base when it is too big.

        Returns:
            How many offsets were read (records, at most).
        """
        at = time.time() if at is None else at
        ends = ends or self.watermarks.end_offsets(self.cfg.topics)
        pending = count_between(self.offsets, ends)
        if pending == 0:  # most micro-batches: no Spark job, nothing to name
            self.caught_up_at = at
            self._update_metrics()
            return 0
        with job_description(self.spark, f"threes snapshot {self.name}: refresh"):
            read = self._read_pending(ends, at, merge, pending)
        if self.versions is not None and self.versions.ready:
            self.versions.catch_up(self.offsets)
        return read

    def _read_pending(self, ends: Offsets, at: float, merge: bool, pending: int) -> int:
        started = time.monotonic()
        # a Debezium delta is merged on the driver: its TOASTed columns need the keys' previous values
        if pending > self.cfg.overlay_max_rows and self.mode == "partitioned" and not self.debezium:
            self._merge_large_delta(ends)
            self._view = None
            self.caught_up_at = at
            self._metrics.refresh.observe(time.monotonic() - started)
            self._update_metrics()
            log.info(
                "snapshot=%s refresh offsets_read=%d merged on the executors keys=%d offsets=%s elapsed_s=%.2f",
                self.name,
                pending,
                self.base_rows,
                offsets_json(self.offsets),
                time.monotonic() - started,
            )
            return pending
        changes = self._read_changes(self.offsets, ends, pending)
        if self.debezium:
            changes = fill_unavailable(changes, self._previous_rows)
        if pending > self.cfg.overlay_max_rows:
            new_offsets = {**self.offsets, **{t: dict(p) for t, p in ends.items()}}
            self.merge()
            self._apply_changes(changes.select([LK, LH, DELETED, *self.value_names]), new_offsets)
            self.offsets = new_offsets
            self.base_offsets = {t: dict(p) for t, p in self.offsets.items()}
        else:
            self._log = changes if self._log is None else pa.concat_tables([self._log, changes])
            self.offsets = {**self.offsets, **{t: dict(p) for t, p in ends.items()}}
            if merge and self._log.num_rows > self.cfg.overlay_max_rows:
                self.merge()
        self._view = None
        self.caught_up_at = at
        elapsed = time.monotonic() - started
        self._metrics.refresh.observe(elapsed)
        self._update_metrics()
        log.info(
            "snapshot=%s refresh records=%d decoded_by=%s overlay=%d keys=%d offsets=%s elapsed_s=%.2f",
            self.name,
            changes.num_rows,
            self.decoded_by,
            self.overlay_rows,
            self.base_rows,
            offsets_json(self.offsets),
            elapsed,
        )
        return pending

    def _merge_large_delta(self, ends: Offsets) -> None:
        """A large delta of a partitioned snapshot: read, decoded and merged by the executors (one new version).

        The overlay (older than the delta) is folded in the same merge: a delta
        row wins over an overlay row of the same key.

        """
        from pyspark.sql import Observation
        from pyspark.sql import functions as f

        raw = read_range(self.spark, self.kafka, self.offsets, ends)
        new_offsets = {**self.offsets, **{t: dict(p) for t, p in ends.items()}}
        if raw is None:  # compacted away
            self.offsets = new_offsets
            return
        decoded = self._decode(raw)
        seen = Observation(f"snapshot-{self.name}-{uuid.uuid4().hex[:8]}")
        observed = decoded.observe(seen, f.count_if(f.col(ERROR).isNotNull()).alias("errors"))
        columns = [LK, LH, DELETED, *self.value_names]
        changes = latest_per_key(observed, keep_deleted=True).select(*columns)
        if self._log is not None and self._log.num_rows:
            older = self.spark.createDataFrame(dedupe_last(self._log).select(columns))
            changes = changes.unionByName(older.join(changes.select(LK), LK, "left_anti"))
        self.base.apply_df(changes, new_offsets)
        if seen.get["errors"]:
            self._dead_letter_errors(decoded)
        self._log = None
        self.offsets = new_offsets
        self.base_offsets = {t: dict(p) for t, p in new_offsets.items()}

    def live_keys(self) -> int:
        """Keys in the snapshot, overlay applied (exact unless partitioned: base + overlay then)."""
        if self._log is None or self._log.num_rows == 0:
            return self.base_rows
        if self.mode == "partitioned":
            return self.base_rows + self._log.num_rows
        return apply_changes(self.base.table, dedupe_last(self._log)).num_rows

    @property
    def overlay_rows(self) -> int:
        """Records in the overlay log."""
        return 0 if self._log is None else self._log.num_rows

    def view(self, upto: Offsets | None = None) -> SnapshotView:
        """The snapshot to join a micro-batch against: now, or as of ``upto`` (a replayed batch).

        When the base is already newer than ``upto`` (its overlay was merged,
        or a restart caught up past it), the current snapshot is given and a
        warning says so.
        """
        self.base.wait_warm()
        if upto is not None and upto != self.offsets:
            if _covers(upto, self.base_offsets):
                overlay = dedupe_last(below(self._log, upto)) if self._log is not None else None
                return self._make_view(upto, overlay)
            log.warning(
                "snapshot=%s replayed batch wanted offsets %s, the base is at %s: joining the current snapshot",
                self.name,
                offsets_json(upto),
                offsets_json(self.base_offsets),
            )
        if self._view is None:
            overlay = dedupe_last(self._log) if self._log is not None else None
            self._view = self._make_view(self.offsets, overlay)
        return self._view

    def _make_view(self, offsets: Offsets, overlay: pa.Table | None) -> SnapshotView:
        return SnapshotView(
            name=self.name,
            key_type=self.plan.key.spark_type,
            value_type=self.plan.value.spark_type,
            offsets={t: dict(p) for t, p in offsets.items()},
            mode=self.mode,
            base_rows=self.base_rows,
            token=self.base.token,
            broadcast=self.base.broadcast,
            base_df=self.base.df,
            overlay=overlay if overlay is not None and overlay.num_rows else None,
            lookup_files=self.base.lookup_folder,
            partitions=self.base.store.partitions,
            versions=self.versions.view() if self.versions is not None else None,
        )

    def maybe_checkpoint(self, force: bool = False, final: bool = False) -> bool:
        """Checkpoint the snapshot (merged, with its offsets) when the interval has passed.

        The driver's Arrow table is written by a background thread (it is
        immutable); a partitioned base is collected first, here.

        Args:
            force: checkpoint now, whatever the interval (unless nothing changed since the last one).
            final: the snapshot is closing: the overlay is folded into the checkpoint's Arrow table
                on the driver instead of into a new base, which would cost a Spark job (a cached
                DataFrame, or a broadcast and the workers' index) for a base nobody joins against.

        Returns:
            Whether a checkpoint was started.
        """
        if self.checkpoint is None:
            return False
        last_at, last_offsets = self._last_checkpoint
        if last_offsets == self.offsets or (not force and time.monotonic() - last_at < self.cfg.checkpoint_interval_s):
            return False
        if self._checkpoint_thread is not None and self._checkpoint_thread.is_alive():
            if not force:
                return False
            self._checkpoint_thread.join()
        if self.mode == "partitioned":  # the executors write it: a merge is a new version with its manifest
            self.merge()
            self._last_checkpoint = (time.monotonic(), {t: dict(p) for t, p in self.base_offsets.items()})
            return True
        if final:
            table = self._merged_table()
            offsets = {t: dict(p) for t, p in self.offsets.items()}
        else:
            self.merge()
            table = self.base.as_arrow()
            offsets = {t: dict(p) for t, p in self.base_offsets.items()}
        self._last_checkpoint = (time.monotonic(), offsets)
        checkpoint = self.checkpoint

        def save() -> None:
            try:
                checkpoint.save(table, offsets)
            except Exception:  # the next interval tries again; a restart without it reads the topics
                log.exception("snapshot=%s checkpoint failed", self.name)

        self._checkpoint_thread = threading.Thread(target=save, name=f"snapshot-checkpoint-{self.name}", daemon=True)
        self._checkpoint_thread.start()
        return True

    def _merged_table(self) -> pa.Table:
        """The base with the overlay applied, as an Arrow table (what :meth:`merge` would install).

        Only a partitioned base costs a Spark job here (it is collected).
        """
        table = self.base.as_arrow()
        if self._log is None or self._log.num_rows == 0:
            return table
        started = time.monotonic()
        merged = nullable_table(apply_changes(table, dedupe_last(self._log)))
        log.info(
            "snapshot=%s overlay records=%d folded into the last checkpoint keys=%d elapsed_s=%.2f",
            self.name,
            self._log.num_rows,
            merged.num_rows,
            time.monotonic() - started,
        )
        return merged

    def wait_checkpoint(self, timeout_s: float | None = None) -> None:
        """Wait for a checkpoint being written."""
        if self._checkpoint_thread is not None:
            self._checkpoint_thread.join(timeout_s)

    def close(self, checkpoint: bool = True) -> None:
        """Write a last checkpoint (optional), wait for it, and release the broadcast/cache."""
        if checkpoint:
            self.maybe_checkpoint(force=True, final=True)
        self.wait_checkpoint()
        self._ranges.close()
        self.base.release()
        if self.versions is not None:
            self.versions.release()

    def _update_metrics(self) -> None:
        self._metrics.keys.set(self.base_rows)
        self._metrics.overlay.set(self.overlay_rows)
