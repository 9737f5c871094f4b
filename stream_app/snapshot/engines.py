"""Where a snapshot's base lives, by its size: the join engines' side of the snapshot.

* ``broadcast`` (up to ``broadcast_max_rows`` keys): a small cached DataFrame,
  joined by Spark's broadcast hash join (Spark broadcasts it again for every
  micro-batch, which costs little at this size).
* ``partitioned`` (above): the base stays on the executors, hash-partitioned
  and sorted by lookup key, versioned in the checkpoint location
  (:mod:`stream_app.snapshot.partitioned`); the driver never holds its rows.
  Each version on a local file system also gets lookup files that the Python
  workers memory-map and search per event (:mod:`stream_app.snapshot.mapped`).
* ``indexed`` (opt-in, from ``index_min_rows`` keys up to ``broadcast_max_rows``):
  an Arrow IPC broadcast variable, shipped once per base and indexed by each
  Python worker (:mod:`stream_app.snapshot.indexed`); pre-loaded into the
  workers in the background.

The driver keeps the Arrow table of the broadcast and indexed engines: merges apply change sets
to it and checkpoints write it. Also here: the producer of the snapshot's dead
letters.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import pyarrow as pa

from kernel.config.models import KafkaConfig
from kernel.dlq import DeadLetter, dead_letter_limit
from kernel.exceptions import RetriableError
from kernel.kafka import clients
from stream_app.session import job_description
from stream_app.snapshot.arrow_tables import apply_changes, ipc_bytes, nullable_table
from stream_app.snapshot.data import DELETED, ERROR, LH, LK, OFFSET, PARTITION, TOPIC
from stream_app.snapshot.indexed import ArrowLookup, warm_udf_function
from stream_app.snapshot.mapped import MappedLookup
from stream_app.snapshot.mapped import warm_udf_function as mapped_warm_udf_function
from stream_app.snapshot.partitioned import PartitionedStore
from stream_app.snapshot_config import SnapshotConfig

log = logging.getLogger(__name__)


class SnapshotBase:
    """The base of one snapshot, in the engine its size calls for.

    Args:
        spark: the SparkSession.
        config: the snapshot's config (thresholds, partitions).
        value_names: the value columns (after ``__lk, __lh``).
        empty: an empty table of the base's schema.
        versions: where a partitioned base writes its versions (the snapshot's
            :class:`~stream_app.checkpoint.SnapshotCheckpoint`), or ``None``.
    """

    def __init__(
        self, spark: Any, config: SnapshotConfig, value_names: list[str], empty: pa.Table, versions: Any = None
    ):
        self.spark, self.config, self.value_names, self.empty = spark, config, value_names, empty
        self.mode = "broadcast"
        self.rows = 0
        self.table: pa.Table | None = None  # broadcast and indexed
        self.df: Any = None  # broadcast and partitioned
        self.broadcast: Any = None  # indexed
        self.token = ""
        self._warming: threading.Thread | None = None
        partitions = config.partitions or int(spark.conf.get("spark.sql.shuffle.partitions"))
        self.store = PartitionedStore(
            spark, config.name, partitions, empty.column_names, versions, config.partitioned_join == "lookup"
        )

    @property
    def lookup_folder(self) -> str | None:
        """The local folder of a partitioned base's lookup files (``None``: joined by Spark's sort-merge join)."""
        return self.store.lookup_folder if self.mode == "partitioned" else None

    @property
    def version(self) -> str | None:
        """The checkpoint version a partitioned base was read from (``None`` otherwise)."""
        return self.store.version if self.mode == "partitioned" else None

    def install(
        self,
        table: pa.Table | None = None,
        df: Any = None,
        ipc: bytes | None = None,
        offsets: Any = None,
    ) -> None:
        """Install a new base; the previous one is released.

        Args:
            table: the base as an Arrow table (``__lk, __lh`` + values) on the driver.
            df: the base as a DataFrame computed by the executors (a bootstrap
                read by Spark): it is built partitioned, on the executors, and
                only collected when it turns out small.
            ipc: the table's Arrow IPC bytes when already at hand (a
                checkpoint), broadcast as they are.
            offsets: the offsets the base covers (a partitioned base's version manifest).
        """
        if df is not None:
            self._release_driver_side()
            self.store.build(df, offsets)
            self.mode, self.rows, self.table, self.df = "partitioned", self.store.rows, None, self.store.df
            if self.store.rows <= self.config.broadcast_max_rows:  # small after all (updates, tombstones)
                small = nullable_table(self.store.df.toArrow())
                self.store.release()
                self.install(small)
                return
            self._prewarm()
            return
        if table is None:
            raise ValueError("install needs a table or a DataFrame")
        rows = table.num_rows
        if rows > self.config.broadcast_max_rows:
            self.install(df=self.spark.createDataFrame(table), offsets=offsets)
            return
        old_broadcast, old_df, was_partitioned = self.broadcast, self.df, self.mode == "partitioned"
        self.broadcast, self.df = None, None
        table = nullable_table(table)
        self.table = table
        if self.config.index_min_rows is not None and rows >= self.config.index_min_rows:
            self.mode, self.token = "indexed", uuid.uuid4().hex
            self.broadcast = self.spark.sparkContext.broadcast(ipc if ipc is not None else ipc_bytes(table))
            self._prewarm()
        else:
            self.mode = "broadcast"
            self.df = self.spark.createDataFrame(table).persist()
            self.df.count()
        self.rows = rows
        if old_broadcast is not None:
            old_broadcast.unpersist()
        if was_partitioned:
            self.store.release()
        elif old_df is not None:
            old_df.unpersist()

    def restore(self, loaded: Any) -> None:
        """Install a partitioned version from the checkpoint (registered; cached unless on a local file system).

        Args:
            loaded: a :class:`~stream_app.checkpoint.LoadedSnapshot` with a ``path``.
        """
        self._release_driver_side()
        early = self.store.written_lookup_folder(loaded.version, loaded.partitions)
        if early is not None:  # the workers map the version's files while the driver registers it
            self._prewarm(MappedLookup(early, loaded.partitions))
        self.store.restore(loaded.version, loaded.path, loaded.rows, loaded.partitions, loaded.columns_ddl)
        self.mode, self.rows, self.table, self.df = "partitioned", self.store.rows, None, self.store.df
        if early is None:
            self._prewarm()

    def _release_driver_side(self) -> None:
        if self.broadcast is not None:
            self.broadcast.unpersist()
        if self.mode != "partitioned" and self.df is not None:
            self.df.unpersist()
        self.broadcast, self.df, self.table = None, None, None

    def apply(self, changes: pa.Table, offsets: Any = None) -> None:
        """Apply a change set (one row per key, ``__deleted``): installs the new base.

        Args:
            changes: ``__lk, __lh, __deleted`` + values, one row per key.
            offsets: the offsets the new base covers.
        """
        if changes.num_rows == 0:
            return
        if self.mode != "partitioned":
            self.install(apply_changes(self.table if self.table is not None else self.empty, changes), offsets=offsets)
            return
        delta = self.spark.createDataFrame(changes.select([LK, LH, DELETED, *self.value_names]))
        self.apply_df(delta, offsets)

    def apply_df(self, changes: Any, offsets: Any = None) -> None:
        """Apply a change set computed by the executors to a partitioned base (nothing reaches the driver).

        Args:
            changes: DataFrame ``__lk, __lh, __deleted`` + values, one row per key.
            offsets: the offsets the new base covers.
        """
        self.store.merge(changes, offsets)
        self.rows, self.df = self.store.rows, self.store.df
        self._prewarm()

    def as_arrow(self) -> pa.Table:
        """The base as an Arrow table (broadcast and indexed engines: the driver's own table).

        Raises:
            RuntimeError: the base is partitioned (it never comes to the driver).
        """
        if self.table is None:
            raise RuntimeError(f"snapshot {self.config.name}: a partitioned base is not collected to the driver")
        return self.table

    def _prewarm(self, mapped: MappedLookup | None = None) -> None:
        """Load the new base into the Python workers in the background (one task per core).

        Indexed engine: the broadcast base and its index; a partitioned base with
        lookup files: the workers start and map the files (``mapped``, default
        the current version's).
        """
        from pyspark.sql import functions as f
        from pyspark.sql import types as T

        if mapped is None and self.mode == "partitioned":
            if self.store.lookup_folder is None:
                return  # joined by Spark: nothing for the workers to hold
            mapped = MappedLookup(self.store.lookup_folder, self.store.partitions)
        if mapped is not None:
            function = mapped_warm_udf_function([mapped])
        else:
            function = warm_udf_function([ArrowLookup(self.token, self.broadcast, None, (), ())])
        cores = self.spark.sparkContext.defaultParallelism
        loader = f.pandas_udf(function, T.LongType())  # type: ignore[call-overload]
        name = self.config.name

        def run() -> None:
            started = time.monotonic()
            try:
                with job_description(self.spark, f"threes snapshot {name}: warm the Python workers"):
                    rows = self.spark.range(cores, numPartitions=cores).select(loader(f.col("id"))).collect()
                log.debug(
                    "snapshot=%s base loaded by workers %s in %.2f s",
                    name,
                    sorted({r[0] for r in rows}),
                    time.monotonic() - started,
                )
            except Exception as exc:  # a newer base replaced it, or the job stops: the next batch loads it
                log.debug("snapshot=%s prewarm skipped: %s", name, exc)

        self._warming = threading.Thread(target=run, name=f"snapshot-prewarm-{name}", daemon=True)
        self._warming.start()

    def wait_warm(self, timeout_s: float | None = 120.0) -> None:
        """Wait until the workers hold the current base.

        A batch started sooner would load it a second time, in new workers, as
        the loading ones are busy.
        """
        if self._warming is not None:
            self._warming.join(timeout_s)
            self._warming = None

    def release(self) -> None:
        """Release the broadcast variable and the cached DataFrame."""
        self._release_driver_side()
        self.store.release()


class DeadLetterProducer:
    """Sends undecodable snapshot records to the dead letter topic (``kernel.dlq`` headers).

    Only bad records of the compacted topics come here (rare); bad events are
    dead-lettered by Spark in the micro-batch itself.
    """

    def __init__(self, kafka: KafkaConfig, topic: str, component: str, timeout_s: float = 30.0):
        self.kafka, self.topic, self.component, self.timeout_s = kafka, topic, component, timeout_s
        # a larger record is dead-lettered without its value (kernel.dlq), never refused by the producer
        self.max_bytes = dead_letter_limit(kafka.client_config)
        self._producer: Any = None

    def send(self, rows: pa.Table, stage: str) -> int:
        """Produce one dead letter per row (``__topic, __partition, __offset, __error, key, value``).

        Returns:
            How many were sent.

        Raises:
            RetriableError: the broker did not acknowledge them in time.
        """
        if rows.num_rows == 0:
            return 0
        if self._producer is None:
            self._producer = clients.kafka_producer(self.kafka)
        for row in rows.select([TOPIC, PARTITION, OFFSET, ERROR, "key", "value"]).to_pylist():
            letter = DeadLetter(
                row[TOPIC], row[PARTITION], row[OFFSET], stage, "SkippableRecordError", row[ERROR], self.component
            )
            log.warning(
                "dead letter topic=%s partition=%d offset=%d reason=%s",
                row[TOPIC],
                row[PARTITION],
                row[OFFSET],
                row[ERROR],
            )
            key, value, headers = letter.record(row["key"], row["value"], None, max_bytes=self.max_bytes)
            self._producer.produce(self.topic, key=key, value=value, headers=headers)
        if self._producer.flush(self.timeout_s):
            raise RetriableError(f"dead letters to {self.topic} not acknowledged within {self.timeout_s} s")
        return rows.num_rows
