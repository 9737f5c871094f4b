"""Reading one key of a live snapshot for an interactive query, without a Spark job or a lock.

The key's row in a driver's Arrow base or overlay, through a ``__lk`` -> row
:class:`KeyIndex` built once per (immutable) table; in a partitioned version's
memory-mapped lookup files (:func:`mapped_row`) or the one Parquet file of the
bucket the key hashes to (Spark's ``pmod(murmur3(__lk), P)``,
:func:`spark_bucket`); a key's version valid at a time (:func:`version_at`).
What would read a file or build an index raises :class:`SlowQuery` when the
caller asked for a fast answer only.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from stream_app.snapshot.data import LK
from stream_app.snapshot.query_keys import jsonable
from stream_app.snapshot.version_intervals import FROM, TO

_M = 0xFFFFFFFF


_BUCKET_FILE = re.compile(r"_(\d{5})(?:\.c\d+)?\.")


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
        """The key's row as JSON-ready values of ``columns`` (``None``: absent).

        Values as :func:`~stream_app.snapshot.query_keys.jsonable` renders them.
        """
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


class SlowQuery(Exception):
    """The answer needs a file read or an index build: not on the server's event loop.

    (:meth:`~stream_app.snapshot.query.SnapshotQueries.fast` then leaves the query to a thread.)
    """


def index_of(table: pa.Table, build: bool = True) -> KeyIndex:
    """The :class:`KeyIndex` of a table, cached by identity while the table lives (a few latest tables).

    Raises:
        SlowQuery: ``build`` is false and the index is not built yet.
    """
    held = _INDEXES.get(id(table))
    if held is not None and held.table is table:
        return held
    if not build:
        raise SlowQuery
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
