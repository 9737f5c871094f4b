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

The reading and decoding of offset ranges is :mod:`stream_app.snapshot.reading`,
the refresh before each micro-batch :mod:`stream_app.snapshot.refresh`, the
checkpoint schedule :mod:`stream_app.snapshot.checkpoints`.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from kernel.config.models import KafkaConfig
from stream_app import metrics
from stream_app.checkpoint import SnapshotCheckpoint
from stream_app.kafka_io import Offsets, TopicWatermarks, count_between, offsets_json, read_range
from stream_app.plan.model import SnapshotPlan
from stream_app.session import job_description
from stream_app.snapshot.arrow_tables import (
    apply_changes,
    below,
    dedupe_last,
    fill_unavailable,
    nullable_table,
)
from stream_app.snapshot.checkpoints import CheckpointSchedule
from stream_app.snapshot.data import (
    ERROR,
    latest_per_key,
)
from stream_app.snapshot.engines import DeadLetterProducer, SnapshotBase
from stream_app.snapshot.reading import ChangeReader
from stream_app.snapshot.refresh import SnapshotRefresh
from stream_app.snapshot.versioned import VersionedStore
from stream_app.snapshot.view import SnapshotView

log = logging.getLogger(__name__)


def _covers(upto: Mapping[str, Mapping[int, int]], base: Mapping[str, Mapping[int, int]]) -> bool:
    return all(upto.get(t, {}).get(p, 0) >= o for t, parts in base.items() for p, o in parts.items())


class Snapshot(SnapshotRefresh):
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
        self.name = self.cfg.name
        self.watermarks, self.checkpoint, self.dead_letters = watermarks, checkpoint, dead_letters
        self.reader = ChangeReader(spark, kafka, plan, writers, dead_letters, headers)
        self.rank = self.reader.rank
        self.value_names = list(plan.value.spark_type.fieldNames())
        self.offsets: Offsets = {}
        self.base_offsets: Offsets = {}
        self.caught_up_at = 0.0  # epoch seconds at which the snapshot was known to reach the end offsets
        self.base = SnapshotBase(spark, self.cfg, self.value_names, self.reader.empty_base(), checkpoint)
        self._log: pa.Table | None = None
        self._view: SnapshotView | None = None
        self.checkpoints = CheckpointSchedule(kafka, self.cfg, watermarks, checkpoint)
        self._metrics = metrics.snapshot_metrics(job, self.name, lambda: time.time() - self.caught_up_at)
        self.versions: VersionedStore | None = None  # with ``retention``: the versions of as-of lookups
        if self.cfg.retention_ms is not None:
            self.versions = VersionedStore(
                spark, kafka, self.name, self.cfg.retention_ms, plan.value.spark_type, self.reader.versions_decoder,
                self.base.store.partitions, self.cfg.broadcast_max_rows, checkpoint, plan.schema_id,
            )

    @property
    def decoded_by(self) -> str:
        """Who decoded the last read (a refresh, or a bootstrap from the topics): ``driver`` (fastavro) or ``spark``."""
        return self.reader.decoded_by

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
        loaded = self.checkpoints.usable(ends)
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
                changes = self.reader.read_changes({}, ends, records)
                if self.debezium:
                    changes = fill_unavailable(changes, lambda keys: {})
                changes = dedupe_last(changes)
                # partitioned: its manifest
                self._install(apply_changes(self.reader.empty_base(), changes), offsets=ends)
            elif (raw := read_range(self.spark, self.kafka, None, ends)) is None:
                self._install(self.reader.empty_base())
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

        self.reader.decoded_by = "spark"
        decoded = self.reader.decode(raw)
        seen = Observation(f"snapshot-{self.name}-{uuid.uuid4().hex[:8]}")
        # partitioned like the base's buckets: the version is written without another shuffle or sort
        latest = latest_per_key(
            decoded.observe(seen, f.count_if(f.col(ERROR).isNotNull()).alias("errors")),
            partitions=self.base.store.partitions,
            unavailable=self.reader.unavailable,
        )
        if records <= self.cfg.broadcast_max_rows:
            self._install(latest.toArrow())
        else:  # maybe too big to broadcast: built partitioned by the executors (collected only if it is small)
            self._install(df=latest, offsets=ends)
        if seen.get["errors"]:
            log.warning("snapshot=%s has %d undecodable records", self.name, seen.get["errors"])
            self.reader.dead_letter_errors(decoded)

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
        if not self.checkpoints.due(self.offsets, force):
            return False
        if self.mode == "partitioned":  # the executors write it: a merge is a new version with its manifest
            self.merge()
            self.checkpoints.written(self.base_offsets)
            return True
        if final:
            table = self._merged_table()
            offsets = {t: dict(p) for t, p in self.offsets.items()}
        else:
            self.merge()
            table = self.base.as_arrow()
            offsets = {t: dict(p) for t, p in self.base_offsets.items()}
        self.checkpoints.save_in_background(table, offsets)
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
        self.checkpoints.wait(timeout_s)

    def close(self, checkpoint: bool = True) -> None:
        """Write a last checkpoint (optional), wait for it, and release the broadcast/cache."""
        if checkpoint:
            self.maybe_checkpoint(force=True, final=True)
        self.wait_checkpoint()
        self.reader.close()
        self.base.release()
        if self.versions is not None:
            self.versions.release()

    def _update_metrics(self) -> None:
        self._metrics.keys.set(self.base_rows)
        self._metrics.overlay.set(self.overlay_rows)
