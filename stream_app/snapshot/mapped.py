"""Point lookups against a partitioned snapshot's version, memory-mapped by the Python workers.

Every plan that joins a micro-batch with a partitioned base *reads* the base:
a sort-merge join scans all of it (10M keys: ~2 s per 50k-event batch on this
machine, of which ~0.55 s is the scan of ``__lk`` alone), whatever the batch
holds (``benchmarks/partitioned_join.py``). A lookup instead costs what the
batch holds: each version of a partitioned base (written by the executors,
:mod:`stream_app.snapshot.partitioned`) also gets **lookup files**, one Arrow
IPC file per bucket, sorted by ``__lh`` (the key's ``xxhash64``), in the
version's folder (``<version>/lookup/b<bucket>.arrow``). The join is then the
indexed engine's scalar pandas UDF (:mod:`stream_app.snapshot.indexed`): only
each event's key, hash and bucket cross into Python; the worker memory-maps the
bucket's file once (the operating system's page cache holds its pages, shared
by every worker of the host and evictable; nothing is copied into the
worker's heap), finds each hash by binary search (``numpy.searchsorted``),
confirms it by comparing ``__lk`` (keys that share a hash are adjacent and
searched in turn) and takes the value columns of the rows found. The overlay
of changes newer than the base is applied on top exactly as in the indexed
engine. Nothing is shuffled, nothing is cached by the executors, nothing
reaches the driver.

The files are written by the executors from the bucketed version (one task
per bucket reads its Parquet with pyarrow: no shuffle), before the version's manifest, so a restart
finds them beside the version it registers. They need a file system the
Python workers read as local files: the engine applies to versions on a
``file:`` checkpoint location (``local[*]``, a standalone cluster on one
host, or a shared mount); on object storage or HDFS the partitioned base is
joined by Spark's sort-merge join instead.

Measured (``benchmarks/partitioned_join.py``, standalone cluster, 10M keys,
50k events referencing 10k keys): 0.49-0.56 s per batch for the lookups of a
memory-mapped, hash-sorted copy of the base, against 2.0-2.4 s for the
sort-merge join and 0.47-0.63 s for Spark's broadcast join of a 10k-key table.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import typing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stream_app.python_worker import prepare as prepare_worker
from stream_app.snapshot.data import LH, LK
from stream_app.snapshot.indexed import take, warm_function, with_overlay

log = logging.getLogger(__name__)

LOOKUP_FOLDER = "lookup"
COMPLETE = "_complete.json"

_OPENED: collections.OrderedDict[str, dict[int, tuple[pa.Table, np.ndarray]]] = collections.OrderedDict()
_KEEP_VERSIONS = 4  # a few snapshots, plus the previous version of each while a new one takes over (a deleted
# version's files stay on disk while mapped)


@dataclass(frozen=True)
class MappedLookup:
    """One lookup against a version's lookup files, as shipped to the workers.

    Attributes:
        folder: the local folder of the lookup files (``b<bucket>.arrow``).
        partitions: P, the version's buckets (a key's bucket is ``pmod(hash(__lk), P)``).
        overlay: Arrow IPC bytes of the overlay (``__lk, __lh, __deleted`` + values), ``None`` when empty.
        value_columns: snapshot value columns to join.
        out_names: their names in the output (prefixed).
    """

    folder: str
    partitions: int
    overlay: bytes | None = None
    value_columns: tuple[str, ...] = ()
    out_names: tuple[str, ...] = ()

    @property
    def token(self) -> str:
        """Identity of the base: its folder (the overlay cache is keyed by it)."""
        return self.folder


def bucket_file(folder: str, bucket: int) -> str:
    """The lookup file of one bucket."""
    return os.path.join(folder, f"b{bucket:05d}.arrow")


def is_complete(folder: str, partitions: int) -> bool:
    """Whether a version's lookup files were all written (for ``partitions`` buckets)."""
    try:
        with open(os.path.join(folder, COMPLETE)) as fh:
            return int(json.load(fh)["partitions"]) == partitions
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _write_ipc(path: str, table: pa.Table) -> None:
    """Write ``table`` as one record batch (zero-copy numpy views when mapped), atomically."""
    from pyarrow import ipc

    tmp = f"{path}.tmp-{uuid.uuid4().hex}"
    with ipc.new_file(tmp, table.schema) as out:
        out.write_table(table, max_chunksize=max(table.num_rows, 1))
    os.replace(tmp, path)


