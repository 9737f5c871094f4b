"""The partitioned store: a large snapshot's base held by the executors, partitioned by lookup key.

A snapshot above ``broadcast_max_rows`` keys is never collected to the driver
nor copied into Python workers. Its base is a DataFrame **hash-partitioned by
``__lk`` into P partitions and sorted by ``__lk`` within each**, cached by the
executors (``MEMORY_AND_DISK``). Spark knows that layout (the cached relation
keeps its output partitioning and ordering), so a micro-batch's join shuffles
only the events into the same P partitions and merges them with the base
without sorting or moving it (a sort-merge join whose base side is a scan of
the cache; Kafka Streams co-partitions a KTable join the same way).

**Versions.** With a checkpoint location, every base is also written by the
executors as a *version*: Parquet files bucketed by ``__lk`` into the same P
buckets (Spark's bucketing hashes like its hash partitioning, so each task
writes its own bucket, nothing moves), sorted by ``__lk``, under
``<checkpoint>/snapshots/<name>/p<ms>/data``, with a manifest of the offsets it
covers written last by the driver (:class:`~stream_app.checkpoint.SnapshotCheckpoint`).
The cached base is read back from that version as a bucketed table, so

* a restart (on any host) registers the newest version and caches it: no
  shuffle, no re-read of the topics (only their tail after the manifest's
  offsets);
* a merge of a change set (``base FULL OUTER JOIN changes`` on co-partitioned
  sides: only the changes move) writes the merged rows as the next version
  and reads them back, again without moving the base; without a checkpoint
  location the merged rows are repartitioned instead (a shuffle of the base);
* a lost executor's cached partitions are recomputed from the version's files,
  not from the topics;
* sorted, bucketed Parquet with its offsets is what versioned (as-of) lookups
  and key lookups from outside the job need next: a key's bucket is
  ``pmod(murmur3(__lk), P)``, and its row is found by the Parquet row-group
  statistics of one file.

**Cached or read from the version's files.** When the versions live on a file
system the executors read locally (a ``file:`` path: ``local[*]``, or a
standalone cluster on one host), the base is *not* cached: each micro-batch's
join scans the version's bucketed, sorted Parquet (the operating system's page
cache keeps it in memory). Measured at 2M keys, 50k events per batch: 0.50 s
per join against the files, 0.52 s against the cache. Then a restart only
registers the newest version (seconds, whatever the size), nothing is held in
the executors' storage memory (a 10M-key cache spilled to disk on 1 GB
executors) and a lost executor loses nothing. On object storage or HDFS
(``s3a://``, ``hdfs://``...), where every scan would move the whole base over
the network, the base is cached by the executors as above.

**Lookup files.** On a local file system a version also gets one Arrow IPC
file per bucket sorted by ``__lh``, written from the bucketed version before
its manifest (:mod:`stream_app.snapshot.mapped`); micro-batches then look
their events up in them (memory-mapped by the Python workers) instead of
joining the base (``partitioned_join: lookup``, the default).

The driver holds only the version's path, its offsets and counts.
"""

from __future__ import annotations

import logging
import os
import re
import time
from typing import Any

import pyarrow.fs as pafs

from stream_app.session import job_description
from stream_app.snapshot.data import DELETED, LK
from stream_app.snapshot.mapped import LOOKUP_FOLDER, is_complete, write_lookup_files
from stream_app.spark_checkpoint import default_fs, is_local_path

log = logging.getLogger(__name__)


def _table_name(snapshot: str, version: str) -> str:
    return "threes_snapshot_" + re.sub(r"[^A-Za-z0-9_]", "_", f"{snapshot}_{version}")


