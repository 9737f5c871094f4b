"""The rows of a PostgreSQL change stream: pgoutput changes loaded as the source's rows, keys and tombstones.

Values arrive as text and are loaded with psycopg 3's loaders for the column's type OID, so a row read from the
WAL has exactly the Python types of a row read by ``SELECT``; unchanged TOASTed values are filled in.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from connectors.rds import pgoutput
from connectors.rds.pgoutput import UNCHANGED
from kernel.exceptions import FatalError

if TYPE_CHECKING:
    from connectors.rds.source_columnar import ColumnarPages

# the change stream's log lines keep the logger name they always had
log = logging.getLogger("connectors.rds.cdc")


class ChangeRows:
    """Relations, loaded rows and the records of a change (a mixin of ``PgChangeStream``)."""

    source: ColumnarPages
    name: str  # the connector's
    qualified: str  # the table's qualified name, quoted
    table_oid: int
    _raw: Any
    _relations: dict[int, Any]

    def _relation(self, rel: pgoutput.Relation) -> None:
        """Map a relation's columns to the source's columns by name (a table of another publication is kept out)."""
        from psycopg.adapt import Transformer
        from psycopg.pq import Format

        if rel.relid != self.table_oid:
            return
        src = self.source
        names = [c[0] for c in rel.columns]
        index = {n: i for i, n in enumerate(names)}
        wanted = [src.field_to_column[f] for f in src.field_names]
        missing = [c for c in wanted if c not in index]
        if missing or len(names) != len(wanted):
            log.warning(
                "source=%s table %s changed shape (columns now %s); mapped by name, missing %s as null; "
                "restart the source to publish the new schema",
                self.name, self.qualified, names, missing,
            )
        tx = Transformer(self._raw.driver_connection)
        tx.set_loader_types([c[1] for c in rel.columns], Format.TEXT)
        positions = [index.get(c) for c in wanted]
        key_positions = [index.get(k) for k in src.key_columns]
        self._relations[rel.relid] = (tx, positions, key_positions)

    def _load(self, rel: Any, values: tuple[Any, ...]) -> list[Any]:
        tx, positions, _keys = rel
        loaded = tx.load_sequence([None if v is UNCHANGED else v for v in values])
        out = [None if p is None else loaded[p] for p in positions]
        for i, p in enumerate(positions):
            if p is not None and values[p] is UNCHANGED:
                out[i] = UNCHANGED
        return out

    def _key_of(self, rel: Any, values: tuple[Any, ...]) -> dict[str, Any]:
        src = self.source
        row = self._load(rel, values)
        v = src.to_key(tuple(row[src.field_names.index(f)] for f in src.key_fields))
        return dict(v)

    def _apply(self, rel: Any, change: pgoutput.Change, records: list[Any]) -> None:
        src = self.source
        if change.op == "delete":
            key = self._key_of(rel, change.old or ())
            if any(v is None for v in key.values()):
                raise FatalError(
                    f"source {self.name!r}: a delete of {self.qualified} carries no key {src.key_columns}; "
                    f"run ALTER TABLE {self.qualified} REPLICA IDENTITY FULL"
                )
            records.append((key, None))
            return
        row = self._load(rel, change.new or ())
        if any(v is UNCHANGED for v in row):
            filled = self._fill_unchanged(rel, change, row)
            if filled is None:
                return  # the row is gone: its delete follows in the stream
            row = filled
        value = src.to_value(tuple(row))
        if value is None:
            return  # a row left out (a NaN in a NOT NULL decimal, see RdsSource)
        key = {k: value[k] for k in src.key_fields}
        if change.op == "update" and change.old is not None:
            old_key = self._key_of(rel, change.old)
            if all(v is not None for v in old_key.values()) and old_key != key:
                records.append((old_key, None))  # the key changed: the old entity is gone
        records.append((key, value))

    def _fill_unchanged(self, rel: Any, change: pgoutput.Change, row: list[Any]) -> list[Any] | None:
        """Unchanged TOASTed values: from the old row (``REPLICA IDENTITY FULL``), else read from the table."""
        from sqlalchemy import and_, literal, select

        src = self.source
        if change.old is not None and not change.old_is_key:
            old = self._load(rel, change.old)
            return [o if v is UNCHANGED else v for v, o in zip(row, old, strict=True)]
        key_idx = [src.field_names.index(f) for f in src.key_fields]
        cond = and_(*[c == literal(row[i], c.type) for c, i in zip(src.key_cols, key_idx, strict=True)])
        compiled = select(*src.columns).where(cond).compile(dialect=src.engine.dialect)
        pc = self._raw.driver_connection
        try:
            current = pc.execute(str(compiled), compiled.params).fetchone()
        finally:
            pc.rollback()
        if current is None:
            return None
        return [current[i] if v is UNCHANGED else v for i, v in enumerate(row)]

