"""The diff behind every reference load: what to insert, update and delete to reach the wanted rows."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from threes.demo.data import TABLES

log = logging.getLogger(__name__)

UPDATED_AT = "updated_at"
"""The change-tracking column / field the sources read in ``timestamp`` / ``incremental`` mode."""


@dataclass
class LoadResult:
    """What one load did.

    Attributes:
        table: the dataset table (``airports``).
        target: where it went (``postgres table airports``), no secrets.
        inserted: rows / documents created.
        updated: rows / documents whose values changed.
        deleted: rows / documents removed because they are no longer in the data.
        unchanged: rows / documents left alone.
        elapsed_s: wall time, seconds.
    """

    table: str
    target: str
    inserted: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    elapsed_s: float = 0.0

    @property
    def changed(self) -> int:
        """Rows inserted, updated or deleted."""
        return self.inserted + self.updated + self.deleted

    def summary(self) -> str:
        """One log line."""
        return (
            f"{self.table} -> {self.target}: inserted={self.inserted} updated={self.updated} "
            f"deleted={self.deleted} unchanged={self.unchanged} elapsed_s={self.elapsed_s:.2f}"
        )


def table_schema(table: str) -> dict[str, Any]:
    """The shipped Avro value schema of a dataset table."""
    from schemas import load_schema

    return load_schema(TABLES[table].schema)


def field_names(table: str) -> list[str]:
    """The fields of a dataset table, in schema order."""
    return [f["name"] for f in table_schema(table)["fields"]]


def records(frame: Any, columns: Sequence[str]) -> list[dict[str, Any]]:
    """Rows as dicts of plain Python values (``None`` for null, aware ``datetime`` for timestamps)."""
    import pyarrow as pa

    table = pa.Table.from_pandas(frame[list(columns)], preserve_index=False)
    return table.to_pylist()


def same(a: Any, b: Any) -> bool:
    """Value equality for diffs: ``None`` equals ``None``, floats exactly, datetimes as instants."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        return float(a) == float(b)
    if isinstance(a, dt.datetime) and isinstance(b, dt.datetime):
        return a == b
    return a == b


def diff(
    wanted: list[dict[str, Any]], existing: Iterable[dict[str, Any]], key: Sequence[str], columns: Sequence[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[tuple[Any, ...]], int]:
    """Split ``wanted`` rows into new and changed ones, and find existing keys to delete.

    Returns:
        ``(inserts, updates, delete_keys, unchanged)``.
    """
    def key_of(row: Mapping[str, Any]) -> tuple[Any, ...]:
        return tuple(_key_value(row[k]) for k in key)

    have = {key_of(row): row for row in existing}
    inserts, updates, unchanged = [], [], 0
    seen: set[tuple[Any, ...]] = set()
    for row in wanted:
        k = key_of(row)
        seen.add(k)
        old = have.get(k)
        if old is None:
            inserts.append(row)
        elif all(same(row[c], old.get(c)) for c in columns):
            unchanged += 1
        else:
            updates.append(row)
    deletes = [k for k in have if k not in seen]
    return inserts, updates, deletes, unchanged


def _key_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)
    return value
