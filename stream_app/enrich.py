"""Enrichment: events joined to snapshots, a pure function of DataFrames.

:func:`enrich` adds, per lookup, the snapshot's value fields under the
lookup's prefix: ``left`` keeps events without a match (joined fields null),
``inner`` drops them. The event side of a lookup may be any event field(s)
(a foreign key), composite keys included, and the same snapshot may be used
by several lookups (origin and destination airports).

Engines, chosen per snapshot by its size:

* **broadcast** (up to ``broadcast_max_rows`` keys, 100k by default): Spark's
  broadcast hash join against the base, a small cached DataFrame. Spark
  broadcasts it again for every micro-batch (each batch is a new plan), which
  costs little while the snapshot is small; a GlobalKTable is replicated too.
* **partitioned** (above): a sort-merge join against the base, which the
  executors keep hash-partitioned and sorted by lookup key (cached, or the
  bucketed Parquet of its version)
  (:mod:`stream_app.snapshot.partitioned`): only the events are shuffled and
  sorted; the base is scanned where it lives. With versions on a local file
  system (``partitioned_join: lookup``, the default) the events are not joined
  but looked up: the same scalar pandas UDF as the indexed engine searches the
  version's hash-sorted lookup files, memory-mapped by the Python workers
  (:mod:`stream_app.snapshot.mapped`): no shuffle, no scan of the base.
* **indexed** (opt-in, from ``index_min_rows``): a scalar pandas UDF per lookup
  probes a hash index that every Python worker keeps of the whole base
  (:mod:`stream_app.snapshot.indexed`); only the keys cross into Python, but
  each worker holds a copy outside the JVM's memory accounting.

* **jvm** (``stream.mode: realtime`` only): a JVM UDF reads the executor's GlobalKTable-like store of
  the snapshot (:mod:`stream_app.realtime`); no join, no Python, no data on the driver.

In the Spark engines the small overlay of newer changes is joined by
broadcast after the base, and its rows (tombstones included) win.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from stream_app.columns import ColumnCache, rows_where
from stream_app.config import LookupConfig
from stream_app.snapshot.as_of_join import event_time_ms, join_as_of
from stream_app.snapshot.data import DELETED, LK, event_lookup_key
from stream_app.snapshot.indexed import MATCHED, ArrowLookup, lookup_udf_function
from stream_app.snapshot.mapped import MappedLookup, mapped_udf_function
from stream_app.snapshot.view import SnapshotView


@dataclass(frozen=True)
class BoundLookup:
    """A lookup bound to the snapshot view a micro-batch joins against.

    Attributes:
        config: the lookup from YAML.
        view: the snapshot view.
    """

    config: LookupConfig
    view: SnapshotView
    too_old: Any = None  # as_of: an Observation of the events older than the retention (``too_old``)

    def value_columns(self) -> list[str]:
        """The snapshot fields this lookup joins."""
        return list(self.config.fields or self.view.value_type.fieldNames())


def joined_fields(lookup: BoundLookup) -> list[Any]:
    """The Spark fields a lookup adds (nullable: a left join leaves them null)."""
    from pyspark.sql import types as T

    value_type = lookup.view.value_type
    return [
        T.StructField(f"{lookup.config.prefix}{name}", value_type[name].dataType, True)
        for name in lookup.value_columns()
    ]


def enrich(
    events: Any,
    lookups: Sequence[BoundLookup],
    passthrough: str | None = None,
    cache: ColumnCache | None = None,
    ids: Sequence[int] | None = None,
) -> Any:
    """Join events to snapshots.

    Args:
        events: a DataFrame of events (their fields as columns; other columns
            are carried along; a lookup's key columns may be any of them).
        lookups: the lookups, in order; joined columns are appended in this order.
        passthrough: name of a column whose non-null rows are never dropped by
            an inner lookup (the job routes such rows to the dead letter topic).
        cache: where the column expressions are kept between micro-batches (a job's
            :class:`~stream_app.columns.ColumnCache`); a fresh one when ``None``.
        ids: each lookup's index in the job (names its helper columns and cache entries, so the
            rounds of a chain do not collide); ``0..n-1`` when ``None``.

    Returns:
        ``events``' columns followed by each lookup's prefixed columns.

    Raises:
        ValueError: a joined column name collides with an existing column, or a
            lookup does not map every snapshot key field.
    """
    cache = cache if cache is not None else ColumnCache()
    _check_collisions(events.columns, lookups)
    if not lookups:
        return events
    columns = tuple(events.columns)
    numbered = list(zip(ids if ids is not None else range(len(lookups)), lookups, strict=True))
    df = _with_lookup_keys(events, numbered, cache)
    # as_of lookups join the versions table by Spark whatever the engine of the latest values
    indexed = [(i, lk) for i, lk in numbered if _in_python(lk.view) and lk.config.as_of is None]
    if indexed:
        df = _indexed_lookups(df, indexed, passthrough)
    for i, lookup in numbered:
        if lookup.view.mode == "jvm":  # the JVM store answers as_of lookups too
            df = _jvm_lookup(df, i, lookup, passthrough, cache)
        elif lookup.config.as_of is not None:
            df = _as_of_lookup(df, i, lookup, passthrough)
        elif not _in_python(lookup.view):
            df = _spark_lookup(df, i, lookup, passthrough, cache)
    out = cache.get(
        ("enriched columns", columns, tuple(fld.name for lookup in lookups for fld in joined_fields(lookup))),
        lambda: cache.cols(list(columns) + [fld.name for lookup in lookups for fld in joined_fields(lookup)]),
    )
    return cache.select(df, out)


def _check_collisions(columns: Sequence[str], lookups: Sequence[BoundLookup]) -> None:
    """Raise ``ValueError`` when a joined column would repeat an event column or another lookup's column."""
    existing = set(columns)
    for lookup in lookups:
        for fld in joined_fields(lookup):
            if fld.name in existing:
                raise ValueError(f"joined column {fld.name!r} already exists: choose another prefix")
            existing.add(fld.name)


