"""The versions table of a versioned snapshot as data: records to validity intervals ``[__from, __to)``.

Per key, records ordered by their source time (:func:`record_time`) become the
intervals of its versions, a tombstone ending the one before it
(:func:`intervals`); new records are merged into a stored table by re-sorting
only the keys they touch (:func:`merge_versions`). Pure functions of
DataFrames; the store that keeps the table is :mod:`stream_app.snapshot.versioned`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kernel.updates import SOURCE_TS_HEADER
from stream_app.snapshot.data import DELETED, LK, OFFSET, PARTITION, RANK

FROM, TO, TS = "__from", "__to", "__ts"
KIND = "__kind"  # order of rows of the same time: a stored interval's end, its start, then new records


def _f() -> Any:
    from pyspark.sql import functions

    return functions


def record_time() -> Any:
    """A record's source time, epoch ms (long column of Spark's Kafka rows read with headers).

    The ``threes.source_ts`` header (8 bytes, big-endian) when the record has one,
    else the Kafka record timestamp (CreateTime, or LogAppendTime on topics set so).
    """
    from stream_app.records import header_value

    f = _f()
    stamped = header_value(f.col("headers"), SOURCE_TS_HEADER)
    from_header = f.when(f.length(stamped) == 8, f.conv(f.hex(stamped), 16, 10).cast("long"))
    return f.coalesce(from_header, f.unix_millis(f.col("timestamp")))


def intervals(records: Any, value_columns: Sequence[str]) -> Any:
    """Validity intervals of versions from records ordered per key by time (tombstones end intervals).

    Args:
        records: ``__lk, __ts, __deleted, __kind, __rank, __partition, __offset`` + value columns.
        value_columns: the value columns.

    Returns:
        ``__lk, __from, __to`` + value columns: one row per non-empty interval of a live version.
    """
    from pyspark.sql import Window

    f = _f()
    order = Window.partitionBy(LK).orderBy(TS, KIND, RANK, PARTITION, OFFSET)
    nxt = f.lead(f.col(TS)).over(order)
    return (
        records.select(LK, TS, DELETED, *value_columns, nxt.alias(TO))
        .filter(~f.col(DELETED) & (f.col(TO).isNull() | (f.col(TO) > f.col(TS))))
        .select(LK, f.col(TS).alias(FROM), TO, *value_columns)
    )


def merge_versions(stored: Any, records: Any, value_columns: Sequence[str], horizon_ms: int | None) -> Any:
    """The versions table after new records: only the keys they touch are re-sorted.

    Args:
        stored: the versions table (``__lk, __from, __to`` + values) or ``None``.
        records: new records, ``__lk, __ts, __deleted, __rank, __partition, __offset`` + values.
        value_columns: the value columns.
        horizon_ms: versions that ended at or before it are dropped; ``None`` keeps all.

    Returns:
        The new versions table (``__lk, __from, __to`` + values).
    """
    f = _f()
    new = records.select(LK, TS, DELETED, f.lit(2).alias(KIND), RANK, PARTITION, OFFSET, *value_columns)
    if stored is None:
        merged = intervals(new, value_columns)
    else:
        touched = new.select(LK).distinct()
        kept = stored.join(touched, LK, "left_anti")
        old = stored.join(touched, LK, "left_semi")
        zero = [f.lit(0).alias(RANK), f.lit(0).cast("int").alias(PARTITION), f.lit(0).cast("long").alias(OFFSET)]
        starts = old.select(LK, f.col(FROM).alias(TS), f.lit(False).alias(DELETED), f.lit(1).alias(KIND), *zero,
                            *value_columns)
        types = dict(stored.dtypes)
        ends = old.filter(f.col(TO).isNotNull()).select(
            LK, f.col(TO).alias(TS), f.lit(True).alias(DELETED), f.lit(0).alias(KIND), *zero,
            *[f.lit(None).cast(types[c]).alias(c) for c in value_columns],
        )
        merged = kept.unionByName(intervals(new.unionByName(starts).unionByName(ends), value_columns))
    if horizon_ms is not None:
        merged = merged.filter(f.col(TO).isNull() | (f.col(TO) > f.lit(horizon_ms)))
    return merged
