"""The tombstone table of an upsert-mode Iceberg sink: the key and version of every delete.

An Iceberg table holds live rows only; to keep the update contract's promise that an update
older than a delete never brings its key back (as the RDS sink's ``<table>__deleted``), the
sink keeps ``(key columns, version)`` of each applied delete in a second table,
``<table>__deleted`` (``tombstone_table``), created at the first delete. It is written before
the main table's commit; it only ever records a delete that is about to be applied, so a crash
between the two commits leaves a tombstone whose delete the replay applies.

The decision per key, with ``row`` the table's version and ``tomb`` the tombstone's
(:func:`decide`): an upsert is applied when newer than both; a delete removes the row when
newer than the row, and is recorded when newer than both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from connectors.api.sink_records import SinkRecord
from connectors.iceberg.rows import KeyTuple, key_filter, versions_of

_MIN = -(2**63)


@dataclass
class Decision:
    """What one batch does to the table and to its tombstones.

    Attributes:
        upserts: the records whose rows are (re)written.
        replaced: keys whose current row is removed (replaced by an upsert, or deleted).
        tombstones: ``(key, version)`` of the deletes to record.
        recorded: keys that already have a tombstone row (replaced by the new one).
    """

    upserts: list[SinkRecord] = field(default_factory=list)
    replaced: list[KeyTuple] = field(default_factory=list)
    tombstones: list[tuple[KeyTuple, int]] = field(default_factory=list)
    recorded: list[KeyTuple] = field(default_factory=list)


def decide(
    latest: Sequence[SinkRecord], keys: Sequence[KeyTuple], rows: dict[KeyTuple, int], tombs: dict[KeyTuple, int]
) -> Decision:
    """Apply the version guard to the batch's newest update per key.

    Args:
        latest: one record per key (:func:`~connectors.api.sink_records.latest_per_key`).
        keys: their key tuples, in the same order.
        rows: the table's version per key (absent: no row).
        tombs: the tombstone table's version per key (absent: none).
    """
    out = Decision()
    for record, key in zip(latest, keys, strict=True):
        row, tomb = rows.get(key, _MIN), tombs.get(key, _MIN)
        if record.is_delete:
            if record.version > row:
                if key in rows:
                    out.replaced.append(key)
                if record.version > tomb:
                    out.tombstones.append((key, record.version))
                    if key in tombs:
                        out.recorded.append(key)
        elif record.version > row and record.version > tomb:
            out.upserts.append(record)
            if key in rows:
                out.replaced.append(key)
    return out


class Tombstones:
    """The tombstone table of one sink (loaded at open, created at the first delete).

    Args:
        catalog: the pyiceberg catalog.
        identifier: ``namespace.table__deleted``.
        key: the key columns.
        version_column: the version column.
    """

    def __init__(self, catalog: Any, identifier: str, key: Sequence[str], version_column: str):
        self.catalog = catalog
        self.identifier = identifier
        self.key = list(key)
        self.version_column = version_column
        self.table: Any = None

    def load(self) -> None:
        """Load the table when it exists."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            self.table = self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            self.table = None

    def refresh(self) -> None:
        """Re-read the table's metadata (after a commit another writer overtook)."""
        if self.table is not None:
            self.table.refresh()
        else:
            self.load()

    def versions(self, keys: Sequence[KeyTuple]) -> dict[KeyTuple, int]:
        """The tombstone version of each of ``keys`` that has one."""
        return versions_of(self.table, self.key, self.version_column, keys) if self.table is not None else {}

    def record(self, decision: Decision, key_types: Sequence[pa.DataType | None]) -> None:
        """Write the decision's tombstones in one commit (the replaced tombstone rows deleted first).

        Args:
            decision: from :func:`decide`.
            key_types: the key columns' Arrow types in the main table (``None``: inferred from the values).
        """
        if not decision.tombstones:
            return
        arrays = [pa.array([k[i] for k, _v in decision.tombstones], type=t) for i, t in enumerate(key_types)]
        arrays.append(pa.array([v for _k, v in decision.tombstones], pa.int64()))
        rows = pa.Table.from_arrays(arrays, names=[*self.key, self.version_column])
        if self.table is None:
            from connectors.iceberg.table_schema import create

            self.table = create(self.catalog, self.identifier, rows.schema, [])
        from connectors.iceberg.offsets import without_rebase
        from connectors.iceberg.table_schema import align

        with without_rebase(self.table).transaction() as tx:  # overtaken: the sink re-reads both tables
            if decision.recorded:
                tx.delete(key_filter(self.key, decision.recorded))
            tx.append(align(rows, self.table.schema().as_arrow()))