def _bucket_of(name: str) -> int | None:
    """The bucket of a data file as Spark's bucketed writer names it (``part-...-<uuid>_<bucket>.c000...``)."""
    match = re.match(r".*_(\d+)(?:\..*)?$", name)
    return int(match.group(1)) if match and name.endswith(".parquet") else None


def write_lookup_files(spark: Any, data: str, folder: str, partitions: int, schema: Any) -> int:
    """Write the lookup files of a version (a Spark job: one task per bucket, no shuffle).

    Each task reads its bucket's Parquet files with pyarrow (the version is on
    a local file system, or there would be no lookup files), sorts them by
    ``__lh`` and writes them as one Arrow IPC record batch, cast to the types
    Spark's own Arrow conversion gives (what the lookup UDF returns to Spark).

    Args:
        spark: the SparkSession.
        data: the version's data folder (a local path; Spark's bucketed Parquet).
        folder: the local folder to write into (created; an older content is replaced).
        partitions: P, the version's buckets.
        schema: the version's Spark schema (``__lk, __lh`` + values).

    Returns:
        The rows written (the version's keys).

    Raises:
        RuntimeError: a data file does not name its bucket as Spark's bucketed writer does.
    """
    from stream_app.snapshot.arrow_tables import arrow_schema, nullable_schema

    os.makedirs(folder, exist_ok=True)
    try:
        os.remove(os.path.join(folder, COMPLETE))
    except FileNotFoundError:
        pass
    files: dict[int, list[str]] = {}
    for name in sorted(os.listdir(data)):
        if name.startswith(("_", ".")):
            continue
        bucket = _bucket_of(name)
        if bucket is None or not 0 <= bucket < partitions:
            raise RuntimeError(f"lookup files: {data}/{name} is not a bucket file of {partitions} buckets")
        files.setdefault(bucket, []).append(os.path.join(data, name))
    target = nullable_schema(arrow_schema(schema))

    def write(item: tuple[int, list[str]]) -> int:  # on an executor, per bucket
        import pyarrow.parquet as pq

        prepare_worker()
        bucket, paths = item
        table = pq.read_table(paths, coerce_int96_timestamp_unit="us").select(target.names)
        _write_ipc(bucket_file(folder, bucket), table.cast(target).sort_by(LH).combine_chunks())
        return table.num_rows

    work = [(b, files.get(b, [])) for b in range(partitions)]
    full = [item for item in work if item[1]]
    rows = sum(spark.sparkContext.parallelize(full, max(len(full), 1)).map(write).collect()) if full else 0
    for bucket, paths in work:  # an empty bucket: an empty file of the same schema, so a worker never guesses
        if not paths:
            _write_ipc(bucket_file(folder, bucket), target.empty_table())
    with open(os.path.join(folder, COMPLETE), "w") as fh:
        json.dump({"partitions": partitions, "rows": rows}, fh)
    return rows


def _bucket(lookup: MappedLookup, bucket: int) -> tuple[pa.Table, np.ndarray]:
    """The mapped table of one bucket and its ``__lh`` as a numpy view (cached per worker)."""
    from pyarrow import ipc

    opened = _OPENED.get(lookup.folder)
    if opened is None:
        opened = _OPENED[lookup.folder] = {}
        while len(_OPENED) > _KEEP_VERSIONS:
            _OPENED.popitem(last=False)
    else:
        _OPENED.move_to_end(lookup.folder)
    held = opened.get(bucket)
    if held is None:
        table = ipc.open_file(pa.memory_map(bucket_file(lookup.folder, bucket))).read_all()
        column = table.column(LH)
        hashes = column.chunk(0).to_numpy() if column.num_chunks == 1 else column.to_numpy()
        held = opened[bucket] = (table, hashes)
    return held


