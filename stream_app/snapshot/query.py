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
  ``pmod(murmur3(__lk), P)``, :func:`spark_bucket`) in the version's lookup
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
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import logging
import os
import re
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stream_app.kafka_io import offsets_json
from stream_app.snapshot.data import DELETED, LK
from stream_app.snapshot.versioned import FROM, TO

log = logging.getLogger(__name__)

_M = 0xFFFFFFFF
_BUCKET_FILE = re.compile(r"_(\d{5})(?:\.c\d+)?\.")


class QueryError(Exception):
    """A query the client got wrong (HTTP 4xx): an unknown snapshot, a malformed key or time.

    Attributes:
        status: the HTTP status (400 malformed, 404 unknown snapshot or absent key).
    """

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M


def _mix_k1(k1: int) -> int:
    return (_rotl((k1 * 0xCC9E2D51) & _M, 15) * 0x1B873593) & _M


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & _M


def spark_murmur3(data: bytes, seed: int = 42) -> int:
    """Spark's ``hash()`` of a string's UTF-8 bytes (``Murmur3_x86_32.hashUnsafeBytes``), a signed int32.

    Spark's variant mixes each trailing byte (past the last 4-byte block) as a
    block of its own (a signed byte), unlike the reference MurmurHash3; its
    bucketing and hash partitioning use it with seed 42.
    """
    h1 = seed & _M
    aligned = len(data) - len(data) % 4
    for i in range(0, aligned, 4):
        h1 = _mix_h1(h1, _mix_k1(int.from_bytes(data[i : i + 4], "little")))
    for b in data[aligned:]:
        h1 = _mix_h1(h1, _mix_k1((b - 256 if b > 127 else b) & _M))
    h1 ^= len(data)
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def spark_bucket(lookup_key: str, buckets: int) -> int:
    """The bucket (and hash partition) Spark gives a lookup key: ``pmod(murmur3(__lk), buckets)``."""
    return spark_murmur3(lookup_key.encode()) % buckets


def bucket_files(folder: str, bucket: int) -> list[str]:
    """The Parquet files of one bucket of a bucketed table's folder (Spark names them ``..._<bucket>.c000...``)."""
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = _BUCKET_FILE.search(name)
        if name.endswith(".parquet") and m is not None and int(m.group(1)) == bucket:
            found.append(os.path.join(folder, name))
    return found


# -- keys and times ------------------------------------------------------------------------------


_INTEGRAL = ("IntegerType", "LongType", "ShortType", "ByteType")


_KEY_FIELDS: dict[int, tuple[Any, list[tuple[str, str, Any]]]] = {}


def key_fields(key_type: Any) -> list[tuple[str, str, Any]]:
    """``(name, type class name, type)`` of each field of a key's ``StructType``, read once per type object."""
    held = _KEY_FIELDS.get(id(key_type))
    if held is None or held[0] is not key_type:
        held = (key_type, [(fld.name, type(fld.dataType).__name__, fld.dataType) for fld in key_type.fields])
        _KEY_FIELDS[id(key_type)] = held
    return held[1]


def key_of(key_type: Any, parts: Mapping[str, str]) -> str:
    """The lookup key (``__lk``) of a key given as text, per key field, as :func:`~stream_app.snapshot.data.lookup_key`.

    Args:
        key_type: the snapshot key's Spark ``StructType``.
        parts: key field -> its text (the URL's path segment for a one-field key, else query parameters).

    Raises:
        QueryError: a key field is missing, unknown, or not of its type; or a composite key has a field
            type this reader does not render (only string, integral and boolean fields).
    """
    fields = key_fields(key_type)
    names = [name for name, _kind, _type in fields]
    if len(fields) == 1 and fields[0][1] == "StringType" and names[0] in parts and len(parts) == 1:
        return parts[names[0]]  # the common case, without the checks below
    unknown = sorted(set(parts) - set(names))
    missing = [n for n in names if n not in parts]
    if unknown or missing:
        raise QueryError(400, f"the key has fields {names}; missing {missing}, unknown {unknown}")
    values: dict[str, Any] = {}
    for name, kind, data_type in fields:
        text = parts[name]
        if kind in _INTEGRAL:
            try:
                values[name] = int(text)
            except ValueError:
                raise QueryError(400, f"key field {name!r} is an integer, got {text!r}") from None
        elif kind == "StringType":
            values[name] = text
        elif kind == "BooleanType" and len(names) > 1 and text in ("true", "false"):
            values[name] = text == "true"
        else:
            raise QueryError(400, f"key field {name!r} of type {data_type.simpleString()} cannot be queried")
    if len(names) == 1:
        return str(values[names[0]])
    # Spark's to_json of the key struct: fields in key order, no spaces, non-ASCII unescaped
    return json.dumps(values, separators=(",", ":"), ensure_ascii=False)


