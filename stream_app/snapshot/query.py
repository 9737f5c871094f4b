"""Interactive queries: a snapshot's value for one key, read from outside the micro-batches.

Kafka Streams' interactive queries let a service ask a running application for
the value of key K instead of keeping a second database; here the stream job
answers on its metrics port (``GET /snapshots/{name}/{key}``, served by
:class:`~kernel.status.http.StatusServer` through a route the job
registers) and ``threes query`` answers from the checkpoint without a job.

A read never takes a lock a micro-batch waits for and never runs a Spark job:

* the broadcast and indexed engines: the key's row of the driver's Arrow base,
  through a ``__lk`` -> row index built once per base (the table is immutable;
  a merge installs a new one, whose index the first query after it builds);
* the partitioned engine: the bucket the key hashes to (Spark's
  ``pmod(murmur3(__lk), P)``, :func:`~stream_app.snapshot.query_reads.spark_bucket`) in the version's lookup
  files, memory-mapped and searched by the key's hash
  (:mod:`stream_app.snapshot.mapped`); without lookup files, the one Parquet
  file of that bucket, read with a filter on ``__lk`` that its row-group
  statistics narrow (the file is sorted by ``__lk``): the base is never
  collected;
* in both, the overlay's newest record of the key wins (a tombstone: absent),
  through an index of the overlay built once per overlay;
* ``as_of`` (a versioned snapshot): the versions table's bucket file, the
  version whose ``[__from, __to)`` holds the time.

The HTTP server (:class:`~kernel.status.http.StatusServer`) answers a query
on its event loop when :meth:`SnapshotQueries.fast` can (the indexed and mapped
cases: tens of microseconds, no file read, no lock) and on its thread pool
otherwise (``as_of``, a Parquet bucket, the first query of a new base).

Answers are JSON: decimals as strings, timestamps as ISO-8601 UTC, bytes as
base64, with the snapshot's offsets at the time of the read.

This module holds the HTTP route (:class:`SnapshotQueries`) and the lookup of a
live snapshot; a query's key, time and JSON values are
:mod:`stream_app.snapshot.query_keys`, the reads of tables and files
:mod:`stream_app.snapshot.query_reads`, ``threes query`` without a job
:mod:`stream_app.snapshot.offline_query`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from stream_app.kafka_io import offsets_json
from stream_app.snapshot.data import DELETED, LK
from stream_app.snapshot.query_keys import QueryError, jsonable, key_fields, key_of, parse_time_ms
from stream_app.snapshot.query_reads import SlowQuery, index_of, mapped_row, read_bucket, version_at
from stream_app.snapshot.version_intervals import FROM, TO

log = logging.getLogger(__name__)


class SnapshotQueries:
    """Answers interactive queries against the live snapshots of a job.

    Args:
        snapshots: name -> :class:`~stream_app.snapshot.runtime.Snapshot` (read, never changed).
    """

    def __init__(self, snapshots: Mapping[str, Any]):
        self.snapshots = snapshots
        # queries answered on the server's event loop and on its thread pool (a benchmark's diagnosis)
        self.answered = {"loop": 0, "pool": 0}

    def fast(self, path: str, query: Mapping[str, list[str]]) -> tuple[int, dict[str, Any]] | None:
        """:meth:`handle` when it answers in microseconds (an indexed or memory-mapped key), else ``None``.

        The server runs it on its event loop; ``None`` (an ``as_of`` query, a Parquet bucket
        to read, a new base whose index is not built yet) sends the query to :meth:`handle` on a thread.
        """
        try:
            answer = self.handle(path, query, slow=False)
        except SlowQuery:
            self.answered["pool"] += 1
            return None
        self.answered["loop"] += 1
        return answer

    def handle(self, path: str, query: Mapping[str, list[str]], slow: bool = True) -> tuple[int, dict[str, Any]]:
        """Answer ``/snapshots/{name}`` or ``/snapshots/{name}/{key}`` (``?as_of=``, key fields as parameters).

        Args:
            path: the URL's path.
            query: its query parameters.
            slow: see :func:`lookup`.

        Returns:
            ``(HTTP status, JSON document)``; a client error is a 4xx with ``{"error": ...}``.
        """
        from urllib.parse import unquote

        parts = [unquote(p) for p in path.strip("/").split("/")]
        try:
            if len(parts) < 2 or parts[0] != "snapshots" or len(parts) > 3:
                raise QueryError(404, "try /snapshots/{name}, /snapshots/{name}/{key} or /snapshots/{name}?field=...")
            snapshot = self.snapshots.get(parts[1])
            if snapshot is None:
                raise QueryError(404, f"no snapshot {parts[1]!r} (have: {sorted(self.snapshots)})")
            single = {k: v[-1] for k, v in query.items() if k != "as_of"}
            as_of = query.get("as_of", [None])[-1]
            if len(parts) == 2 and not single:
                if not slow:  # live_keys may apply the overlay to the base: milliseconds
                    raise SlowQuery
                return 200, describe(snapshot)
            names = [name for name, _kind, _type in key_fields(snapshot.plan.key.spark_type)]
            if len(parts) == 3:
                if len(names) != 1:
                    example = "&".join(f"{n}=..." for n in names)
                    raise QueryError(400, f"snapshot {parts[1]!r} has a composite key {names}: give its fields as "
                                          f"query parameters, /snapshots/{parts[1]}?{example}")
                single = {names[0]: parts[2]}
            lk = key_of(snapshot.plan.key.spark_type, single)
            return lookup(snapshot, lk, None if as_of is None else parse_time_ms(as_of), slow)
        except QueryError as exc:
            return exc.status, {"error": str(exc)}


def describe(snapshot: Any) -> dict[str, Any]:
    """``GET /snapshots/{name}``: keys, offsets, engine, versions retained."""
    versions = snapshot.versions
    return {
        "snapshot": snapshot.name,
        "keys": snapshot.live_keys(),
        "offsets": json.loads(offsets_json(snapshot.offsets)),
        "engine": snapshot.mode,
        "retention": snapshot.cfg.retention,
        "versions": None if versions is None else versions.rows,
        "stream_time_ms": None if versions is None else versions.stream_time_ms,
    }


def lookup(snapshot: Any, lk: str, as_of_ms: int | None, slow: bool = True) -> tuple[int, dict[str, Any]]:
    """The value of one key of a live snapshot, now or as of a time (see module docstring).

    Args:
        snapshot: the live :class:`~stream_app.snapshot.runtime.Snapshot`.
        lk: the lookup key (:func:`~stream_app.snapshot.query_keys.key_of`).
        as_of_ms: a time, epoch ms, for a versioned snapshot; ``None``: the current value.
        slow: allow reading a Parquet file or building a key index (milliseconds); when false,
            such a query raises ``SlowQuery`` (the server then answers it on a thread).

    Raises:
        QueryError: a versioned query of a snapshot without versions, or an unreadable one.
    """
    offsets = _offsets_doc(snapshot.offsets)
    values = list(snapshot.value_names)
    answer: dict[str, Any] = {"snapshot": snapshot.name, "key": lk, "offsets": offsets}
    if as_of_ms is not None:
        versions = snapshot.versions
        if versions is None:
            raise QueryError(400, f"snapshot {snapshot.name!r} keeps no versions (no retention): as_of does not apply")
        horizon = versions.horizon_ms
        answer["as_of_ms"] = as_of_ms
        if horizon is not None and as_of_ms < horizon:
            return 404, {**answer, "error": f"{as_of_ms} is older than the retention (horizon {horizon} ms)"}
        if not slow:
            raise SlowQuery
        version = version_at(_versions_of(versions, lk), as_of_ms)
        if version is None:
            return 404, {**answer, "error": "no version of this key at that time"}
        return 200, {**answer, "valid_from_ms": version[FROM], "valid_to_ms": version[TO],
                     "value": {n: jsonable(version[n]) for n in values}}
    overlay = snapshot._log  # first: a merge installs the new base, then drops the overlay
    base = snapshot.base
    if overlay is not None and overlay.num_rows:
        newest = index_of(overlay, slow).row(lk, [DELETED, *values])
        if newest is not None:
            if newest[DELETED]:
                return 404, {**answer, "error": "deleted (tombstone)"}
            return 200, {**answer, "value": {n: newest[n] for n in values}}
    if base.mode == "partitioned":
        store = base.store
        if store.version is None or snapshot.checkpoint is None:
            raise QueryError(503, f"snapshot {snapshot.name!r} is partitioned without written versions: not queryable")
        row: dict[str, Any] | None = None
        mapped = False
        folder = store.lookup_folder
        if folder is not None:
            mapped, row = mapped_row(folder, store.partitions, lk, values)
        if not mapped:  # no lookup files (sort_merge join, or not a local file system): the Parquet bucket
            if not slow:
                raise SlowQuery
            rows = read_bucket(_local(store.versions.version_path(store.version)), store.partitions, lk, values)
            row = None if rows is None or rows.num_rows == 0 else jsonable(rows.slice(0, 1).to_pylist()[0])
    elif base.table is None or base.table.num_rows == 0:
        row = None
    else:
        row = index_of(base.table, slow).row(lk, values)
    if row is None:
        return 404, {**answer, "error": "absent"}
    return 200, {**answer, "value": {n: row[n] for n in values}}


def _offsets_doc(offsets: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    """Offsets as :func:`~stream_app.kafka_io.offsets_json` renders them, as a document (no JSON round trip)."""
    return {t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(offsets.items())}


def _versions_of(versions: Any, lk: str) -> pa.Table | None:
    if versions.version is None:
        if versions.df is None:
            return None
        if not versions.read_only:  # a job without written versions: no Spark job from the HTTP thread
            raise QueryError(503, "the versions are not written to a checkpoint: not queryable")
        from pyspark.sql import functions as f

        return versions.df.filter(f.col(LK) == lk).toArrow()  # threes query: its own SparkSession
    folder = _local(f"{versions.checkpoint.spark_folder}/versions/{versions.version}/data")
    return read_bucket(folder, versions.partitions, lk)


def _local(path: str) -> str:
    """A Spark path of a local checkpoint as a file system path (other file systems: not yet queryable)."""
    if path.startswith("file://"):
        return path.removeprefix("file://")
    if "://" in path:
        raise QueryError(503, f"interactive queries read local checkpoints only, not {path.split('://')[0]}://")
    return path