def _with_lookup_keys(events: Any, numbered: Sequence[tuple[int, BoundLookup]], cache: ColumnCache) -> Any:
    """``events`` with each lookup's key ``__lk<i>`` and its hash ``__lh<i>`` (two projections, cached columns)."""
    from pyspark.sql import functions as f

    star = cache.col("*")

    def key_of(i: int, lookup: BoundLookup) -> Any:
        return event_lookup_key(lookup.config.on, lookup.view.key_type).alias(f"__lk{i}")

    def hash_of(i: int) -> Any:
        return f.xxhash64(f.col(f"__lk{i}")).alias(f"__lh{i}")

    keys = [
        cache.get(("lookup key", i, id(lookup.config), lookup.view.key_type.simpleString()), partial(key_of, i, lookup))
        for i, lookup in numbered
    ]
    hashes = [cache.get(("lookup hash", i), partial(hash_of, i)) for i, _lookup in numbered]
    # two projections: the hash reads the key computed by the first
    return cache.select(cache.select(events, [star, *keys]), [star, *hashes])


def _in_python(view: SnapshotView) -> bool:
    """Whether a lookup runs in the Python workers (indexed engine, or a partitioned base's lookup files)."""
    return view.mode == "indexed" or (view.mode == "partitioned" and view.lookup_files is not None)


