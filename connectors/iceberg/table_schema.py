"""The Iceberg table's schema against the writer schemas of a topic: create, evolve, refuse, align.

Rules (``evolve_table``):

* a field the table lacks becomes a new optional column (existing rows read null);
* a column Iceberg can widen in place is promoted: ``int -> long``, ``float -> double``,
  ``decimal(p,s) -> decimal(P,s)`` with ``P > p``;
* a writer type the column holds exactly is written as is, cast safely (``int`` into a ``long``
  column, ``decimal(p,s)`` into ``decimal(P,s)`` with ``p <= P``);
* anything else is refused with an error naming the column and both types: another decimal
  scale (the values would be rounded), a narrower column, another type.

A column the writer schema no longer has reads null in the new rows (every column is optional).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from connectors.iceberg.config import IcebergPartitionField


class SchemaRefused(ValueError):
    """A writer schema the table cannot hold exactly; the message names the column and both types."""


def _family(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_timestamp(t):
        return f"timestamp{'tz' if t.tz else ''}"
    return str(t)


def _width(t: pa.DataType) -> int:
    return int(t.bit_width)


def compare(name: str, column: pa.DataType, writer: pa.DataType) -> pa.DataType | None:
    """Judge a writer type against its column's type.

    Returns:
        ``None`` when the column holds the writer's values exactly; the Arrow type to promote
        the column to when Iceberg can widen it.

    Raises:
        SchemaRefused: neither.
    """
    cf, wf = _family(column), _family(writer)
    if cf == wf and cf in ("string", "binary", "timestamp", "timestamptz"):
        return None
    if cf == wf == "int":
        if _width(writer) <= _width(column):
            return None
        if _width(column) == 32 and _width(writer) == 64:
            return pa.int64()
    elif cf == wf == "float":
        if _width(writer) <= _width(column):
            return None
        if _width(column) == 32:
            return pa.float64()
    elif cf == wf == "decimal":
        if writer.scale == column.scale:
            return None if writer.precision <= column.precision else pa.decimal128(writer.precision, writer.scale)
        raise SchemaRefused(
            f"column {name!r} is {column} in the table and {writer} in the writer schema: Iceberg cannot change a "
            "decimal's scale, and writing would round the values; write to a new column or a new table"
        )
    elif column.equals(writer) or (pa.types.is_nested(column) and pa.types.is_nested(writer)):
        return None  # nested types: their values are checked by the safe cast (align)
    raise SchemaRefused(
        f"column {name!r} is {column} in the table and {writer} in the writer schema: the table cannot hold these "
        "values exactly (Iceberg widens only int -> long, float -> double and a decimal's precision)"
    )


def plan(table_schema: pa.Schema, writer: pa.Schema) -> tuple[list[pa.Field], dict[str, pa.DataType]]:
    """What the table needs to take ``writer``'s rows: new columns and promotions.

    Returns:
        ``(new optional fields, {column: promoted type})``.

    Raises:
        SchemaRefused: a column cannot hold the writer's values exactly.
    """
    adds: list[pa.Field] = []
    promotes: dict[str, pa.DataType] = {}
    for field in writer:
        idx = table_schema.get_field_index(field.name)
        if idx < 0:
            adds.append(field.with_nullable(True))
            continue
        promoted = compare(field.name, table_schema.field(idx).type, field.type)
        if promoted is not None:
            promotes[field.name] = promoted
    return adds, promotes


def evolve(table: Any, adds: Sequence[pa.Field], promotes: dict[str, pa.DataType]) -> None:
    """Add the columns and promote the types in one schema commit (pyiceberg ``update_schema``)."""
    from pyiceberg.io.pyarrow import _ConvertToIcebergWithoutIDs, visit_pyarrow

    with table.update_schema() as update:
        if adds:
            update.union_by_name(pa.schema(list(adds)))
        for name, typ in promotes.items():
            update.update_column(name, field_type=visit_pyarrow(typ, _ConvertToIcebergWithoutIDs()))


def align(rows: pa.Table, target: pa.Schema) -> pa.Table:
    """``rows`` with exactly ``target``'s columns: each cast safely to its type, nulls where absent.

    Raises:
        pyarrow.ArrowInvalid: a value the column cannot hold exactly (a safe cast refuses to lose it).
    """
    arrays = []
    for field in target:
        if field.name in rows.column_names:
            arrays.append(rows.column(field.name).cast(field.type, safe=True))
        else:
            arrays.append(pa.nulls(rows.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=target)


def create(catalog: Any, identifier: str, writer: pa.Schema, partition_by: Sequence[IcebergPartitionField]) -> Any:
    """Create the namespace (if missing) and the table from the first writer schema, with its partition spec.

    Every column is optional. One catalog commit (``create_table_transaction``).

    Returns:
        The pyiceberg ``Table``; the existing one when another writer created it first.

    Raises:
        SchemaRefused: a partition field is not a column.
    """
    from pyiceberg.exceptions import TableAlreadyExistsError
    from pyiceberg.transforms import BucketTransform, DayTransform, HourTransform, IdentityTransform

    schema = pa.schema([f.with_nullable(True) for f in writer])
    missing = [p.field for p in partition_by if p.field not in schema.names]
    if missing:
        raise SchemaRefused(f"partition_by names {missing}, not columns of the writer schema {schema.names}")
    namespace = identifier.rsplit(".", 1)[0]
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except Exception:  # another writer created it between the check and the insert (the SQL catalog's race)
        if not catalog.namespace_exists(namespace):
            raise
    try:
        with catalog.create_table_transaction(identifier, schema=schema) as tx:
            if partition_by:
                with tx.update_spec() as spec:
                    for p in partition_by:
                        transform: Any = {
                            "identity": IdentityTransform(),
                            "day": DayTransform(),
                            "hour": HourTransform(),
                            "bucket": BucketTransform(p.buckets or 1),
                        }[p.transform]
                        name = p.field if p.transform == "identity" else f"{p.field}_{p.transform}"
                        spec.add_field(p.field, transform, name)
    except TableAlreadyExistsError:
        pass
    return catalog.load_table(identifier)
