"""The snapshot on the driver as Arrow tables: the broadcast base and the overlay of recent changes.

Pure functions of :class:`pyarrow.Table`: keeping the last change per key,
applying a change set (updates and tombstones) to a base, the overlay log rows
below replayed offsets, Arrow IPC bytes for a broadcast, Arrow schemas of Spark
types made nullable so tables of different plans concatenate, and the filling
of Debezium's unavailable-value placeholders from the key's previous values.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stream_app.snapshot.data import DELETED, LK, OFFSET, PARTITION, TOPIC


def dedupe_last(changes: pa.Table) -> pa.Table:
    """Keep the last row per ``__lk`` (table order = read order).

    Returns:
        The rows kept, in their original order.
    """
    if changes.num_rows == 0:
        return changes
    numbered = changes.append_column("__row", pa.array(range(changes.num_rows), pa.int64()))
    last = numbered.group_by(LK, use_threads=False).aggregate([("__row", "max")]).column("__row_max")
    return changes.take(np.sort(last.to_numpy()))


def apply_changes(base: pa.Table, changes: pa.Table) -> pa.Table:
    """Apply a change set (updates and tombstones) to a snapshot table.

    Args:
        base: ``__lk, __lh`` + value columns, one row per key.
        changes: the same columns plus ``__deleted``, one row per key
            (:func:`dedupe_last`); extra log columns are ignored.

    Returns:
        The base without the changed keys, then the changed keys that are not
        deleted: one row per key, the base's schema.
    """
    if changes.num_rows == 0:
        return base
    untouched = base.filter(pc.invert(pc.is_in(base.column(LK), value_set=changes.column(LK))))
    live = changes.filter(pc.invert(changes.column(DELETED))).select(base.column_names).cast(base.schema)
    return pa.concat_tables([untouched, live]).combine_chunks()


def below(log_table: pa.Table, upto: Mapping[str, Mapping[int, int]]) -> pa.Table:
    """The overlay log rows with an offset below ``upto`` for their topic-partition (replays)."""
    if log_table.num_rows == 0:
        return log_table
    keep = pa.array([False] * log_table.num_rows)
    for topic, parts in upto.items():
        for partition, end in parts.items():
            hit = pc.and_(
                pc.and_(pc.equal(log_table.column(TOPIC), topic), pc.equal(log_table.column(PARTITION), partition)),
                pc.less(log_table.column(OFFSET), end),
            )
            keep = pc.or_(keep, hit)
    return log_table.filter(keep)


def ipc_bytes(table: pa.Table) -> bytes:
    """Serialize a table as an Arrow IPC stream (what the broadcast and the overlay carry)."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _nullable_type(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_struct(kind):
        return pa.struct([_nullable_field(kind.field(i)) for i in range(kind.num_fields)])
    if pa.types.is_map(kind):  # a map's keys are never null in Arrow
        return pa.map_(kind.key_field.with_type(_nullable_type(kind.key_type)), _nullable_field(kind.item_field))
    if pa.types.is_large_list(kind):
        return pa.large_list(_nullable_field(kind.value_field))
    if pa.types.is_list(kind):
        return pa.list_(_nullable_field(kind.value_field))
    return kind


def _nullable_field(fld: pa.Field) -> pa.Field:
    return fld.with_nullable(True).with_type(_nullable_type(fld.type))


def arrow_schema(spark_type: Any) -> pa.Schema:
    """The Arrow schema of a Spark ``StructType``, timestamps as UTC instants (``spark.sql.session.timeZone``).

    pyspark 4.2 names the zone (``timezone="UTC"``); pyspark 4.0 had ``timestamp_utc=True``, its
    default (``benchmarks/spark_versions.py`` runs the job on both).
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    try:
        return to_arrow_schema(spark_type, timezone="UTC")
    except TypeError:  # pyspark before 4.1
        return to_arrow_schema(spark_type)


def nullable_schema(schema: pa.Schema) -> pa.Schema:
    """The same schema with every field nullable, nested ones too (map keys excepted)."""
    return pa.schema([_nullable_field(fld) for fld in schema])


def nullable_table(table: pa.Table) -> pa.Table:
    """The same table with every field nullable, nested ones too.

    Tables from different Spark plans and from the driver's decoder then
    concatenate, and a cast never meets a child of a null struct marked
    non-nullable.
    """
    schema = nullable_schema(table.schema)
    return table if table.schema.equals(schema) else table.cast(schema)


def _unavailable_mask(column: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """Where a column holds Debezium's unavailable-value placeholder; ``None`` for a type that cannot."""
    from schemas.debezium import UNAVAILABLE

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return pc.fill_null(pc.equal(column, pa.scalar(UNAVAILABLE, kind)), False)
    if pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pc.fill_null(pc.equal(column, pa.scalar(UNAVAILABLE.encode(), kind)), False)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):  # an array column: [placeholder]
        inner = pc.list_element(pc.if_else(pc.equal(pc.list_value_length(column), 1), column, None), 0)
        return pc.fill_null(pc.equal(pc.cast(inner, pa.string()), UNAVAILABLE), False)
    return None


def fill_unavailable(
    changes: pa.Table, previous: Callable[[list[str]], Mapping[str, Mapping[str, Any] | None]]
) -> pa.Table:
    """Replace Debezium's ``__debezium_unavailable_value`` placeholders by the key's previous values.

    A TOASTed column an UPDATE left unchanged is not in PostgreSQL's logical decoding message
    (unless ``REPLICA IDENTITY FULL``), and Debezium writes the placeholder instead
    (:mod:`schemas.debezium`). The previous value of the key is its latest earlier row in
    ``changes``, else its row in the snapshot (``previous``); after a delete, or for a key never
    seen, the column is null. Only the rows of keys with a placeholder are visited.

    Args:
        changes: overlay log rows in read order (``__lk``, ``__deleted`` and the value columns).
        previous: lookup key list -> each key's current row in the snapshot (``None``: absent).

    Returns:
        ``changes`` with every placeholder replaced.
    """
    columns = [n for n in changes.column_names if not n.startswith("__")]
    masks = {n: m for n in columns if (m := _unavailable_mask(changes.column(n))) is not None}
    hit = [n for n, m in masks.items() if pc.any(m).as_py()]
    if not hit:
        return changes
    rows_with = pa.array([False] * changes.num_rows)
    for n in hit:
        rows_with = pc.or_(rows_with, masks[n])
    keys = pc.unique(changes.column(LK).filter(rows_with)).to_pylist()
    involved = pc.is_in(changes.column(LK), value_set=pa.array(keys, pa.string())).to_pylist()
    lks, deleted = changes.column(LK).to_pylist(), changes.column(DELETED).to_pylist()
    values = {n: changes.column(n).to_pylist() for n in hit}
    flagged = {n: masks[n].to_pylist() for n in hit}
    state: dict[str, Mapping[str, Any] | None] = dict(previous(keys))
    for i, mine in enumerate(involved):
        if not mine:
            continue
        lk = lks[i]
        if deleted[i]:
            state[lk] = None
            continue
        before = state.get(lk)
        for n in hit:
            if flagged[n][i]:
                values[n][i] = None if before is None else before.get(n)
        state[lk] = {n: values[n][i] for n in hit}
    for n in hit:
        position = changes.column_names.index(n)
        changes = changes.set_column(position, changes.field(n), pa.array(values[n], changes.field(n).type))
    return changes
