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
(:func:`open_checkpoint_location`), never a job without snapshot checkpoints.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.fs as pafs

from kernel.exceptions import ConfigError, ConfigProblem, SetupError
from stream_app.kafka_io import Offsets, offsets_json, parse_offsets
from stream_app.session import SPARK_VERSION

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DATA = "data.arrows"


def s3_filesystem(bucket: str, s3a: Mapping[str, str]) -> pafs.S3FileSystem:
    """Return pyarrow's S3 file system for ``bucket``, configured like Hadoop's S3A connector.

    Reads the S3A keys Spark's checkpoint uses (``spark.hadoop.fs.s3a.<key>`` in the
    Spark conf, without the ``fs.s3a.`` prefix here), a per-bucket
    ``bucket.<bucket>.<key>`` winning over ``<key>`` as in S3A: ``endpoint``,
    ``connection.ssl.enabled``, ``access.key``, ``secret.key``, ``session.token``,
    ``endpoint.region`` (or ``region``) and ``path.style.access``. Missing
    credentials fall back to the AWS default chain, as in S3A.

    Args:
        bucket: the bucket of the checkpoint location.
        s3a: Hadoop's ``fs.s3a.*`` settings with the prefix removed.

    Returns:
        A :class:`pyarrow.fs.S3FileSystem`.
    """

    def get(key: str) -> str | None:
        value = s3a.get(f"bucket.{bucket}.{key}", s3a.get(key))
        return value.strip() if value else None

    options: dict[str, object] = {}
    endpoint = get("endpoint")
    if endpoint:
        scheme, sep, rest = endpoint.partition("://")
        if not sep:  # S3A takes a bare host[:port], its scheme from connection.ssl.enabled
            scheme, rest = (
                ("https" if (get("connection.ssl.enabled") or "true").lower() == "true" else "http"),
                endpoint,
            )
        options["endpoint_override"], options["scheme"] = rest.rstrip("/"), scheme
    if get("access.key") and get("secret.key"):
        options["access_key"], options["secret_key"] = get("access.key"), get("secret.key")
        if get("session.token"):
            options["session_token"] = get("session.token")
    region = get("endpoint.region") or get("region")
    if region:
        options["region"] = region
    if (get("path.style.access") or "false").lower() != "true" and not endpoint:
        options["force_virtual_addressing"] = True
    return pafs.S3FileSystem(**options)


class CheckpointFs:
    """Small-file and Parquet I/O in the checkpoint location.

    Args:
        location: the job's ``checkpoint_location`` (a path or a URI).
        s3a: Hadoop's ``fs.s3a.*`` settings without the prefix, for ``s3a://`` and ``s3://``.

    Raises:
        ValueError: pyarrow has no file system for the URI's scheme.
    """

    def __init__(self, location: str, s3a: Mapping[str, str] | None = None):
        scheme = location.split("://", 1)[0].lower() if "://" in location else "file"
        if scheme in ("s3a", "s3"):
            bucket, _, key = location.split("://", 1)[1].partition("/")
            if not bucket:
                raise ValueError(f"{location!r} names no bucket")
            self.fs, self.root = s3_filesystem(bucket, s3a or {}), f"{bucket}/{key}".rstrip("/")
        elif scheme != "file":
            try:
                self.fs, self.root = pafs.FileSystem.from_uri(location)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, OSError) as exc:
                raise ValueError(f"no pyarrow file system for {scheme}:// ({exc})") from exc
        else:
            self.fs = pafs.LocalFileSystem()
            self.root = os.path.abspath(location.removeprefix("file://"))
        self.root = self.root.rstrip("/")

    def probe(self) -> None:
        """Write, read back and delete a small file under the root.

        Raises:
            OSError: the location cannot be written or read (no bucket, no permission...).
        """
        path = self.path(f"_probe-{uuid.uuid4().hex}")
        self.write_atomic(path, b"threes")
        if self.read(path) != b"threes":
            raise OSError(f"{path} did not read back what was written")
        self.fs.delete_file(path)

    def path(self, *parts: str) -> str:
        """A path under the root."""
        return "/".join([self.root, *parts])

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write a small file: to a temporary name, then renamed (atomic on local and HDFS)."""
        self.fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        self.fs.move(tmp, path)

    def read(self, path: str) -> bytes | None:
        """A small file's bytes, ``None`` when it does not exist."""
        try:
            with self.fs.open_input_stream(path) as stream:
                return stream.read()
        except FileNotFoundError:
            return None

    def children(self, path: str) -> list[str]:
        """Base names of the entries of a folder (empty when missing)."""
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
        except FileNotFoundError:
            return []
        return sorted(info.base_name for info in infos)

    def delete(self, path: str) -> None:
        """Delete a file or a folder, quietly when missing."""
        info = self.fs.get_file_info(path)
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(path)
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(path)


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


