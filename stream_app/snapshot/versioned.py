"""A versioned snapshot: per key, the versions of the last ``retention``, for as-of (temporal) lookups.

A snapshot with ``retention`` keeps, beside its latest value per key, a
**versions table**: one row per version with its validity interval
``[__from, __to)`` in epoch milliseconds (``__to`` null while the version is
current). A version starts at its state record's *source timestamp*: the
``threes.source_ts`` header the sources stamp (the commit or read time), or,
for a record without one, its Kafka record timestamp. Per key, versions are
ordered by that time (ties: the record read last wins, as in the snapshot).
A tombstone ends the interval of the version before it and starts none.

A lookup with ``as_of: <column>`` joins the version valid at the event's time
``t``: an equi-join on the lookup key plus ``__from <= t AND (__to IS NULL OR
t < __to)``; intervals of a key never overlap, so an event matches at most one
version (no aggregation). Spark keeps it a broadcast hash join with a
condition while the table is small (``broadcast_max_rows``) and a sort-merge
join above, where the versions are read as Parquet bucketed by ``__lk`` (only
the events move). The same join runs whatever engine the snapshot's latest
values use: the indexed and lookup-file engines of the Python workers fall
back to it for ``as_of`` lookups.

**Retention** is counted back from the snapshot's *stream time*, the newest
source timestamp it has read (Kafka Streams' versioned stores count their
history retention the same way, KIP-889): a version that ended before
``stream time - retention`` is dropped, and an event older than that gets no
version (null with ``how: left``, dropped with ``inner``), counted in
``threes_stream_as_of_too_old_total``. Stream time depends only on the records
read, so the same events joined against the same offsets give the same rows.

**Late reference data** (an event that arrives before the version it should
see): by default, unlike Flink's event-time temporal join, which holds events
back until the watermark of the versioned table passes them, an event is
joined when its micro-batch runs, against the versions read up to the offsets
recorded for that batch; an event newer than every version of its key gets the
current one. A version written later with an earlier source timestamp changes
what later events see, not what was emitted (the processing-time policy of
Kafka Streams' stream-table join against a versioned store without a grace
period, KIP-914). A lookup's ``wait_for_reference`` bound makes the micro-batch
wait, before it records its offsets, until the snapshot's stream time reaches
the batch's newest event time or the bound passes
(:meth:`stream_app.job.StreamJob._wait_for_references`).

**Where versions live.** The table is computed by the executors and written,
per refresh that changed it, as Parquet bucketed by ``__lk`` (and sorted by
``__lk, __from``) under ``<checkpoint>/snapshots/<name>/versions/<v>/data``
with a manifest of the offsets and stream time it covers, written last: a
restart registers the newest one and reads only the topics' tail, even after
compaction removed the old records from the topics. The driver holds the
manifest only. A refresh re-sorts only the keys it touched (their stored
intervals become records again, merged with the new ones).

The intervals are computed by :mod:`stream_app.snapshot.version_intervals`, the
as-of join by :mod:`stream_app.snapshot.as_of_join`; this module holds the store.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from stream_app.checkpoint import replaced_topics
from stream_app.kafka_io import Offsets, offsets_json, parse_offsets, read_range
from stream_app.session import job_description
from stream_app.snapshot.as_of_join import VersionsView
from stream_app.snapshot.data import DELETED, ERROR, LK, OFFSET, PARTITION, RANK
from stream_app.snapshot.version_intervals import FROM, TO, TS, merge_versions, record_time

log = logging.getLogger(__name__)


def _f() -> Any:
    from pyspark.sql import functions

    return functions


def _table_name(snapshot: str, version: str) -> str:
    return "threes_versions_" + re.sub(r"[^A-Za-z0-9_]", "_", f"{snapshot}_{version}")


class VersionedStore:
    """The versions table of one snapshot, kept in step with the snapshot's offsets (see module docstring).

    Args:
        spark: the SparkSession.
        kafka: the pipeline's Kafka config.
        name: the snapshot's name.
        retention_ms: how far back versions reach, ms.
        value_type: the Spark type of the value fields (a ``StructType``).
        decoder: returns the snapshot's record decoder that carries ``__ts``
            (:func:`~stream_app.snapshot.decoding.record_decoder` with ``carry``).
        partitions: buckets of the written table.
        broadcast_max_rows: up to this many versions the table is joined by broadcast.
        checkpoint: the snapshot's :class:`~stream_app.checkpoint.SnapshotCheckpoint`, or ``None``
            (the table is then kept cached by the executors, and lost on restart).
        schema_id: identity of the snapshot's schemas (a manifest of others is ignored).
        read_only: load from the checkpoint but never write it (``threes query`` beside a running
            job): newer records are merged into a table the executors cache.
    """

    def __init__(
        self,
        spark: Any,
        kafka: Any,
        name: str,
        retention_ms: int,
        value_type: Any,
        decoder: Callable[[], Callable[[Any], Any]],
        partitions: int,
        broadcast_max_rows: int,
        checkpoint: Any = None,
        schema_id: str = "",
        read_only: bool = False,
    ):
        self.spark, self.kafka, self.name = spark, kafka, name
        self.retention_ms, self.value_type, self.decoder = retention_ms, value_type, decoder
        self.value_columns = list(value_type.fieldNames())
        self.partitions, self.broadcast_max_rows = partitions, broadcast_max_rows
        self.checkpoint, self.schema_id, self.read_only = checkpoint, schema_id, read_only
        self.offsets: Offsets = {}
        self.stream_time_ms: int | None = None
        self.df: Any = None
        self.rows = 0
        self.version: str | None = None
        self.source = ""  # where the last bootstrap came from: "checkpoint" or "topics"
        self.ready = False  # bootstrapped: refreshes follow the snapshot's
        self._table: str | None = None
        self._view: VersionsView | None = None

    # -- paths ----------------------------------------------------------------------------------

    def _folder(self) -> str:
        return f"{self.checkpoint.folder}/versions"

    def _spark_folder(self) -> str:
        return f"{self.checkpoint.spark_folder}/versions"

    @property
    def horizon_ms(self) -> int | None:
        """Events older than this (epoch ms) get no version; ``None`` before any record."""
        return None if self.stream_time_ms is None else self.stream_time_ms - self.retention_ms

    # -- lifecycle -------------------------------------------------------------------------------

    def bootstrap(self, starts: Offsets, ends: Offsets) -> None:
        """Load the newest written table whose offsets the topics still hold, then read up to ``ends``.

        Args:
            starts: the topics' first offsets.
            ends: the offsets to read up to (the snapshot's, after its own bootstrap).
        """
        manifest = self._newest_manifest()
        usable = manifest is not None and all(
            starts.get(t, {}).get(p, 0) <= o <= ends.get(t, {}).get(p, 0)
            for t, parts in manifest["offsets_parsed"].items()
            for p, o in parts.items()
        )
        if manifest is not None and usable:
            self._register(manifest["version"], manifest["path"], manifest.get("columns", ""))
            self.rows = int(manifest["rows"])
            self.offsets = manifest["offsets_parsed"]
            self.stream_time_ms = manifest.get("stream_time_ms")
            self.source = "checkpoint"
        else:
            self.source = "topics"
        self.catch_up(ends)
        self.ready = True
        log.info("snapshot=%s versions ready rows=%d source=%s stream_time_ms=%s offsets=%s", self.name, self.rows,
                 self.source, self.stream_time_ms, offsets_json(self.offsets))

    def catch_up(self, ends: Offsets) -> int:
        """Read the records in ``[offsets, ends)`` and merge them into the versions table.

        Returns:
            Records read (0 when nothing was new).
        """
        from pyspark.sql import functions as f

        raw = read_range(self.spark, self.kafka, self.offsets, ends, headers=True)
        target = {**self.offsets, **{t: dict(p) for t, p in ends.items()}}
        if raw is None:
            self.offsets = target
            return 0
        started = time.monotonic()
        with job_description(self.spark, f"threes snapshot {self.name}: versions"):
            decoded = self.decoder()(raw.select("*", record_time().alias(TS)))
            records = (
                decoded.filter(f.col(ERROR).isNull())  # dead-lettered by the snapshot itself
                .select(LK, TS, DELETED, RANK, PARTITION, OFFSET, "__v.*")
                .persist()
            )
            summary = records.agg(f.count(f.lit(1)).alias("n"), f.max(TS).alias("newest")).collect()[0]
            if summary["n"]:
                newest = summary["newest"]
                self.stream_time_ms = newest if self.stream_time_ms is None else max(self.stream_time_ms, newest)
                merged = merge_versions(self.df, records, self.value_columns, self.horizon_ms)
                self._install(merged, target)
            records.unpersist()
        self.offsets = target
        self._view = None
        log.info("snapshot=%s versions refresh records=%d rows=%d stream_time_ms=%s elapsed_s=%.2f", self.name,
                 summary["n"], self.rows, self.stream_time_ms, time.monotonic() - started)
        return int(summary["n"])

    def view(self) -> VersionsView:
        """What the next micro-batch's ``as_of`` lookups join."""
        if self._view is None:
            df = self.df
            if df is None:  # nothing read yet: an empty table of the right columns
                df = self._empty()
            self._view = VersionsView(df, self.rows, self.horizon_ms, self.rows <= self.broadcast_max_rows)
        return self._view

    def release(self) -> None:
        """Uncache the table (its files stay: they are the checkpoint)."""
        self._release(self.df, self._table)
        self.df, self._table = None, None

    # -- the table -------------------------------------------------------------------------------

    def _empty(self) -> Any:
        from pyspark.sql import types as T

        return self.spark.createDataFrame([], T.StructType([
            T.StructField(LK, T.StringType()), T.StructField(FROM, T.LongType()), T.StructField(TO, T.LongType()),
            *self.value_type.fields,
        ]))

    def _install(self, merged: Any, offsets: Offsets) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as f

        old_df, old_table = self.df, self._table
        layout = merged.repartition(self.partitions, LK)
        written = Observation(f"versions-{self.name}-{time.monotonic_ns()}")
        if self.checkpoint is None or self.read_only:  # cached only: queries read it with Spark, not files
            df = layout.sortWithinPartitions(LK, FROM).observe(written, f.count(f.lit(1)).alias("rows"))
            df = df.persist()
            df.count()
            self.df, self.rows, self.version = df, int(written.get["rows"]), None
            self._release(old_df, None)
            return
        version = f"v{int(time.time() * 1000):015d}"
        path = f"{self._spark_folder()}/{version}/data"
        table = _table_name(self.name, version)
        (
            layout.observe(written, f.count(f.lit(1)).alias("rows"))
            .write.mode("overwrite")
            .bucketBy(self.partitions, LK)
            .sortBy(LK, FROM)
            .format("parquet")
            .option("path", path)
            .saveAsTable(table)
        )
        rows = int(written.get["rows"])
        df = self.spark.table(table)
        self._table, self.version, self.rows = table, version, rows
        self.df = df.persist() if rows <= self.broadcast_max_rows else df
        manifest = {
            "format": "versions",
            "offsets": json.loads(offsets_json(offsets)),
            "stream_time_ms": self.stream_time_ms,
            "rows": rows,
            "partitions": self.partitions,
            "columns": df.schema.toDDL(),
            "schema_id": self.schema_id,
            "topic_ids": self.checkpoint.topic_ids,
            "written_at": time.time(),
        }
        self.checkpoint.fs.write_atomic(f"{self._folder()}/{version}/_manifest.json", json.dumps(manifest).encode())
        self._release(old_df, old_table)
        self._clean_up(keep=version)

    def _register(self, version: str, path: str, columns_ddl: str) -> None:
        table = _table_name(self.name, version)
        if not self.spark.catalog.tableExists(table):
            columns = columns_ddl or self.spark.read.parquet(path).schema.toDDL()
            self.spark.sql(
                f"CREATE TABLE `{table}` ({columns}) USING parquet CLUSTERED BY (`{LK}`) SORTED BY (`{LK}`, `{FROM}`) "
                f"INTO {self.partitions} BUCKETS LOCATION '{path}'"
            )
        self.df, self._table, self.version = self.spark.table(table), table, version

    def _newest_manifest(self) -> dict[str, Any] | None:
        if self.checkpoint is None:
            return None
        fs = self.checkpoint.fs
        for version in sorted(fs.children(self._folder()), reverse=True):
            raw = fs.read(f"{self._folder()}/{version}/_manifest.json")
            if raw is None:
                continue
            manifest = json.loads(raw)
            if manifest.get("schema_id") != self.schema_id:
                return None
            if replaced_topics(manifest.get("topic_ids") or {}, self.checkpoint.topic_ids):
                log.warning("snapshot=%s versions %s were written for topics deleted and created again since: "
                            "not used", self.name, version)
                return None
            manifest["offsets_parsed"] = parse_offsets(json.dumps(manifest["offsets"]))
            manifest["version"] = version
            manifest["path"] = f"{self._spark_folder()}/{version}/data"
            self.partitions = int(manifest["partitions"])
            return manifest
        return None

    def _clean_up(self, keep: str) -> None:
        """Delete written tables older than the previous one (a reader may still scan it)."""
        fs = self.checkpoint.fs
        versions = sorted(v for v in fs.children(self._folder()) if v[:1] == "v" and v[1:].isdigit())
        for old in versions[:-2]:
            if old != keep:
                fs.delete(f"{self._folder()}/{old}")

    def _release(self, df: Any, table: str | None) -> None:
        if df is not None:
            df.unpersist()
        if table is not None:
            self.spark.sql(f"DROP TABLE IF EXISTS `{table}`")  # external: the files stay until cleaned up


