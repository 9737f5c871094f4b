"""The indexed lookup, run inside Spark's Python workers by a scalar pandas UDF.

Why not Spark's own broadcast join: every micro-batch is a new plan, and a
broadcast exchange is rebuilt (collected, shipped, hashed) for every plan, so
each batch pays for the whole snapshot (its cost per batch grows with the
snapshot's keys, see ``broadcast_join_per_batch`` in benchmarks/RESULTS.md). Here the snapshot's *base* is a Spark
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
import typing
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stream_app.python_worker import prepare as prepare_worker

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
        value_columns: snapshot value columns to join.
        out_names: their names in the output (prefixed).
    """

    token: str
    base: Any
    overlay: bytes | None
    value_columns: tuple[str, ...]
    out_names: tuple[str, ...]


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


def take(column: Any, pos: np.ndarray) -> pa.Array:
    """``column`` at ``pos`` (int64 positions), null where a position is ``-1``."""
    taken = column.take(pa.array(pos, mask=pos < 0))
    return taken.combine_chunks() if isinstance(taken, pa.ChunkedArray) else taken


MATCHED = "__matched"


def lookup_columns(lookup: ArrowLookup, keys: pa.Array, hashes: pa.Array) -> pa.Table:
    """The joined columns of a batch of event keys: base values, overridden by the overlay.

    Args:
        lookup: the lookup (its base and overlay).
        keys: event lookup keys (string, nullable).
        hashes: their ``xxhash64`` (long).

    Returns:
        One row per key: the value columns under their output names, then
        ``__matched`` (false where the key is absent or deleted: all values null).
    """
    base, index, by_key = _base(lookup)
    pos = probe(base, index, by_key, keys, hashes)
    values = {column: take(base.column(column), pos) for column in lookup.value_columns}
    return with_overlay(lookup, keys, hashes, pos >= 0, values)


def with_overlay(
    lookup: Any, keys: pa.Array, hashes: pa.Array, matched: np.ndarray, values: dict[str, pa.Array]
) -> pa.Table:
    """The base's values of a batch of keys with the overlay applied on top, as the UDF returns them.

    Args:
        lookup: the lookup (``token``, ``overlay``, ``value_columns``, ``out_names``).
        keys: event lookup keys (string, nullable).
        hashes: their ``xxhash64`` (long).
        matched: whether the base holds each key (bool, one per key).
        values: the base's value per key and value column (null where not matched).

    Returns:
        The value columns under their output names, then ``__matched``: a key
        the overlay changed takes the overlay's values, a key it deleted has
        none (null values, not matched).
    """
    overlay = _overlay(lookup)
    if overlay is not None:
        ov_pos = probe(*overlay, keys, hashes)
        in_overlay = ov_pos >= 0
        if in_overlay.any():
            deleted = overlay[0].column("__deleted").to_numpy()[ov_pos[in_overlay]]
            matched = matched.copy()
            matched[in_overlay] = ~deleted
            ov_pos[np.flatnonzero(in_overlay)[deleted]] = -1
            mask = pa.array(in_overlay)
            values = {
                column: pc.if_else(mask, take(overlay[0].column(column), ov_pos), base)
                for column, base in values.items()
            }
    pairs = zip(lookup.value_columns, lookup.out_names, strict=True)
    columns: dict[str, Any] = {out: values[column] for column, out in pairs}
    columns[MATCHED] = pa.array(matched)
    return pa.table(columns)


def lookup_udf_function(lookup: ArrowLookup) -> Any:
    """The function of a scalar iterator pandas UDF ``(key, hash) -> struct<values..., __matched>``.

    A scalar UDF sends only its arguments to the Python worker and Spark puts
    the result back beside each row in the JVM: the events themselves never
    cross into Python (measured 0.6-0.9 s per 50k-event batch against 0.7-2.5 s
    when whole rows went through ``mapInArrow``, 1M keys).
    """
    import pandas as pd

    def run(batches: Iterator[tuple[pd.Series, pd.Series]]) -> Iterator[pd.DataFrame]:
        prepare_worker()
        for keys, hashes in batches:
            table = lookup_columns(
                lookup, pa.Array.from_pandas(keys, type=pa.string()), pa.Array.from_pandas(hashes, type=pa.int64())
            )
            yield table.to_pandas(maps_as_pydicts="strict")  # Spark converts a map from a dict

    # Spark infers the UDF kind from these hints; this module's annotations are strings
    # (``from __future__ import annotations``) that Spark cannot resolve, so give it the objects.
    run.__annotations__ = {
        "batches": typing.Iterator[tuple[pd.Series, pd.Series]],
        "return": typing.Iterator[pd.DataFrame],
    }
    return run


def warm_function(load: Callable[[], None]) -> Any:
    """The function of a scalar pandas UDF that runs ``load`` in a Python worker first (returns its pid).

    Run as a tiny job right after a new base is installed, it moves a worker's
    start and the base's load off the next micro-batch. It must be a SQL Python
    UDF like the lookups: Spark keeps those workers in another pool than the
    RDD API's.
    """
    import os

    import pandas as pd

    def run(batches: Iterator[pd.Series]) -> Iterator[pd.Series]:
        prepare_worker()
        load()
        for batch in batches:
            yield pd.Series([os.getpid()] * len(batch), dtype="int64")

    run.__annotations__ = {"batches": typing.Iterator[pd.Series], "return": typing.Iterator[pd.Series]}
    return run


def warm_udf_function(lookups: Sequence[ArrowLookup]) -> Any:
    """A :func:`warm_function` that loads bases into a worker's cache (deserialize, build the index)."""
    lookups = tuple(lookups)

    def load() -> None:
        for lookup in lookups:
            _base(lookup)

    return warm_function(load)