def _indexed_lookups(df: Any, lookups: Sequence[tuple[int, BoundLookup]], passthrough: str | None) -> Any:
    """The lookups run in Python: one scalar pandas UDF each, in one projection (Spark evaluates them together)."""
    from pyspark.sql import functions as f
    from pyspark.sql import types as T

    joined = []
    for i, lookup in lookups:
        view = lookup.view
        added = joined_fields(lookup)
        result = T.StructType([*added, T.StructField(MATCHED, T.BooleanType(), True)])
        values, out_names = tuple(lookup.value_columns()), tuple(fld.name for fld in added)
        key, hashed = f.col(f"__lk{i}"), f.col(f"__lh{i}")
        if view.mode == "indexed":
            spec = ArrowLookup(view.token, view.broadcast, view.overlay_ipc(), values, out_names)
            udf = f.pandas_udf(lookup_udf_function(spec), result)  # type: ignore[call-overload]
            joined.append(udf(key, hashed).alias(f"__j{i}"))
        else:  # a partitioned version's lookup files; a key's bucket as Spark's bucketing computes it
            assert view.lookup_files is not None
            mapped = MappedLookup(view.lookup_files, view.partitions, view.overlay_ipc(), values, out_names)
            udf = f.pandas_udf(mapped_udf_function(mapped), result)  # type: ignore[call-overload]
            bucket = f.pmod(f.hash(key), f.lit(view.partitions))
            joined.append(udf(key, hashed, bucket).alias(f"__j{i}"))
    df = df.select("*", *joined)
    expanded = [f.col(f"__j{i}")[fld.name].alias(fld.name) for i, lookup in lookups for fld in joined_fields(lookup)]
    kept = None
    for i, lookup in lookups:
        if lookup.config.how == "inner":
            cond = f.col(f"__j{i}")[MATCHED]
            if passthrough is not None:
                cond = cond | f.col(passthrough).isNotNull()
            kept = cond if kept is None else kept & cond
    if kept is None:
        return df.select("*", *expanded)
    # not a filter, which Spark pushed below the lookups with the UDF copied in: each lookup ran twice a batch
    return rows_where(df, kept, [*(df[c].alias(c) for c in df.columns), *expanded])


@dataclass(frozen=True)
class _LookupColumns:
    """The column expressions of one Spark-engine lookup (see :func:`_spark_lookup`)."""

    base: list[Any]  # the base's projection
    overlay: list[Any] | None  # the overlay's projection (None: no overlay this batch)
    value: Any  # the joined value struct, null when nothing matched (or the overlay deleted the key)
    keep: Any | None  # the inner lookup's filter
    expanded: list[Any]  # the value's fields under their joined names


def _lookup_columns(
    i: int, lookup: BoundLookup, passthrough: str | None, has_overlay: bool
) -> _LookupColumns:
    from pyspark.sql import functions as f

    view = lookup.view
    values = lookup.value_columns()
    key = f"__lk{i}"
    if view.mode == "broadcast":
        base = [f.col(LK).alias(key), f.struct(*values).alias(f"__b{i}")]
        value = f.col(f"__b{i}")
    else:
        # partitioned: the base's columns are joined flat (a struct built per base row would cost a
        # projection of the whole base per batch) and made a struct for the matched events only; the
        # base (cached or its version's files) is partitioned and sorted by __lk: only the events are shuffled, sorted
        base = [f.col(LK).alias(key), f.col(LK).alias(f"__bk{i}"),
                *[f.col(name).alias(f"__b{i}_{j}") for j, name in enumerate(values)]]
        value = f.when(
            f.col(f"__bk{i}").isNotNull(),
            f.struct(*[f.col(f"__b{i}_{j}").alias(name) for j, name in enumerate(values)]),
        )
    overlay = None
    if has_overlay:
        overlay = [
            f.col(LK).alias(key),
            f.struct(*values).alias(f"__o{i}"),
            f.lit(True).alias(f"__oh{i}"),
            f.col(DELETED).alias(f"__od{i}"),
        ]
        value = f.when(f.col(f"__oh{i}").isNotNull(), f.when(~f.col(f"__od{i}"), f.col(f"__o{i}"))).otherwise(value)
    keep = None
    if lookup.config.how == "inner":
        keep = f.col(f"__v{i}").isNotNull()
        if passthrough is not None:
            keep = keep | f.col(passthrough).isNotNull()
    expanded = [f.col(f"__v{i}")[name].alias(fld.name) for name, fld in zip(values, joined_fields(lookup), strict=True)]
    return _LookupColumns(base, overlay, value.alias(f"__v{i}"), keep, expanded)


