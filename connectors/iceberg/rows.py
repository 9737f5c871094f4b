"""Arrow rows of a batch for an Iceberg table, and the row filters of its keys.

The values come from the batch's columnar tables (:attr:`SinkBatch.tables`) when the sync
service decoded them so, else from each record's value dict typed by :mod:`schemas.arrow`.
Every row gets the record's ``version`` header in the version column.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from connectors.api.sink_records import SinkBatch, SinkRecord

KeyTuple = tuple[Any, ...]


def key_tuple(record: SinkRecord, key: Sequence[str]) -> KeyTuple:
    """The record key's values in the order of the ``key`` columns.

    A scalar key is the value of the single key column; a composite (record) key gives its
    fields by name.

    Raises:
        ValueError: the record key lacks a key column, or a scalar key meets several key columns.
    """
    if isinstance(record.key, dict):
        missing = [k for k in key if k not in record.key]
        if missing:
            raise ValueError(f"{record.where()}: the record key has no field(s) {missing} (key: {list(key)})")
        return tuple(record.key[k] for k in key)
    if len(key) != 1:
        raise ValueError(f"{record.where()}: a scalar record key cannot fill the key columns {list(key)}")
    return (record.key,)


def match_columns(key: Sequence[str], composite_key_column: str) -> list[str]:
    """The column(s) rows are matched on: the key column itself, or the composite key's column."""
    return list(key) if len(key) == 1 else [composite_key_column]


def match_tuple(record: SinkRecord, key: Sequence[str]) -> KeyTuple:
    """The record's value of :func:`match_columns`: its key, or its composite key as one canonical string.

    A composite key is the JSON array of its fields' values in ``key`` order (non-JSON values as
    ``str``): one ``In`` filter on one column finds and deletes rows, where an ``Or`` of ``And``
    terms over several columns took pyiceberg about 17 s for 2,500 keys.
    """
    values = key_tuple(record, key)
    if len(values) == 1:
        return values
    import json

    return (json.dumps(list(values), default=str, separators=(",", ":")),)


def value_tables(
    batch: SinkBatch, records: Sequence[SinkRecord], version_column: str
) -> list[tuple[Sequence[SinkRecord], pa.Table]]:
    """The values of ``records`` (upserts) as Arrow tables, one per run of one writer schema, in order.

    Returns:
        ``(the run's records, their table)`` per run.

    Each table has the writer schema's columns (typed by :mod:`schemas.arrow`) and the version
    column (int64) last.

    Raises:
        UnsupportedAvroType: a writer schema without a faithful Arrow type.
    """
    from schemas.arrow import arrow_type

    out: list[tuple[Sequence[SinkRecord], pa.Table]] = []
    start = 0
    while start < len(records):
        fp = records[start].value_fingerprint
        end = start
        while end < len(records) and records[end].value_fingerprint == fp:
            end += 1
        run = records[start:end]
        table = batch.value_table(run)
        if table is None:
            typ = arrow_type(run[0].value_schema)
            table = pa.Table.from_struct_array(pa.array([r.value for r in run], type=typ))
        out.append((run, table.append_column(version_column, pa.array([r.version for r in run], pa.int64()))))
        start = end
    return out


def key_filter(key: Sequence[str], keys: Sequence[KeyTuple]) -> Any:
    """A pyiceberg row filter matching the rows of ``keys`` (``In`` on one column, ``Or`` of ``And`` otherwise).

    Returns:
        A ``pyiceberg.expressions.BooleanExpression`` (``AlwaysFalse`` for no keys).
    """
    from pyiceberg.expressions import AlwaysFalse, And, EqualTo, In, Or

    if not keys:
        return AlwaysFalse()
    if len(key) == 1:
        return In(term=key[0], literals={k[0] for k in keys})

    def one(values: KeyTuple) -> Any:
        terms = [EqualTo(term=c, value=v) for c, v in zip(key, values, strict=True)]
        return terms[0] if len(terms) == 1 else And(*terms)

    terms = [one(k) for k in keys]
    return terms[0] if len(terms) == 1 else Or(*terms)


def versions_of(table: Any, key: Sequence[str], version_column: str, keys: Sequence[KeyTuple]) -> dict[KeyTuple, int]:
    """The version each of ``keys`` holds in the Iceberg table (absent: no row).

    Reads only the key and version columns of the data files whose statistics may hold the keys.
    """
    if not keys:
        return {}
    found = table.scan(row_filter=key_filter(key, keys), selected_fields=(*key, version_column)).to_arrow()
    columns = [found.column(c).to_pylist() for c in key]
    versions = found.column(version_column).to_pylist()
    out: dict[KeyTuple, int] = {}
    for i, version in enumerate(versions):
        k = tuple(col[i] for col in columns)
        if version is not None and version > out.get(k, -(2**63)):
            out[k] = version
    return out
