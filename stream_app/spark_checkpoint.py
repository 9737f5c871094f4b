"""Spark's side of the checkpoint location: its paths and the checkpoint file manager of local locations.

A location is given to Spark as an absolute path or a URI (:func:`spark_path`,
:func:`child`); on the local file system Spark's offset and commit logs go
through Hadoop's ``FileSystem`` API (:func:`checkpoint_conf`).
"""

from __future__ import annotations

import os
from typing import Any

from stream_app.session import SPARK_VERSION


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