def probe_sorted(table: pa.Table, hashes_sorted: np.ndarray, keys: pa.Array, hashes: np.ndarray) -> np.ndarray:
    """Positions in a table sorted by ``__lh`` of each key, ``-1`` where absent.

    Args:
        table: the bucket's table (``__lk``, ``__lh`` sorted ascending).
        hashes_sorted: its ``__lh`` as numpy.
        keys: lookup keys (string, nullable).
        hashes: their ``xxhash64`` (int64).

    Returns:
        An int64 array, one position per key. Keys that share a hash are
        adjacent in the table; each candidate is confirmed by comparing keys.
    """
    n = len(hashes_sorted)
    if n == 0 or len(keys) == 0:
        return np.full(len(keys), -1, dtype=np.int64)
    pos = np.minimum(np.searchsorted(hashes_sorted, hashes), n - 1).astype(np.int64)
    found = (hashes_sorted[pos] == hashes) & keys.is_valid().to_numpy(zero_copy_only=False)
    candidates = np.flatnonzero(found)
    if candidates.size:
        stored = table.column(LK).take(pa.array(pos[candidates]))
        same = pc.equal(stored, keys.take(pa.array(candidates))).fill_null(False).to_numpy(zero_copy_only=False)
        for i in candidates[~same]:  # another key with the same hash first (about 1 in 10^7 keys at 10M): walk on
            found[i] = False
            j, key = pos[i] + 1, keys[i].as_py()
            while j < n and hashes_sorted[j] == hashes[i]:
                if table.column(LK)[j].as_py() == key:
                    pos[i], found[i] = j, True
                    break
                j += 1
    return np.where(found, pos, -1)


def lookup_columns(lookup: MappedLookup, keys: pa.Array, hashes: pa.Array, buckets: np.ndarray) -> pa.Table:
    """The joined columns of a batch of event keys: the version's values, overridden by the overlay.

    Args:
        lookup: the lookup (its files and overlay).
        keys: event lookup keys (string, nullable).
        hashes: their ``xxhash64`` (long).
        buckets: their bucket, ``pmod(hash(key), P)`` (int).

    Returns:
        One row per key: the value columns under their output names, then
        ``__matched`` (false where the key is absent or deleted: all values null).
    """
    count = len(keys)
    wanted = hashes.fill_null(0).to_numpy(zero_copy_only=False)
    order = np.argsort(buckets, kind="stable")
    starts = np.flatnonzero(np.diff(buckets[order])) + 1
    matched = np.zeros(count, dtype=bool)
    pieces: dict[str, list[pa.Array]] = {c: [] for c in lookup.value_columns}
    for group in np.split(order, starts):
        if group.size == 0:
            continue
        table, hashes_sorted = _bucket(lookup, int(buckets[group[0]]))
        pos = probe_sorted(table, hashes_sorted, keys.take(pa.array(group)), wanted[group])
        matched[group] = pos >= 0
        for column in lookup.value_columns:
            pieces[column].append(take(table.column(column), pos))
    back = np.empty(count, dtype=np.int64)
    back[order] = np.arange(count)
    restore = pa.array(back)
    values = {
        column: pa.concat_arrays(parts).take(restore) if parts else pa.nulls(0) for column, parts in pieces.items()
    }
    return with_overlay(lookup, keys, hashes, matched, values)


def mapped_udf_function(lookup: MappedLookup) -> Any:
    """The function of a scalar iterator pandas UDF ``(key, hash, bucket) -> struct<values..., __matched>``."""
    import pandas as pd

    def run(batches: Iterator[tuple[pd.Series, pd.Series, pd.Series]]) -> Iterator[pd.DataFrame]:
        prepare_worker()
        for keys, hashes, buckets in batches:
            table = lookup_columns(
                lookup,
                pa.Array.from_pandas(keys, type=pa.string()),
                pa.Array.from_pandas(hashes, type=pa.int64()),
                buckets.to_numpy(dtype=np.int64, na_value=0),
            )
            yield table.to_pandas(maps_as_pydicts="strict")  # Spark converts a map from a dict

    run.__annotations__ = {  # Spark infers the UDF kind from these objects (see indexed.lookup_udf_function)
        "batches": typing.Iterator[tuple[pd.Series, pd.Series, pd.Series]],
        "return": typing.Iterator[pd.DataFrame],
    }
    return run


def warm_udf_function(lookups: list[MappedLookup]) -> Any:
    """A :func:`~stream_app.snapshot.indexed.warm_function` that maps every bucket's file in a worker.

    Run right after a version's files are written or found (a restart), it moves
    a Python worker's start, its imports and the mapping off the first micro-batch.
    """

    def load() -> None:
        for lookup in lookups:
            for bucket in range(lookup.partitions):
                _bucket(lookup, bucket)

    return warm_function(load)
