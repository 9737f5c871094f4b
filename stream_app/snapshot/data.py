"""The snapshot as data: pure functions from compacted-topic records to the latest value per key.

A snapshot is the latest value per key of one or more compacted topics, a
record with a ``null`` value (tombstone) removing its key, exactly as log
compaction would (Kafka documentation, "Log Compaction"; Kafka Streams'
GlobalKTable). Its rows carry two internal columns beside the value fields:

* ``__lk`` (string): the *lookup key*, rendered from the decoded key fields by
  :func:`lookup_key` the same way on the event side, so a foreign key and a
  snapshot key meet on equal strings whatever their Avro writer schema.
* ``__lh`` (long): ``xxhash64(__lk)``, the hash the broadcast lookup indexes
  (:mod:`stream_app.snapshot.indexed`), which checks ``__lk`` on every hit.

Nothing here has side effects: the Spark functions take and return
DataFrames, so unit tests call them on small frames. The records come from
:mod:`stream_app.snapshot.decoding`; the driver's Arrow tables of the base and
overlay are :mod:`stream_app.snapshot.arrow_tables`, what a micro-batch joins
:mod:`stream_app.snapshot.view`. The live snapshot (reading Kafka,
broadcasting, checkpointing) is :mod:`stream_app.snapshot.runtime`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)

LK, LH = "__lk", "__lh"
DELETED, TOPIC, PARTITION, OFFSET, RANK, ERROR = "__deleted", "__topic", "__partition", "__offset", "__rank", "__error"
LOG_COLUMNS = (LK, LH, DELETED, TOPIC, PARTITION, OFFSET)
"""Columns of an overlay log row before the value fields."""


def _f() -> Any:
    from pyspark.sql import functions

    return functions


def lookup_key(key: Any, key_type: Any) -> Any:
    """The lookup key (string column) of a struct column holding the key fields.

    A single string or integral key field is used as its string; anything else
    (composite keys, other types) is rendered with ``to_json``, whose output is
    fixed by the struct's field names and types. Both sides call this on a
    struct of the snapshot key's field names and types, so equal keys give
    equal strings. ``null`` when any key field is null (matches nothing).

    Args:
        key: a struct column with the key fields, in key schema order.
        key_type: its :class:`pyspark.sql.types.StructType`.
    """
    from pyspark.sql import types as T

    f = _f()
    fields = key_type.fields
    if len(fields) == 1 and isinstance(
        fields[0].dataType, T.StringType | T.IntegerType | T.LongType | T.ShortType | T.ByteType
    ):
        return key[fields[0].name].cast("string")
    present = f.lit(True)
    for fld in fields:
        present = present & key[fld.name].isNotNull()
    return f.when(present, f.to_json(key))


def event_lookup_key(on: Mapping[str, str], key_type: Any) -> Any:
    """The lookup key of events for a lookup ``on`` (event field -> snapshot key field).

    Event fields are cast to the key fields' types and named like them, so a
    foreign key meets the snapshot key whatever its own name and integer width.

    Raises:
        ValueError: ``on`` does not name every key field exactly once.
    """
    f = _f()
    by_key = {k: e for e, k in on.items()}
    names = [fld.name for fld in key_type.fields]
    if sorted(by_key) != sorted(names) or len(by_key) != len(on):
        raise ValueError(f"lookup must map every snapshot key field {names} exactly once, got {dict(on)}")
    key = f.struct(*[f.col(by_key[fld.name]).cast(fld.dataType).alias(fld.name) for fld in key_type.fields])
    return lookup_key(key, key_type)


def latest_per_key(
    records: Any,
    value_columns: Sequence[str] | None = None,
    keep_deleted: bool = False,
    partitions: int | None = None,
    unavailable: Sequence[str] = (),
    unresolved: str = "null",
) -> Any:
    """The latest record per lookup key; tombstones remove their key.

    Order: topic rank, then partition, then offset (Kafka keeps a key in one
    partition, where offsets order its records). Records with ``__error`` set
    are ignored (they went to the dead letter topic; they are not deletes).

    The records are hash-partitioned by ``__lk`` into ``partitions`` and sorted
    once, by (bucket, ``__lk``, newest first), where the bucket is Spark's
    bucket id of ``__lk`` (``pmod(murmur3(__lk), partitions)``); the first row
    of each key wins (a window's ``row_number``). That one sort also satisfies
    a Parquet write bucketed and sorted by ``__lk`` into ``partitions``
    buckets, and the output stays partitioned and sorted by ``__lk``. (A
    ``max_by`` aggregation of a struct is a sort-based aggregation in Spark,
    which sorts every record twice, before and after the shuffle: measured 3x
    slower on 2M keys.)

    Args:
        records: output of :func:`~stream_app.snapshot.decoding.decode_records`, or any frame with ``__lk``,
            ``__lh``, ``__deleted``, ``__rank``, ``__partition``, ``__offset``
            and the value (struct ``__v``, or flat ``value_columns``).
        value_columns: flat value columns; ``None`` expands struct ``__v``.
        keep_deleted: keep the tombstones (a change set to apply), else drop
            them (a snapshot).
        partitions: how many hash partitions of ``__lk``; ``None``:
            ``spark.sql.shuffle.partitions``.
        unavailable: Debezium snapshots: the value columns that may hold
            ``__debezium_unavailable_value`` (a TOASTed column an UPDATE left out):
            each takes the key's latest earlier value since its last delete
            (:func:`~stream_app.snapshot.arrow_tables.fill_unavailable` on the driver does the same to a change table).
        unresolved: what such a column becomes without an earlier value here:
            ``null`` (the records are the whole topic) or ``keep`` the placeholder
            (a delta: the snapshot holds the previous value,
            :func:`~stream_app.snapshot.arrow_tables.fill_unavailable`).

    Returns:
        ``__lk, __lh[, __deleted, __topic, __partition, __offset]`` and the value
        fields, one row per key.
    """
    f = _f()
    with_errors = ERROR in records.columns
    if value_columns is None:
        records, value_columns = _flattened(records)
    if partitions is None:
        partitions = int(records.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    if unavailable:
        records = _carry_unavailable(records, unavailable, unresolved, with_errors)
    keep = [LH, DELETED, TOPIC, PARTITION, OFFSET, *value_columns]
    present = [c for c in keep if c in records.columns]
    latest = _newest_per_key(records, present, partitions, with_errors)
    if keep_deleted:
        return latest
    return latest.filter(~f.col(DELETED)).select(LK, LH, *value_columns)


def _flattened(records: Any) -> tuple[Any, list[str]]:
    """The records with struct ``__v`` expanded, and the value columns it held."""
    records = records.select("*", "__v.*").drop("__v")
    return records, [c for c in records.columns if not c.startswith("__") and c not in ("key", "value")]


def _newest_per_key(records: Any, present: Sequence[str], partitions: int, with_errors: bool) -> Any:
    """The newest usable record per ``__lk``, columns ``__lk`` + ``present`` (see :func:`latest_per_key`)."""
    from pyspark.sql import Window

    f = _f()
    order = [f.col(RANK).desc(), f.col(PARTITION).desc(), f.col(OFFSET).desc()]
    chosen = f.col("__n") == 1
    carried = present
    # Records with an error are dropped after the window, which orders them last within their key: a
    # filter on ``__error`` before it would be pushed by Spark below a decode it was not observed after, and
    # evaluate its ``from_avro`` once more per reference (measured 2-4x on a 10M-record bootstrap).
    if with_errors:  # valid records first; a key whose records all have errors has no row
        order.insert(0, f.col(ERROR).isNull().desc())
        chosen = chosen & f.col(ERROR).isNull()
        carried = [*present, ERROR]
    newest_first = Window.partitionBy(bucket_id(LK, partitions), f.col(LK)).orderBy(*order)
    return (
        records.repartition(partitions, LK)
        .select(LK, *carried, f.row_number().over(newest_first).alias("__n"))
        .filter(chosen)
        .select(LK, *present)
    )


def _carry_unavailable(records: Any, columns: Sequence[str], unresolved: str, with_errors: bool) -> Any:
    """Replace Debezium's placeholders by the key's latest earlier value (see :func:`latest_per_key`)."""
    from pyspark.sql import Window
    from pyspark.sql import types as T

    from schemas.debezium import UNAVAILABLE

    f = _f()
    order = [f.col(RANK), f.col(PARTITION), f.col(OFFSET)]
    upto = Window.partitionBy(LK).orderBy(*order).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    # a delete starts a new segment: no value is carried across it
    records = records.withColumn("__seg", f.sum(f.col(DELETED).cast("int")).over(upto))
    segment = Window.partitionBy(LK, "__seg").orderBy(*order).rowsBetween(Window.unboundedPreceding, Window.currentRow)
    usable = ~f.col(DELETED) & (f.col(ERROR).isNull() if with_errors else f.lit(True))
    for name in columns:
        col, kind = f.col(name), records.schema[name].dataType
        if isinstance(kind, T.ArrayType):
            placeholder = (f.size(col) == 1) & (col[0].cast("string") == f.lit(UNAVAILABLE))
        elif isinstance(kind, T.BinaryType):
            placeholder = col == f.lit(UNAVAILABLE.encode())
        else:
            placeholder = col == f.lit(UNAVAILABLE)
        placeholder = f.coalesce(placeholder, f.lit(False))
        # wrapped in a struct: a real null is a value to carry, ignorenulls skips only the placeholders
        earlier = f.last(f.when(usable & ~placeholder, f.struct(col.alias("v"))), ignorenulls=True).over(segment)
        fallback = col if unresolved == "keep" else f.lit(None).cast(kind)
        records = records.withColumn(
            name, f.when(placeholder, f.when(earlier.isNotNull(), earlier["v"]).otherwise(fallback)).otherwise(col)
        )
    return records.drop("__seg")


def unavailable_columns(value_type: Any) -> list[str]:
    """The value columns that can hold Debezium's placeholder: strings, bytes, arrays."""
    from pyspark.sql import types as T

    return [fld.name for fld in value_type.fields
            if isinstance(fld.dataType, T.StringType | T.BinaryType | T.ArrayType)]


def bucket_id(column: str, buckets: int) -> Any:
    """Spark's bucket (and hash partition) of a column's value: ``pmod(murmur3(column), buckets)``."""
    f = _f()
    return f.pmod(f.hash(f.col(column)), f.lit(buckets))
