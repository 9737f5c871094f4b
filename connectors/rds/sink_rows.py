"""How the RDS sink turns update records into rows of one reflected table: key, values in column order, Arrow tables.

A :class:`Rows` is built once per reflected table (its layout is read per record);
:class:`~connectors.rds.sink.RdsSink` builds a new one when the table changes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import JSON, Table

from connectors.api.sink_records import SinkBatch, SinkRecord
from connectors.rds.sink_sql import csv_safe


class NotColumns(ValueError):
    """An upsert's value has fields the table has no column for."""


class Rows:
    """The layout of one reflected table, and the rows of records in it.

    Args:
        table: the reflected target table.
        key: its key columns (the sink's ``key``).
        version: its version column.
        evolve_table: whether the sink adds columns itself (named in :class:`NotColumns`' message).
    """

    def __init__(self, table: Table, key: Sequence[str], version: str, *, evolve_table: bool):
        self.table = table
        self.key = list(key)
        self.version = version
        self.evolve_table = evolve_table
        self.qualified = f"{table.schema}.{table.name}" if table.schema else table.name
        names = [c.name for c in table.c]
        self.names = names
        self.name_set = frozenset(names)
        self.nulls: dict[str, Any] = dict.fromkeys(names)
        getter = operator.itemgetter(*names)
        self.values_of: Callable[[dict[str, Any]], tuple[Any, ...]] = (
            getter if len(names) > 1 else (lambda row: (getter(row),)))
        #: positions of the JSON columns (PostgreSQL's COPY sends them as jsonb)
        self.json_at = [i for i, c in enumerate(table.c) if isinstance(c.type, JSON)]
        #: the value fields that map 1:1 onto the columns (``None`` when the version column is not last)
        self.direct = tuple(names[:-1]) if names[-1] == version else None

    def key_values(self, record: SinkRecord) -> dict[str, Any]:
        """The record's key as ``{key column: value}``.

        Raises:
            ValueError: the key lacks a key column, or is a scalar for a composite key.
        """
        key = record.key
        if isinstance(key, dict):
            missing = [k for k in self.key if k not in key]
            if missing:
                raise ValueError(f"{record.where()}: key has no field(s) {missing} (table key {self.key})")
            return {k: key[k] for k in self.key}
        if len(self.key) != 1:
            raise ValueError(f"{record.where()}: scalar key {key!r} for the composite table key {self.key}")
        return {self.key[0]: key}

    def values(self, record: SinkRecord) -> tuple[Any, ...] | None:
        """The upsert's values in column order (``None`` for a delete).

        Fast path: a value whose fields are the table's columns in order, with
        the key equal to the record's key, is used as it is (no dict is built).

        Raises:
            ValueError: a bad key (see :meth:`key_values`).
            NotColumns: a value field is not a column of the table.
        """
        value = record.value
        if value is None:
            self.key_values(record)  # a delete still needs a valid key
            return None
        key = record.key
        if (
            self.direct is not None
            and len(self.key) == 1
            and not isinstance(key, dict)
            and tuple(value) == self.direct
            and value[self.key[0]] == key
        ):
            return (*value.values(), record.version)
        row = self.row(record)
        assert row is not None
        return self.values_of(row)

    def row(self, record: SinkRecord) -> dict[str, Any] | None:
        """The full row of an upsert, absent fields NULL (``None`` for a delete: key and version only).

        Raises:
            ValueError: a bad key (see :meth:`key_values`).
            NotColumns: a value field is not a column of the table.
        """
        key = record.key
        keys = self.key_values(record) if isinstance(key, dict) or len(self.key) != 1 else {self.key[0]: key}
        if record.value is None:
            return None
        if not self.name_set.issuperset(record.value):
            unknown = sorted(set(record.value) - self.name_set)
            raise NotColumns(f"field(s) {unknown} of {record.where()} are not columns of table "
                             f"{self.qualified!r}" + ("" if self.evolve_table else
                                                      " (evolve_table: true on the sink adds them)"))
        row = self.nulls.copy()
        row.update(record.value)
        row.update(keys)
        row[self.version] = record.version
        return row

    def columnar(
        self, batch: SinkBatch, records: list[SinkRecord]
    ) -> tuple[list[tuple[list[SinkRecord], Any]], list[SinkRecord]]:
        """Split the upserts whose values were decoded in columns into COPY-ready Arrow tables.

        Returns:
            ``([(records, table in the target's column order)], the other records)``; a
            writer schema's upserts stay per record when a field is not a column of the
            target or a column's type has no CSV text PostgreSQL reads back as it was
            (binary, nested values). The other records keep their offset order.
        """
        groups: dict[bytes | None, list[SinkRecord]] = {}
        rest: list[SinkRecord] = []
        for record in records:
            if record.row >= 0 and not record.is_delete:
                groups.setdefault(record.value_fingerprint, []).append(record)
            else:
                rest.append(record)
        out = []
        for group in groups.values():
            table = self._arrow(batch, group)
            if table is None:
                rest += group
            else:
                out.append((group, table))
        rest.sort(key=lambda r: r.offset)
        return out, rest

    def _arrow(self, batch: SinkBatch, group: list[SinkRecord]) -> Any:
        """One writer schema's upserts as an Arrow table in column order, or ``None`` to go per record."""
        import pyarrow as pa

        values = batch.value_table(group)
        if (
            values is None
            or not set(values.column_names) <= self.name_set
            or not all(csv_safe(f.type) for f in values.schema)
        ):
            return None
        try:
            keys = [self.key_values(r) for r in group]
        except ValueError:
            return None  # the per-record path names the record
        arrays = []
        for name in self.names:
            if name == self.version:
                arrays.append(pa.array([r.version for r in group], pa.int64()))
            elif name in self.key:
                arrays.append(pa.array([k[name] for k in keys]))  # the record's key wins, as in row()
            elif name in values.column_names:
                arrays.append(values.column(name))
            else:
                arrays.append(pa.nulls(len(group)))
        return pa.Table.from_arrays(arrays, names=self.names)
