"""``threes query``: one key of a snapshot without a running job, read-only beside a job that may run.

:func:`query_offline` loads the snapshot as the job does and asks it as the
HTTP route does (:func:`stream_app.snapshot.query.lookup`), through a
:class:`ReadOnlyCheckpoint` that never writes the job's checkpoint location.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stream_app.snapshot.query import lookup
from stream_app.snapshot.query_keys import QueryError, key_of, parse_time_ms


def query_offline(
    config: Any, kafka: Any, spark: Any, base_dir: Any, name: str, key: Mapping[str, str] | list[str],
    as_of: str | None = None,
) -> tuple[int, dict[str, Any]]:
    """``threes query``: one key of a snapshot without a running job, by the job's own code path.

    The snapshot is loaded as the job loads it (its newest checkpointed version, then the
    topics' tail, read into the overlay) and asked as the HTTP route asks it; the checkpoint
    location is only read (a running job may own it): the tail is merged in memory, and a
    snapshot without a usable checkpoint is built in a scratch folder.

    Args:
        config: the ``stream:`` section.
        kafka: the pipeline's Kafka config.
        spark: a SparkSession.
        base_dir: the config file's folder (relative schema paths).
        name: the snapshot.
        key: the key: one value for a one-field key, else ``field=value`` texts, or a mapping.
        as_of: a time (ISO-8601 or epoch ms) for a versioned snapshot.

    Returns:
        ``(HTTP status, document)`` as ``GET /snapshots/{name}/{key}`` answers.

    Raises:
        QueryError: an unknown snapshot, a malformed key or time.
        ConfigError: the config does not fit the schemas.
    """
    import tempfile

    from stream_app.checkpoint_fs import open_checkpoint_location
    from stream_app.kafka_io import TopicWatermarks
    from stream_app.plan import build_plan
    from stream_app.writers import WriterSchemas

    config = _offline_config(config, name)
    watermarks = TopicWatermarks(kafka)
    writers = WriterSchemas(kafka, watermarks)
    try:
        plan = build_plan(config, spark, base_dir, writers.store.version_schemas)
        assert plan is not None
        snap_plan = plan.snapshots[name]
        fs = open_checkpoint_location(config.checkpoint_location, spark)
        with tempfile.TemporaryDirectory(prefix="threes-query-") as scratch:
            snapshot = _loaded_snapshot(spark, kafka, config, snap_plan, fs, writers, watermarks, scratch)
            lk = key_of(snap_plan.key.spark_type, _key_parts(key, list(snap_plan.key.spark_type.fieldNames())))
            try:
                return lookup(snapshot, lk, None if as_of is None else parse_time_ms(as_of))
            except QueryError as exc:
                return exc.status, {"error": str(exc)}
            finally:
                snapshot.close(checkpoint=False)
    finally:
        writers.close()
        watermarks.close()


def _loaded_snapshot(
    spark: Any, kafka: Any, config: Any, snap_plan: Any, fs: Any, writers: Any, watermarks: Any, scratch: str
) -> Any:
    """The snapshot loaded as the job loads it, over a :class:`ReadOnlyCheckpoint` (new versions in ``scratch``)."""
    from stream_app.snapshot.engines import DeadLetterProducer
    from stream_app.snapshot.runtime import Snapshot
    from stream_app.spark_checkpoint import child

    name = snap_plan.config.name
    # duck-typed: what Snapshot reads of a SnapshotCheckpoint, never writing
    checkpoint: Any = ReadOnlyCheckpoint(fs, name, snap_plan.schema_id, child(config.checkpoint_location,
                                                                          "snapshots", name), scratch,
                                         topic_ids=watermarks.topic_ids(snap_plan.config.topics))
    snapshot = Snapshot(spark, kafka, snap_plan, writers, watermarks, checkpoint,
                        DeadLetterProducer(kafka, config.dead_letter_topic, f"{config.name}-query"),
                        f"{config.name}-query")
    if snapshot.versions is not None:
        snapshot.versions.read_only = True
    snapshot.bootstrap()
    return snapshot


def _offline_config(config: Any, name: str) -> Any:
    """The ``stream:`` section reduced to the one snapshot, which writes nothing beside the job's versions.

    Raises:
        QueryError: no snapshot ``name``.
    """
    snapshots = {s.name: s for s in config.snapshots}
    if name not in snapshots:
        raise QueryError(404, f"no snapshot {name!r} (have: {sorted(snapshots)})")
    # no lookup files, no merge of the tail into a new base: nothing is written beside the job's versions
    offline = snapshots[name].model_copy(update={"partitioned_join": "sort_merge", "overlay_max_rows": 10**9})
    return config.model_copy(update={"snapshots": [offline], "lookups": [], "updates": [], "where": None,
                                     "derive": {}})


def _key_parts(key: Mapping[str, str] | list[str], names: list[str]) -> dict[str, str]:
    """Key field -> text of ``threes query``'s key: one value of a one-field key, else ``field=value`` texts.

    Raises:
        QueryError: a composite key not given as ``field=value``.
    """
    if isinstance(key, Mapping):
        return dict(key)
    if len(key) == 1 and "=" not in key[0] and len(names) == 1:
        return {names[0]: key[0]}
    bad = [k for k in key if "=" not in k]
    if bad:
        raise QueryError(400, f"give a composite key as field=value ({', '.join(names)}), got {bad}")
    return dict(k.split("=", 1) for k in key)


class ReadOnlyCheckpoint:
    """A snapshot's checkpoints, read but never written (``threes query`` beside a running job).

    Loads what :class:`~stream_app.checkpoint.SnapshotCheckpoint` loads; a version the query builds
    itself (no usable checkpoint) goes to a scratch folder, and no manifest is written.
    """

    def __init__(self, fs: Any, name: str, schema_id: str, spark_folder: str, scratch: str,
                 topic_ids: Any = None):
        from stream_app.checkpoint import SnapshotCheckpoint

        self._real = SnapshotCheckpoint(fs, name, schema_id, spark_folder=spark_folder, topic_ids=topic_ids)
        self.fs, self.folder, self.spark_folder, self.schema_id = fs, self._real.folder, spark_folder, schema_id
        self.topic_ids = self._real.topic_ids
        self.scratch = scratch

    def load(self) -> Any:
        """The newest valid version (see :meth:`~stream_app.checkpoint.SnapshotCheckpoint.load`)."""
        return self._real.load()

    def version_path(self, version: str) -> str:
        """A written version's data folder; a new one's in the scratch folder."""
        if self.fs.read(f"{self.folder}/{version}/_manifest.json") is not None:
            return self._real.version_path(version)
        return f"{self.scratch}/{version}/data"

    def save(self, table: Any, offsets: Any) -> str:
        """Nothing is written."""
        return ""

    def save_partitioned(self, *args: Any, **kwargs: Any) -> None:
        """Nothing is written."""