def parse_time_ms(text: str) -> int:
    """A time given as epoch milliseconds or ISO-8601 (no zone: UTC), in epoch ms.

    Raises:
        QueryError: neither.
    """
    text = text.strip()
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise QueryError(400, f"as_of {text!r} is neither epoch milliseconds nor ISO-8601") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def jsonable(value: Any) -> Any:
    """A value of an Arrow row as JSON: decimals as strings, timestamps ISO-8601 UTC, bytes base64."""
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, dt.datetime):
        when = value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value.astimezone(dt.UTC)
        return when.isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {k: jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if all(isinstance(p, tuple) and len(p) == 2 for p in value):  # an Arrow map: [(key, value)]
            return {str(k): jsonable(v) for k, v in value}
        return [jsonable(v) for v in value]
    return value


# -- reading -------------------------------------------------------------------------------------


def rows_of_key(table: pa.Table | None, lk: str) -> pa.Table | None:
    """The rows of ``table`` whose ``__lk`` is ``lk`` (``None`` for no table)."""
    if table is None or table.num_rows == 0:
        return None
    return table.filter(pc.equal(table.column(LK), lk))


class KeyIndex:
    """``__lk`` -> row of one immutable Arrow table (a driver's base or overlay), built once per table.

    A base or overlay is never changed in place (a merge or a refresh installs a new
    table), so its index stays valid for the table's life; it is built by the first query
    after the change, on the HTTP server's thread (never a micro-batch's), in one pass over
    the key column (~3 ms per 10k keys). For an overlay, the *last* row of a key wins (its
    newest record). A query then costs a dict look-up and the row's few values.
    """

    __slots__ = ("table", "rows", "answers")

    def __init__(self, table: pa.Table):
        self.table = table
        self.rows: dict[str, int] = {k: i for i, k in enumerate(table.column(LK).to_pylist())}
        # rows already read, as JSON-ready values: a key asked again costs a dict look-up (bounded by the table)
        self.answers: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}

    def row(self, lk: str, columns: list[str]) -> dict[str, Any] | None:
        """The key's row as JSON-ready values of ``columns`` (:func:`jsonable`; ``None``: absent)."""
        key = (lk, tuple(columns))
        found = self.answers.get(key)
        if found is not None:
            return found
        i = self.rows.get(lk)
        if i is None:
            return None
        found = self.answers[key] = {c: jsonable(self.table.column(c)[i].as_py()) for c in columns}
        return found


_INDEXES: dict[int, KeyIndex] = {}
_INDEX_LOCK = threading.Lock()


class _Slow(Exception):
    """The answer needs a file read or an index build: not on the server's event loop (:meth:`SnapshotQueries.fast`)."""


def index_of(table: pa.Table, build: bool = True) -> KeyIndex:
    """The :class:`KeyIndex` of a table, cached by identity while the table lives (a few latest tables).

    Raises:
        _Slow: ``build`` is false and the index is not built yet.
    """
    held = _INDEXES.get(id(table))
    if held is not None and held.table is table:
        return held
    if not build:
        raise _Slow
    with _INDEX_LOCK:  # two threads asking at once build it once
        held = _INDEXES.get(id(table))
        if held is None or held.table is not table:
            held = KeyIndex(table)
            if len(_INDEXES) >= 16:  # the tables of the few latest versions of each snapshot
                _INDEXES.clear()
            _INDEXES[id(table)] = held
    return held


def base_rows_of_key(table: pa.Table | None, lk: str) -> pa.Table | None:
    """The row of a key in a driver's base table (one row, or ``None``), through :func:`index_of`."""
    if table is None or table.num_rows == 0:
        return None
    i = index_of(table).rows.get(lk)
    return None if i is None else table.slice(i, 1)


_COMPLETE: set[str] = set()


