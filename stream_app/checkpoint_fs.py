"""The checkpoint location's file system, as the snapshot checkpoints write it (``pyarrow.fs``).

Local paths, ``file://``, ``s3a://`` and ``s3://`` (pyarrow's S3 file system,
configured from the Hadoop S3A settings Spark's checkpoint uses), ``gs://`` and
``hdfs://``: :class:`CheckpointFs` does small-file I/O there (atomic writes by
rename); :func:`open_checkpoint_location` checks at start-up that Spark and
pyarrow can both use the location.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from kernel.exceptions import ConfigError, ConfigProblem, SetupError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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
        The location, for :class:`~stream_app.checkpoint.SnapshotCheckpoint` and
        :class:`~stream_app.checkpoint.BatchOffsetsLog`.

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