def _spark_lookup(df: Any, i: int, lookup: BoundLookup, passthrough: str | None, cache: ColumnCache) -> Any:
    """One lookup joined by Spark (broadcast or shuffle join with the base), then the overlay on top."""
    view = lookup.view
    overlay = view.overlay_df(df.sparkSession)
    cols = cache.get(
        ("lookup", i, id(lookup.config), view.mode, tuple(lookup.value_columns()), view.value_type.simpleString(),
         passthrough, overlay is not None),
        lambda: _lookup_columns(i, lookup, passthrough, overlay is not None),
    )
    key = f"__lk{i}"
    # the base's side of the join changes only with the base: two DataFrame steps (each analyzed on the
    # driver) made once per base, not per batch. A hint, not functions.broadcast: no py4j function lookup
    held = cache.get(("base-side", i), dict)
    if held.get("base") is not view.base_df or held.get("cols") is not cols:
        side = cache.select(view.base_df, cols.base)
        held.update(base=view.base_df, cols=cols, side=side.hint("broadcast") if view.mode == "broadcast" else side)
    df = cache.join(df, held["side"], key, "left")
    if overlay is not None:
        df = cache.join(df, cache.select(overlay, cols.overlay).hint("broadcast"), key, "left")
    star = cache.col("*")
    # one projection per step, not one withColumn per field: each DataFrame step is analyzed on the driver
    # against the whole (wide) plan, a fixed cost of every micro-batch
    df = cache.select(df, [star, cols.value])
    if cols.keep is not None:
        df = df.filter(cols.keep)
    return cache.select(df, [star, *cols.expanded])


def _as_of_lookup(df: Any, i: int, lookup: BoundLookup, passthrough: str | None) -> Any:
    """One ``as_of`` lookup: the version valid at the event's time (:mod:`stream_app.snapshot.versioned`)."""
    from pyspark.sql import functions as f

    view = lookup.view
    if view.versions is None:
        raise ValueError(f"lookup on {view.name!r} has as_of, but the snapshot keeps no versions (retention)")
    as_of = lookup.config.as_of
    assert as_of is not None  # only as_of lookups come here
    at = event_time_ms(f.col(as_of), df.schema[as_of].dataType)
    values = lookup.value_columns()
    joined, value_cols = join_as_of(df, i, f"__lk{i}", at, view.versions, values, lookup.config.how, passthrough,
                                    lookup.too_old)
    return joined.select("*", *[c.alias(fld.name) for c, fld in zip(value_cols, joined_fields(lookup), strict=True)])


def _jvm_lookup(df: Any, i: int, lookup: BoundLookup, passthrough: str | None, cache: ColumnCache) -> Any:
    """One lookup into the executors' JVM store of a snapshot (real-time mode, :mod:`stream_app.realtime`).

    An ``as_of`` lookup reads the version valid at its column's time (the store's versions). The key is the
    struct of the snapshot's key fields (the event columns cast to their types), encoded
    with the reader key schema; a string key is its UTF-8 bytes. A null key field matches nothing
    (``__lk`` is null then), as in the other engines.
    """
    from pyspark.sql import functions as f

    from stream_app.realtime import lookup_column

    assert lookup.view.jvm is not None
    udf_name, key_json, value_json = lookup.view.jvm

    def columns() -> tuple[Any, Any, list[Any]]:
        by_key = {k: e for e, k in lookup.config.on.items()}
        fields = lookup.view.key_type.fields
        if key_json is None:  # key_format string: one string field
            key = f.col(by_key[fields[0].name]).cast("string")
        else:
            key = f.struct(*[f.col(by_key[fld.name]).cast(fld.dataType).alias(fld.name) for fld in fields])
        at = None
        if lookup.config.as_of is not None:
            at = event_time_ms(f.col(lookup.config.as_of), df.schema[lookup.config.as_of].dataType)
        found = lookup_column(udf_name, key, key_json, value_json, at)
        values = lookup.value_columns()
        value = f.when(f.col(f"__lk{i}").isNotNull(), found).alias(f"__v{i}")
        keep = None
        if lookup.config.how == "inner":
            keep = f.col(f"__v{i}").isNotNull()
            if passthrough is not None:
                keep = keep | f.col(passthrough).isNotNull()
        expanded = [f.col(f"__v{i}")[name].alias(fld.name)
                    for name, fld in zip(values, joined_fields(lookup), strict=True)]
        return value, keep, expanded

    value, keep, expanded = cache.get(("jvm lookup", i, id(lookup.config), udf_name, passthrough), columns)
    star = cache.col("*")
    df = cache.select(df, [star, value])
    if keep is not None:
        df = df.filter(keep)
    return cache.select(df, [star, *expanded])