class PartitionedStore:
    """The base of one large snapshot on the executors (see module docstring).

    Args:
        spark: the SparkSession.
        name: the snapshot's name.
        partitions: P, the partitions and buckets of the base (use
            ``spark.sql.shuffle.partitions``: the events of a micro-batch are
            shuffled into that many partitions, and Spark moves the side whose
            partitioning does not match).
        columns: the base's columns, in order (``__lk, __lh`` + values).
        versions: where versions are written (a
            :class:`~stream_app.checkpoint.SnapshotCheckpoint`), or ``None``.
    """

    def __init__(
        self,
        spark: Any,
        name: str,
        partitions: int,
        columns: list[str],
        versions: Any = None,
        lookup_files: bool = False,
    ):
        self.spark, self.name, self.partitions, self.columns, self.versions = spark, name, partitions, columns, versions
        # versions on a local file system are read in place each batch; elsewhere the base is cached
        self.cached = versions is None or not is_local_path(versions.spark_folder, default_fs(spark))
        # point lookups need the versions where the Python workers read files: a local file system
        self.lookup_files = lookup_files and not self.cached and isinstance(versions.fs.fs, pafs.LocalFileSystem)
        self.lookup_folder: str | None = None  # the current version's lookup files (a local folder)
        # each bucket of a version is one file, written sorted by ``__lk``: with this setting Spark's bucketed
        # scan reports that order (it checks the one file per bucket), so reading a version back needs no sort
        spark.conf.set("spark.sql.legacy.bucketedTableScan.outputOrdering", "true")
        # versions' timestamps as Parquet's microsecond timestamps (not INT96): what pyarrow reads exactly
        spark.conf.set("spark.sql.parquet.outputTimestampType", "TIMESTAMP_MICROS")
        self.df: Any = None
        self.rows = 0
        self.version: str | None = None  # the version the cached base was read from
        self._table: str | None = None

    # -- building a base ----------------------------------------------------------------------

    def build(self, latest: Any, offsets: Any = None) -> None:
        """Install a new base from the latest row per key (a DataFrame computed by the executors).

        Args:
            latest: ``__lk, __lh`` + values, one row per key, any partitioning.
            offsets: the offsets the base covers (written in the version's manifest).
        """
        self._install(latest.select(*self.columns), offsets, aligned=False)

    def merge(self, changes: Any, offsets: Any = None) -> None:
        """Apply a change set on the executors: changed keys replaced, deleted keys removed.

        Args:
            changes: ``__lk, __deleted`` + the base's columns, one row per key.
            offsets: the offsets the merged base covers.
        """
        from pyspark.sql import functions as f

        if self.df is None:
            live = changes.filter(~f.col(DELETED)).select(*self.columns)
            self._install(live, offsets, aligned=False)
            return
        delta = changes.select(*self.columns, DELETED).repartition(self.partitions, LK)
        b, c = self.df.alias("b"), delta.alias("c")
        joined = b.join(c, f.col(f"b.{LK}") == f.col(f"c.{LK}"), "full_outer")
        from_change = f.col(f"c.{LK}").isNotNull()
        pick = [f.when(from_change, f.col(f"c.{n}")).otherwise(f.col(f"b.{n}")).alias(n) for n in self.columns]
        merged = joined.filter(~from_change | ~f.col(f"c.{DELETED}")).select(*pick)
        # the full outer join keeps both sides' partitions aligned (row i of P holds bucket i's keys), but
        # Spark cannot know that of a coalesced key: writing a version preserves it for free, else reshuffle
        self._install(merged, offsets, aligned=True)

    def _install(self, df: Any, offsets: Any, aligned: bool) -> None:
        from pyspark.sql import Observation
        from pyspark.sql import functions as f

        started = time.monotonic()
        old_df, old_table = self.df, self._table
        if self.versions is not None:
            version = f"p{int(time.time() * 1000):015d}"
            path = self.versions.version_path(version)
            table = _table_name(self.name, version)
            written = Observation(f"version-{self.name}-{version}")
            with job_description(self.spark, f"threes snapshot {self.name}: write version {version}"):
                (
                    df.observe(written, f.count(f.lit(1)).alias("rows"))
                    .write.mode("overwrite")
                    .bucketBy(self.partitions, LK)
                    .sortBy(LK)
                    .format("parquet")
                    .option("path", path)
                    .saveAsTable(table)
                )
            base = self._read_version(table, path)
            if self.cached:
                base.count()  # fill the cache now, not in the first micro-batch
            rows = written.get["rows"]
            self._write_lookup_files(version, base, rows)  # before the manifest: a valid version has them
            self.versions.save_partitioned(version, rows, self.partitions, offsets, base.schema.toDDL())
            self.version, self._table = version, table
        else:
            base = df.repartition(self.partitions, LK).sortWithinPartitions(LK).persist()
            rows = base.count()
            self._table, self.lookup_folder = None, None
        self.df, self.rows = base, rows
        self._release(old_df, old_table)
        log.info(
            "snapshot=%s partitioned base keys=%d partitions=%d version=%s cached=%s elapsed_s=%.2f",
            self.name,
            rows,
            self.partitions,
            self.version,
            self.cached,
            time.monotonic() - started,
        )

    def written_lookup_folder(self, version: str, partitions: int) -> str | None:
        """The folder of a version's lookup files when they are all written (else ``None``)."""
        if not self.lookup_files:
            return None
        folder = os.path.join(self.versions.folder, version, LOOKUP_FOLDER)
        return folder if is_complete(folder, partitions) else None

    def _write_lookup_files(self, version: str, base: Any, rows: int) -> None:
        """Write a version's lookup files (:mod:`stream_app.snapshot.mapped`) and make them the current ones."""
        if not self.lookup_files:
            self.lookup_folder = None
            return
        folder = self.written_lookup_folder(version, self.partitions)
        if folder is None:
            folder = os.path.join(self.versions.folder, version, LOOKUP_FOLDER)
            started = time.monotonic()
            data = os.path.join(self.versions.folder, version, "data")
            with job_description(self.spark, f"threes snapshot {self.name}: lookup files of {version}"):
                written = write_lookup_files(self.spark, data, folder, self.partitions, base.schema)
            if written != rows:
                raise RuntimeError(f"snapshot {self.name} {version}: lookup files hold {written} keys, not {rows}")
            log.info(
                "snapshot=%s lookup files written version=%s keys=%d elapsed_s=%.2f",
                self.name,
                version,
                written,
                time.monotonic() - started,
            )
        self.lookup_folder = folder

    def _read_version(self, table: str, path: str, columns_ddl: str = "") -> Any:
        """A version as a DataFrame partitioned by ``__lk`` (buckets) and sorted, cached or not: no shuffle.

        ``columns_ddl``: its columns (from its manifest) when a restart registers it; ``""`` reads them
        from a footer (versions written before the manifest recorded them).
        """
        catalog = self.spark.catalog
        if not catalog.tableExists(table):  # a restart: the version's files are registered as they are
            columns = columns_ddl or self.spark.read.parquet(path).schema.toDDL()  # a footer, not the rows
            self.spark.sql(
                f"CREATE TABLE `{table}` ({columns}) USING parquet CLUSTERED BY (`{LK}`) SORTED BY (`{LK}`) "
                f"INTO {self.partitions} BUCKETS LOCATION '{path}'"
            )
        base = self.spark.table(table).select(*self.columns).sortWithinPartitions(LK)
        return base.persist() if self.cached else base

    def restore(self, version: str, path: str, rows: int, partitions: int, columns_ddl: str = "") -> None:
        """Install a version written earlier (a restart): registered as a bucketed table (and cached).

        Args:
            version: the version's name.
            path: its data folder (a Spark path).
            rows: keys it holds (from its manifest).
            partitions: its buckets; the store takes them as P.
            columns_ddl: its columns as Spark DDL (from its manifest); ``""``: read from a footer.
        """
        started = time.monotonic()
        self.partitions = partitions
        table = _table_name(self.name, version)
        old_df, old_table = self.df, self._table
        base = self._read_version(table, path, columns_ddl)
        self.df, self.rows, self.version, self._table = base, base.count() if self.cached else rows, version, table
        if self.rows != rows:
            log.warning("snapshot=%s version %s: %d keys, manifest %d", self.name, version, self.rows, rows)
        self._write_lookup_files(version, base, rows)  # written with the version; only older versions lack them
        self._release(old_df, old_table)
        log.info(
            "snapshot=%s restored partitioned base keys=%d partitions=%d version=%s cached=%s elapsed_s=%.2f",
            self.name,
            self.rows,
            partitions,
            version,
            self.cached,
            time.monotonic() - started,
        )

    def _release(self, df: Any, table: str | None) -> None:
        if df is not None:
            df.unpersist()
        if table is not None:
            self.spark.sql(f"DROP TABLE IF EXISTS `{table}`")  # external: the files stay until cleaned up

    def release(self) -> None:
        """Uncache the base (its version's files stay: they are the checkpoint)."""
        self._release(self.df, self._table)
        self.df, self._table, self.lookup_folder = None, None, None