def open_checkpoint_location(location: str, spark: SparkSession | None = None) -> CheckpointFs:
    """Check that Spark and the snapshot checkpoints can both use ``location``, and open it.

    Spark's side: its Hadoop file system for the location's scheme loads (an
    ``s3a://`` location needs hadoop-aws and the AWS SDK on the class path). The
    snapshot side: a probe file is written, read back and deleted through pyarrow,
    with the S3A settings of Spark's Hadoop conf (``spark.hadoop.fs.s3a.*``).

    Args:
        location: the job's ``checkpoint_location``.
        spark: the SparkSession (its Hadoop conf and file systems); ``None`` checks the pyarrow side only.

    Returns:
        The location, for :class:`SnapshotCheckpoint` and :class:`BatchOffsetsLog`.

    Raises:
        ConfigError: no file system for the location's scheme (a one-line problem at
            ``stream.checkpoint_location``).
        SetupError: the location cannot be reached, written or read.
    """
    where = "stream.checkpoint_location"
    s3a: dict[str, str] = {}
    if spark is not None and "://" in location and not location.startswith("file://"):
        hadoop = spark.sparkContext._jsc.hadoopConfiguration()
        jvm = spark.sparkContext._jvm
        if jvm is None:  # the gateway is gone once the SparkContext is stopped
            raise SetupError(f"{where} {location!r}: the SparkSession is stopped")
        try:
            jvm.org.apache.hadoop.fs.Path(location).getFileSystem(hadoop)
        except Exception as exc:  # py4j's Java errors: the class or the scheme is missing
            reason = _first_line(exc)
            hint = (
                " (hadoop-aws and the AWS SDK bundle are not on Spark's class path: "
                "`threes local up --service spark` resolves them, see docs/operations.md)"
                if "s3a" in reason.lower()
                else ""
            )
            raise ConfigError([ConfigProblem(where, f"Spark cannot use {location!r}: {reason}{hint}")]) from None
        s3a = {str(k): str(v) for k, v in dict(hadoop.getPropsWithPrefix("fs.s3a.")).items()}
    try:
        fs = CheckpointFs(location, s3a)
    except ValueError as exc:
        raise ConfigError([ConfigProblem(where, f"snapshot checkpoints cannot use {location!r}: {exc}")]) from None
    try:
        fs.probe()
    except OSError as exc:
        raise SetupError(f"{where} {location!r} cannot be written: {_first_line(exc)}") from None
    return fs


def _first_line(exc: BaseException) -> str:
    """The first meaningful line of an error (a Java error's cause, without its stack)."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        cause = java
        while cause.getCause() is not None:
            cause = cause.getCause()
        return str(cause.toString()).splitlines()[0][:300]
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else type(exc).__name__)[:300]


def file_system_checkpoint_manager(spark_version: str = SPARK_VERSION) -> str:
    """Spark's checkpoint file manager over Hadoop's ``FileSystem`` API, for ``spark_version``.

    In ``...execution.streaming.checkpointing`` since Spark 4.1, which split the streaming
    execution package; in ``...execution.streaming`` before.
    """
    major, minor = (int(part) for part in spark_version.split(".")[:2])
    package = "checkpointing." if (major, minor) >= (4, 1) else ""
    return f"org.apache.spark.sql.execution.streaming.{package}FileSystemBasedCheckpointFileManager"


#: The manager of the installed Spark (rename by ``File.renameTo``).
FILE_SYSTEM_CHECKPOINT_MANAGER = file_system_checkpoint_manager()
CHECKPOINT_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"


def default_fs(spark: Any) -> str:
    """Spark's default Hadoop file system (``fs.defaultFS``), ``file:///`` when unset."""
    return spark.sparkContext._jsc.hadoopConfiguration().get("fs.defaultFS") or "file:///"


def is_local_path(path: str, fs_default: str = "file:///") -> bool:
    """Whether a Spark path is on the local file system (``file:``, or no scheme and a local default FS)."""
    if "://" in path or path.startswith("file:"):
        return path.startswith("file:")
    return fs_default.startswith("file:")


def checkpoint_conf(location: str, fs_default: str = "file:///") -> dict[str, str]:
    """Spark SQL settings for the streaming checkpoint at ``location``.

    On the local file system, Spark's offset and commit logs go through the
    ``FileSystem`` API instead of its default, Hadoop's ``FileContext``. Without
    Hadoop's native library (the pyspark package has none), ``FileContext``'s
    local file system forks a ``readlink`` process twice per rename and a
    ``chmod`` per file created, for every log entry and its checksum file, two
    entries per micro-batch (``walCommit`` and ``commitOffsets`` in Spark's
    progress); ``FileSystem`` forks nothing. That manager renames a log entry's temporary file with
    ``rename(2)``, atomic on a local file system, which is all Spark asks of it.
    Other locations (``s3a://``, ``hdfs://``) keep Spark's default.

    Args:
        location: the job's ``checkpoint_location`` (a path or a URI).
        fs_default: Spark's ``fs.defaultFS`` (:func:`default_fs`), which a path without a scheme is on.

    Returns:
        ``{setting: value}``, empty when Spark's defaults fit.
    """
    if is_local_path(spark_path(location), fs_default):
        return {CHECKPOINT_MANAGER_KEY: FILE_SYSTEM_CHECKPOINT_MANAGER}
    return {}


def spark_path(location: str) -> str:
    """A checkpoint location as Spark expects it (local paths made absolute)."""
    return location if "://" in location else os.path.abspath(location)


def child(location: str, *parts: str) -> str:
    """A sub-folder of the checkpoint location, for Spark."""
    return "/".join([spark_path(location).rstrip("/"), *parts])
