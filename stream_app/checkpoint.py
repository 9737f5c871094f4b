"""What the job keeps beside Spark's checkpoint: snapshot checkpoints and the snapshot offsets of each batch.

Layout under ``checkpoint_location``::

    events/                         Spark's checkpoint of the enrichment query
    aggregations/<topic>/           Spark's checkpoint of each aggregation query
    snapshots/<name>/v<ms>/data.arrows + _manifest.json
    snapshot-offsets/<batch id>.json

A snapshot checkpoint is the snapshot's data (an Arrow IPC stream: a
restart maps it back without decoding) with the offsets it covers; a
version is valid once its manifest exists (written last, by atomic rename), so
a crash while writing leaves the previous version in use. A restart loads the
newest valid version and reads only the topics' tail from its offsets, like a
Kafka Streams state store restored from its checkpoint file.

``snapshot-offsets`` records, before a micro-batch writes anything, which
snapshot offsets it joins against; Spark replays an unfinished batch with the
same batch id after a crash, and the job then joins against the same offsets.

Files are written through ``pyarrow.fs``: local paths, ``file://``, ``s3a://``
and ``s3://`` (pyarrow's S3 file system, configured from the same Hadoop S3A
settings Spark's checkpoint uses, ``spark.hadoop.fs.s3a.*``), ``gs://`` and
``hdfs://``. A location the job cannot use is an error at start-up
(:func:`~stream_app.checkpoint_fs.open_checkpoint_location`), never a job without snapshot checkpoints.
The location's file system is :mod:`stream_app.checkpoint_fs`, Spark's paths and checkpoint
settings :mod:`stream_app.spark_checkpoint`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

from stream_app.checkpoint_fs import CheckpointFs
from stream_app.kafka_io import Offsets, offsets_json, parse_offsets

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

DATA = "data.arrows"


def replaced_topics(written: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """The topics whose id in a manifest (``written``) differs from their id ``now``: deleted and created again.

    Args:
        written: topic -> Kafka topic id, as a manifest recorded them (``{}`` in manifests from before).
        now: topic -> the id the topic has now (``{}`` when not known: nothing is compared).

    Returns:
        Those topics, sorted.
    """
    return sorted(t for t in written.keys() & now.keys() if written[t] != now[t])


@dataclass(frozen=True)
class LoadedSnapshot:
    """A snapshot read back from its checkpoint.

    Attributes:
        table: the data (a zero-copy view over ``ipc``); ``None`` for a partitioned version.
        offsets: the next offset per topic-partition it covers.
        written_at: when it was written, epoch seconds.
        ipc: the file's bytes (an Arrow IPC stream), to broadcast as they are; ``None`` for a
            partitioned version.
        version: the version's name (``v<ms>`` Arrow IPC, ``p<ms>`` partitioned Parquet).
        path: a partitioned version's data folder, as Spark reads it.
        rows: keys in the version.
        partitions: a partitioned version's buckets.
        columns_ddl: a partitioned version's columns as Spark DDL (``""`` in versions written
            before it was recorded: then read from the files' footers).
    """

    table: pa.Table | None
    offsets: Offsets
    written_at: float
    ipc: bytes | None
    version: str = ""
    path: str = ""
    rows: int = 0
    partitions: int = 0
    columns_ddl: str = ""


class SnapshotCheckpoint:
    """Checkpoints of one snapshot: versions of its data, each with the offsets it covers.

    A version is a folder ``snapshots/<name>/<version>/`` whose ``_manifest.json``
    (written last) makes it valid. ``v<ms>``: one Arrow IPC file written by the
    driver (small, broadcast snapshots); ``p<ms>``: Parquet bucketed by lookup
    key, written by the executors (partitioned snapshots,
    :mod:`stream_app.snapshot.partitioned`), never read by the driver.

    Args:
        fs: the checkpoint location.
        name: the snapshot's name.
        schema_id: identity of the snapshot's reader schemas; a checkpoint
            written with others is ignored.
        keep: how many versions to keep.
        spark_folder: the same ``snapshots/<name>`` folder as Spark names it
            (partitioned versions are written and read by Spark).
        topic_ids: Kafka's id of each of the snapshot's topics now (KIP-516), written in each
            manifest; a version written for a topic of the same name deleted since (another id) is
            ignored. ``None``: not recorded, not checked.
    """

    def __init__(
        self,
        fs: CheckpointFs,
        name: str,
        schema_id: str,
        keep: int = 2,
        spark_folder: str | None = None,
        topic_ids: Mapping[str, str] | None = None,
    ):
        self.fs = fs
        self.topic_ids = dict(topic_ids or {})
        self.folder = fs.path("snapshots", name)
        self.spark_folder = spark_folder or self.folder
        self.schema_id = schema_id
        self.keep = keep

    def _versions(self) -> list[str]:
        """Version folders, oldest first (by their time stamp, whatever their kind)."""
        names = [v for v in self.fs.children(self.folder) if v[:1] in ("v", "p") and v[1:].isdigit()]
        return sorted(names, key=lambda v: int(v[1:]))

    def _clean_up(self) -> None:
        """Delete versions older than the newest ``keep`` valid ones (unfinished ones among them)."""
        versions = self._versions()
        valid = [v for v in versions if self.fs.read(f"{self.folder}/{v}/_manifest.json") is not None]
        if len(valid) <= self.keep:
            return
        oldest_kept = int(valid[-self.keep][1:])
        for old in versions:
            if int(old[1:]) < oldest_kept:
                self.fs.delete(f"{self.folder}/{old}")

    def version_path(self, version: str) -> str:
        """The data folder of a partitioned version, as Spark names it."""
        return f"{self.spark_folder}/{version}/data"

    def save_partitioned(
        self, version: str, rows: int, partitions: int, offsets: Offsets | None, columns_ddl: str = ""
    ) -> None:
        """Make a partitioned version (its data already written by Spark) valid: its manifest, written last.

        Args:
            version: ``p<ms>``.
            rows: keys it holds.
            partitions: its buckets.
            offsets: the offsets it covers; ``None``: not a checkpoint (no manifest written).
            columns_ddl: its columns as Spark DDL (``StructType.toDDL()``): a restart registers the
                version with them instead of reading a footer first (a slow first read in a new application).
        """
        if offsets is None:
            return
        manifest = {
            "format": "partitioned",
            "offsets": json.loads(offsets_json(offsets)),
            "rows": rows,
            "partitions": partitions,
            "columns": columns_ddl,
            "schema_id": self.schema_id,
            "topic_ids": self.topic_ids,
            "written_at": time.time(),
        }
        self.fs.write_atomic(f"{self.folder}/{version}/_manifest.json", json.dumps(manifest).encode())
        self._clean_up()
        log.info("snapshot checkpoint written folder=%s/%s keys=%d (partitioned)", self.folder, version, rows)

    def save(self, table: pa.Table, offsets: Offsets) -> str:
        """Write a new version; older ones beyond ``keep`` are deleted.

        Returns:
            The version's folder.
        """
        started = time.monotonic()
        version = f"v{int(time.time() * 1000):015d}"
        folder = f"{self.folder}/{version}"
        self.fs.fs.create_dir(folder, recursive=True)
        # an uncompressed Arrow IPC stream: a restart reads it as it is, zero-copy, and broadcasts the same bytes
        with self.fs.fs.open_output_stream(f"{folder}/{DATA}") as out, pa.ipc.new_stream(out, table.schema) as writer:
            writer.write_table(table)
        manifest = {
            "offsets": json.loads(offsets_json(offsets)),
            "rows": table.num_rows,
            "schema_id": self.schema_id,
            "topic_ids": self.topic_ids,
            "written_at": time.time(),
        }
        self.fs.write_atomic(f"{folder}/_manifest.json", json.dumps(manifest).encode())
        self._clean_up()
        log.info(
            "snapshot checkpoint written folder=%s keys=%d elapsed_s=%.2f",
            folder,
            table.num_rows,
            time.monotonic() - started,
        )
        return folder

    def load(self) -> LoadedSnapshot | None:
        """The newest valid version, or ``None`` (none written, or written for other schemas or other topics)."""
        for version in reversed(self._versions()):
            raw = self.fs.read(f"{self.folder}/{version}/_manifest.json")
            if raw is None:
                continue  # a version whose writing did not finish
            manifest = json.loads(raw)
            if manifest.get("schema_id") != self.schema_id:
                log.info("snapshot checkpoint %s/%s was written for other schemas: not used", self.folder, version)
                return None
            written = manifest.get("topic_ids") or {}
            changed = replaced_topics(written, self.topic_ids)
            if changed:
                log.warning(
                    "snapshot checkpoint %s/%s was written for topic(s) %s deleted and created again since (topic "
                    "ids %s, now %s): not used, reading the topics",
                    self.folder, version, changed, {t: written[t] for t in changed},
                    {t: self.topic_ids[t] for t in changed},
                )
                return None
            offsets = parse_offsets(json.dumps(manifest["offsets"]))
            if manifest.get("format") == "partitioned":
                return LoadedSnapshot(
                    None,
                    offsets,
                    manifest["written_at"],
                    None,
                    version=version,
                    path=self.version_path(version),
                    rows=manifest["rows"],
                    partitions=manifest["partitions"],
                    columns_ddl=manifest.get("columns", ""),
                )
            data = self.fs.read(f"{self.folder}/{version}/{DATA}")
            if data is None:
                continue
            table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
            return LoadedSnapshot(table, offsets, manifest["written_at"], data, version=version, rows=table.num_rows)
        return None


class BatchOffsetsLog:
    """The snapshot offsets each micro-batch joined against, by batch id.

    Args:
        fs: the checkpoint location.
        keep: how many recent batches to keep (only the last can be replayed).
    """

    def __init__(self, fs: CheckpointFs, keep: int = 100):
        self.fs = fs
        self.folder = fs.path("snapshot-offsets")
        self.keep = keep

    def record(self, batch_id: int, offsets: dict[str, Offsets]) -> None:
        """Record a batch's snapshot offsets (before the batch writes anything)."""
        data = {name: json.loads(offsets_json(o)) for name, o in offsets.items()}
        self.fs.write_atomic(f"{self.folder}/{batch_id}.json", json.dumps(data).encode())
        if batch_id >= self.keep and batch_id % 10 == 0:
            for name in self.fs.children(self.folder):
                stem = name.split(".", 1)[0]
                if stem.isdigit() and int(stem) < batch_id - self.keep:
                    self.fs.delete(f"{self.folder}/{name}")

    def get(self, batch_id: int) -> dict[str, Offsets] | None:
        """A batch's recorded snapshot offsets, ``None`` when it was never started."""
        raw = self.fs.read(f"{self.folder}/{batch_id}.json")
        if raw is None:
            return None
        return {name: parse_offsets(json.dumps(o)) for name, o in json.loads(raw).items()}
