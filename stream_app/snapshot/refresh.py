"""Catching a live snapshot up: the changes written since its offsets read into its overlay, or merged.

:class:`SnapshotRefresh` is the part of :class:`~stream_app.snapshot.runtime.Snapshot`
that runs before every micro-batch: :meth:`SnapshotRefresh.catch_up` reads only
the new offset ranges ``[offsets, end offsets)``. A few records join the
overlay log on the driver (merged into a new base past ``overlay_max_rows``);
a larger delta is kept as the latest per key and merged into a new base at
once, by the executors for a partitioned snapshot without reaching the driver.
A Debezium delta's unavailable-value placeholders take the key's previous
values (:func:`~stream_app.snapshot.arrow_tables.fill_unavailable`), looked up
in the overlay over the base.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from kernel.config.models import KafkaConfig
from stream_app.kafka_io import Offsets, TopicWatermarks, count_between, offsets_json, read_range
from stream_app.metrics import SnapshotMetrics
from stream_app.session import job_description
from stream_app.snapshot.arrow_tables import dedupe_last, fill_unavailable
from stream_app.snapshot.data import DELETED, ERROR, LH, LK, latest_per_key
from stream_app.snapshot.engines import SnapshotBase
from stream_app.snapshot.reading import ChangeReader
from stream_app.snapshot.versioned import VersionedStore
from stream_app.snapshot.view import SnapshotView
from stream_app.snapshot_config import SnapshotConfig

log = logging.getLogger(__name__)


class SnapshotRefresh:
    """The refresh of a :class:`~stream_app.snapshot.runtime.Snapshot`, which holds the state it reads and sets."""

    spark: Any
    kafka: KafkaConfig
    cfg: SnapshotConfig
    name: str
    debezium: bool
    value_names: list[str]
    watermarks: TopicWatermarks
    reader: ChangeReader
    base: SnapshotBase
    versions: VersionedStore | None
    offsets: Offsets
    base_offsets: Offsets
    caught_up_at: float
    _log: pa.Table | None
    _view: SnapshotView | None
    _metrics: SnapshotMetrics

    if TYPE_CHECKING:  # defined by Snapshot

        @property
        def mode(self) -> str:
            """The join engine of the current base."""

        @property
        def base_rows(self) -> int:
            """Keys in the base."""

        @property
        def overlay_rows(self) -> int:
            """Records in the overlay log."""

        @property
        def decoded_by(self) -> str:
            """Who decoded the last read: ``driver`` or ``spark``."""

        def merge(self) -> None:
            """Fold the overlay into a new base."""

        def _apply_changes(self, changes: pa.Table, offsets: Offsets) -> None: ...

        def _update_metrics(self) -> None: ...

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
        changes = self.reader.read_changes(self.offsets, ends, pending)
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
        decoded = self.reader.decode(raw)
        seen = Observation(f"snapshot-{self.name}-{uuid.uuid4().hex[:8]}")
        observed = decoded.observe(seen, f.count_if(f.col(ERROR).isNotNull()).alias("errors"))
        columns = [LK, LH, DELETED, *self.value_names]
        changes = latest_per_key(observed, keep_deleted=True).select(*columns)
        if self._log is not None and self._log.num_rows:
            older = self.spark.createDataFrame(dedupe_last(self._log).select(columns))
            changes = changes.unionByName(older.join(changes.select(LK), LK, "left_anti"))
        self.base.apply_df(changes, new_offsets)
        if seen.get["errors"]:
            self.reader.dead_letter_errors(decoded)
        self._log = None
        self.offsets = new_offsets
        self.base_offsets = {t: dict(p) for t, p in new_offsets.items()}