def mapped_row(folder: str, partitions: int, lk: str, columns: list[str]) -> tuple[bool, dict[str, Any] | None]:
    """A key's row in a partitioned version's lookup files (:mod:`stream_app.snapshot.mapped`).

    The bucket's Arrow IPC file (sorted by ``__lh``, Spark's ``xxhash64``) is memory-mapped
    once per version and process (the page cache holds it; nothing is copied into the heap)
    and searched by ``numpy.searchsorted``: microseconds, no Parquet decoding per query.

    Returns:
        ``(True, row)`` with ``row`` ``None`` when the key is absent; ``(False, None)`` when the
        version has no complete lookup files (the caller reads its Parquet bucket instead).
    """
    from stream_app.snapshot.delta import spark_xxhash64
    from stream_app.snapshot.mapped import MappedLookup, _bucket, is_complete

    if folder not in _COMPLETE:  # a complete folder never changes (a new version has a new folder)
        if not is_complete(folder, partitions):
            return False, None
        _COMPLETE.add(folder)
    table, hashes = _bucket(MappedLookup(folder, partitions), spark_bucket(lk, partitions))
    wanted = spark_xxhash64(lk)
    keys = table.column(LK)
    i = int(np.searchsorted(hashes, wanted))
    while i < len(hashes) and hashes[i] == wanted:  # keys that share a hash are adjacent
        if keys[i].as_py() == lk:
            return True, {c: jsonable(table.column(c)[i].as_py()) for c in columns}
        i += 1
    return True, None


def read_bucket(folder: str, partitions: int, lk: str, columns: list[str] | None = None) -> pa.Table | None:
    """The rows of one key from a table bucketed by ``__lk`` (one file read, filtered by row-group statistics)."""
    paths = bucket_files(folder, spark_bucket(lk, partitions))
    if not paths:
        return None
    return pa.concat_tables([pq.read_table(p, columns=columns, filters=[(LK, "=", lk)]) for p in paths])


def newest_in_log(log_table: pa.Table | None, lk: str) -> dict[str, Any] | None:
    """The overlay's last record of the key (a row dict with ``__deleted``), ``None`` when it has none."""
    rows = rows_of_key(log_table, lk)
    if rows is None or rows.num_rows == 0:
        return None
    return rows.slice(rows.num_rows - 1).to_pylist()[0]


def version_at(versions: pa.Table | None, at_ms: int) -> dict[str, Any] | None:
    """The row of a key's versions whose ``[__from, __to)`` holds ``at_ms``."""
    if versions is None:
        return None
    for row in versions.to_pylist():
        if row[FROM] <= at_ms and (row[TO] is None or at_ms < row[TO]):
            return row
    return None


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
        except _Slow:
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
                    raise _Slow
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
        lk: the lookup key (:func:`key_of`).
        as_of_ms: a time, epoch ms, for a versioned snapshot; ``None``: the current value.
        slow: allow reading a Parquet file or building a key index (milliseconds); when false,
            such a query raises ``_Slow`` (the server then answers it on a thread).

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
            raise _Slow
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
                raise _Slow
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

    from stream_app.checkpoint import child, open_checkpoint_location
    from stream_app.kafka_io import TopicWatermarks
    from stream_app.plan import build_plan
    from stream_app.snapshot.engines import DeadLetterProducer
    from stream_app.snapshot.runtime import Snapshot
    from stream_app.writers import WriterSchemas

    snapshots = {s.name: s for s in config.snapshots}
    if name not in snapshots:
        raise QueryError(404, f"no snapshot {name!r} (have: {sorted(snapshots)})")
    # no lookup files, no merge of the tail into a new base: nothing is written beside the job's versions
    offline = snapshots[name].model_copy(update={"partitioned_join": "sort_merge", "overlay_max_rows": 10**9})
    config = config.model_copy(update={"snapshots": [offline], "lookups": [], "updates": [], "where": None,
                                       "derive": {}})
    watermarks = TopicWatermarks(kafka)
    writers = WriterSchemas(kafka, watermarks)
    snapshot = None
    try:
        plan = build_plan(config, spark, base_dir, writers.store.version_schemas)
        assert plan is not None
        snap_plan = plan.snapshots[name]
        fs = open_checkpoint_location(config.checkpoint_location, spark)
        with tempfile.TemporaryDirectory(prefix="threes-query-") as scratch:
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
            names = list(snap_plan.key.spark_type.fieldNames())
            if isinstance(key, Mapping):
                parts = dict(key)
            elif len(key) == 1 and "=" not in key[0] and len(names) == 1:
                parts = {names[0]: key[0]}
            else:
                bad = [k for k in key if "=" not in k]
                if bad:
                    raise QueryError(400, f"give a composite key as field=value ({', '.join(names)}), got {bad}")
                parts = dict(k.split("=", 1) for k in key)
            lk = key_of(snap_plan.key.spark_type, parts)
            try:
                return lookup(snapshot, lk, None if as_of is None else parse_time_ms(as_of))
            except QueryError as exc:
                return exc.status, {"error": str(exc)}
            finally:
                snapshot.close(checkpoint=False)
    finally:
        writers.close()
        watermarks.close()


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
        """The newest valid version (see :meth:`SnapshotCheckpoint.load`)."""
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
