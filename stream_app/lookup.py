"""The broadcast lookup, run inside Spark's Python workers by ``mapInArrow``.

Why not Spark's own broadcast join: every micro-batch is a new plan, and a
broadcast exchange is rebuilt (collected, shipped, hashed) for every plan, so
each batch pays for the whole snapshot (STACK.md: 1.85 s per 50k-event batch
at 1M keys against 0.44 s at 10k). Here the snapshot's *base* is a Spark
broadcast variable of Arrow IPC bytes, created once per base; each Python
worker deserializes it and builds a hash index (pandas ``Index`` over the
64-bit ``__lh``) once, and keeps both across tasks and micro-batches (workers
are reused, ``spark.python.worker.reuse``). A micro-batch ships only the small
*overlay* of changes newer than the base. The cost of a batch is then a hash
probe and an Arrow ``take`` per event: it follows the events, not the snapshot.

A hash hit is confirmed by comparing ``__lk`` strings, so two keys with the
same 64-bit hash can never be confused; when the base itself holds two keys
with one hash (about 1 in 10^7 at 1M keys), that base is indexed by the
strings instead.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger(__name__)

_BASES: collections.OrderedDict[str, tuple[pa.Table, Any, bool]] = collections.OrderedDict()
_OVERLAYS: collections.OrderedDict[tuple[str, int], tuple[pa.Table, Any, bool]] = collections.OrderedDict()
_KEEP_BASES = 4  # a few snapshots, plus the previous base of each while a new one takes over
_KEEP_OVERLAYS = 8


@dataclass(frozen=True)
class ArrowLookup:
    """One lookup, as shipped to the workers.

    Attributes:
        token: identity of the base (one cached index per token and worker).
        base: Spark broadcast of the base's Arrow IPC bytes (``__lk, __lh`` + values).
        overlay: Arrow IPC bytes of the overlay (``__lk, __lh, __deleted`` +
            values, one row per key), ``None`` when empty.
        key_column: event-side lookup key column (string).
        hash_column: event-side ``xxhash64`` of it (long).
        value_columns: snapshot value columns to join.
        out_names: their names in the output (prefixed).
        inner: drop events without a match.
    """

    token: str
    base: Any
    overlay: bytes | None
    key_column: str
    hash_column: str
    value_columns: tuple[str, ...]
    out_names: tuple[str, ...]
    inner: bool


def _index(table: pa.Table) -> tuple[Any, bool]:
    """A pandas hash index over ``__lh`` (or over ``__lk`` when two keys share a hash)."""
    import pandas as pd

    index = pd.Index(table.column("__lh").to_numpy())
    if index.is_unique:
        return index, False
    log.warning("two snapshot keys share a 64-bit hash: indexing %d keys by string", table.num_rows)
    return pd.Index(table.column("__lk").to_pandas()), True


def _base(lookup: ArrowLookup) -> tuple[pa.Table, Any, bool]:
    cached = _BASES.get(lookup.token)
    if cached is None:
        table = pa.ipc.open_stream(lookup.base.value).read_all().combine_chunks()
        cached = (table, *_index(table))
        _BASES[lookup.token] = cached
        while len(_BASES) > _KEEP_BASES:
            _BASES.popitem(last=False)
    else:
        _BASES.move_to_end(lookup.token)
    return cached


def _overlay(lookup: ArrowLookup) -> tuple[pa.Table, Any, bool] | None:
    if lookup.overlay is None:
        return None
    key = (lookup.token, hash(lookup.overlay))
    cached = _OVERLAYS.get(key)
    if cached is None:
        table = pa.ipc.open_stream(lookup.overlay).read_all().combine_chunks()
        cached = (table, *_index(table))
        _OVERLAYS[key] = cached
        while len(_OVERLAYS) > _KEEP_OVERLAYS:
            _OVERLAYS.popitem(last=False)
    return cached


def probe(table: pa.Table, index: Any, by_key: bool, keys: pa.Array, hashes: pa.Array) -> np.ndarray:
    """Positions in ``table`` of each event key, ``-1`` where absent.

    Args:
        table: the indexed table (``__lk`` column).
        index: its pandas index (over ``__lh``, or ``__lk`` when ``by_key``).
        by_key: whether ``index`` is over the strings.
        keys: event lookup keys (string, nullable).
        hashes: their ``xxhash64`` (long, null where the key is null).

    Returns:
        An int64 array, one position per event.
    """
    valid = keys.is_valid().to_numpy(zero_copy_only=False)
    if by_key:
        pos = index.get_indexer(keys.fill_null("").to_pandas())
    else:
        pos = index.get_indexer(hashes.fill_null(0).to_numpy(zero_copy_only=False))
        hit = np.flatnonzero(pos >= 0)
        if hit.size:
            same = pc.equal(table.column("__lk").take(pa.array(pos[hit])), keys.take(pa.array(hit)))
            pos[hit[~same.fill_null(False).to_numpy(zero_copy_only=False)]] = -1
    pos = pos.astype(np.int64, copy=False)
    pos[~valid] = -1
    return pos


def _take(column: Any, pos: np.ndarray) -> pa.Array:
    taken = column.take(pa.array(pos, mask=pos < 0))
    return taken.combine_chunks() if isinstance(taken, pa.ChunkedArray) else taken


def join_batch(batch: pa.RecordBatch, lookups: Sequence[ArrowLookup], passthrough: str | None) -> pa.RecordBatch:
    """Join one Arrow batch of events against every lookup.

    Args:
        batch: events with the lookups' key and hash columns.
        lookups: the lookups, in order.
        passthrough: a column whose non-null rows are never dropped by an inner
            lookup (records on their way to the dead letter topic).

    Returns:
        The batch without the key/hash columns, plus the joined columns, inner
        misses removed.
    """
    internal = {c for lk in lookups for c in (lk.key_column, lk.hash_column)}
    names = [n for n in batch.schema.names if n not in internal]
    arrays = [batch.column(n) for n in names]
    keep: np.ndarray | None = None
    for lookup in lookups:
        keys, hashes = batch.column(lookup.key_column), batch.column(lookup.hash_column)
        base, index, by_key = _base(lookup)
        pos = probe(base, index, by_key, keys, hashes)
        matched = pos >= 0
        overlay = _overlay(lookup)
        ov_pos = None
        if overlay is not None:
            ov_pos = probe(*overlay, keys, hashes)
            in_overlay = ov_pos >= 0
            if in_overlay.any():
                deleted = overlay[0].column("__deleted").to_numpy()[ov_pos[in_overlay]]
                matched = np.where(in_overlay, False, matched)
                matched[np.flatnonzero(in_overlay)[~deleted]] = True
                pos = np.where(in_overlay, -1, pos)
                ov_pos = np.where(in_overlay, ov_pos, -1)
                ov_pos[np.flatnonzero(in_overlay)[deleted]] = -1
            else:
                ov_pos = None
        for column, out in zip(lookup.value_columns, lookup.out_names, strict=True):
            values = _take(base.column(column), pos)
            if ov_pos is not None:
                from_overlay = _take(overlay[0].column(column), ov_pos)
                values = pc.if_else(pa.array(ov_pos >= 0), from_overlay, values)
            arrays.append(values)
            names.append(out)
        if lookup.inner:
            keep = matched if keep is None else keep & matched
    out = pa.RecordBatch.from_arrays(arrays, names=names)
    if keep is not None and not keep.all():
        if passthrough is not None:
            keep = keep | batch.column(passthrough).is_valid().to_numpy(zero_copy_only=False)
        out = out.filter(pa.array(keep))
    return out


def lookup_function(lookups: Sequence[ArrowLookup], out_schema: pa.Schema, passthrough: str | None) -> Any:
    """The function ``DataFrame.mapInArrow`` runs: joins every batch of a partition.

    Args:
        lookups: what to join.
        out_schema: the Arrow schema Spark expects back (from the declared Spark schema).
        passthrough: see :func:`join_batch`.
    """
    lookups = tuple(lookups)

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            joined = join_batch(batch, lookups, passthrough)
            yield joined if joined.schema.equals(out_schema) else joined.cast(out_schema)

    return run


def warm(lookups: Sequence[ArrowLookup]) -> Any:
    """A function for ``RDD.mapPartitions`` that loads bases into a worker's cache (yields its pid).

    Run on every executor core right after a new base is broadcast, it moves
    the load (deserialize, build the index) off the next micro-batch.
    """
    lookups = tuple(lookups)

    def run(_: Any) -> Iterator[int]:
        import os

        for lookup in lookups:
            _base(lookup)
        yield os.getpid()

    return run

