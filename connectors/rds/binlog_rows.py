"""The rows of a MySQL/MariaDB binlog change stream: row events mapped by column name to the source's rows.

``mysql-replication`` decodes a row event's values with the column names, signedness and ``ENUM``/``SET``
labels of its table map (``binlog_row_metadata = FULL``); the few types it decodes differently from a
``SELECT`` through SQLAlchemy are adapted here (``TIME`` arrives as a ``timedelta``), so a row read from the
binlog has exactly the Python types of a row read by the snapshot and the same converters then apply.

**Schema changes.** Each row event carries the column names of the table at that point of the binlog. An event
with a column the source's schema lacks that the table holds now (``ADD COLUMN``), or without a required column
the table no longer holds (``DROP COLUMN``), stops the stream at that transaction with an error that restarts
the task: it reflects the table again and registers the new schema, under the same compatibility checks as any
start, and resumes from the last stored position. Other differences are older or newer shapes of the table met
while replaying: a column since dropped is ignored, a column added since is null.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from connectors.rds.types import time_of_day
from kernel.exceptions import FatalError

if TYPE_CHECKING:
    from connectors.rds.source_columnar import ColumnarPages

# the change stream's log lines keep the logger name of the module that reads it
log = logging.getLogger("connectors.rds.binlog")

Adapter = Callable[[Any], Any]


class SchemaChanged(FatalError):
    """The table's columns changed (DDL): the task restarts to publish the new schema."""


def adapter_for(sql_type: Any) -> Adapter | None:
    """How a binlog value of a column of ``sql_type`` becomes the value a ``SELECT`` returns (``None``: as is)."""
    from sqlalchemy import types as sqltypes

    if isinstance(sql_type, sqltypes.Time):
        return time_of_day
    return None


class BinlogRows:
    """Row events as the source's records (a mixin of ``MysqlChangeStream``)."""

    source: ColumnarPages
    name: str  # the connector's
    database: str
    table: str
    _shapes: dict[tuple[str, ...], list[tuple[str | None, Adapter | None]]]
    _raw_connection: Any

    def _mapping(self, names: tuple[str, ...]) -> list[tuple[str | None, Adapter | None]]:
        """Per field of the source, the event's column and its adapter (``None``: not in the event: null)."""
        mapping = self._shapes.get(names)
        if mapping is not None:
            return mapping
        src = self.source
        wanted = [src.field_to_column[f] for f in src.field_names]
        by_name = {c.name: c for c in src.columns}
        extra = [n for n in names if n not in wanted]
        missing = [c for c in wanted if c not in names]
        if extra or missing:
            live = self._live_columns()
            added = [n for n in extra if n in live]
            dropped = [c for c in missing if c not in live and not by_name[c].nullable]
            if added or dropped:
                raise SchemaChanged(
                    f"source {self.name!r}: table {self.database}.{self.table} changed (columns now {list(names)}: "
                    f"{'added ' + str(added) if added else ''}{' ' if added and dropped else ''}"
                    f"{'dropped ' + str(dropped) if dropped else ''}); the task restarts to publish the new schema "
                    "(checked for compatibility as at any start) and resumes from the last stored position"
                )
            log.info(
                "source=%s row events of %s.%s with columns %s: mapped by name (missing as null)",
                self.name,
                self.database,
                self.table,
                list(names),
            )
        mapping = [(c if c in names else None, adapter_for(by_name[c].type)) for c in wanted]
        self._shapes[names] = mapping
        return mapping

    def _control(self) -> Any:
        """The control connection (a pooled DBAPI connection; opened again after a failure closed it)."""
        if self._raw_connection is None:
            self._raw_connection = self.source.engine.raw_connection()
        return self._raw_connection

    def _live_columns(self) -> set[str]:
        cur = self._control().cursor()
        try:
            cur.execute(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s AND TABLE_NAME = %s",
                (self.database, self.table),
            )
            return {str(r[0]) for r in cur.fetchall()}
        finally:
            cur.close()
            self._raw_connection.rollback()

    def _row(self, mapping: list[tuple[str | None, Adapter | None]], values: dict[str, Any]) -> tuple[Any, ...]:
        out = []
        for column, adapt in mapping:
            v = None if column is None else values.get(column)
            out.append(adapt(v) if adapt is not None and v is not None else v)
        return tuple(out)

    def _key(self, row: tuple[Any, ...]) -> dict[str, Any]:
        src = self.source
        return dict(src.to_key(tuple(row[src.field_names.index(f)] for f in src.key_fields)))

    def _apply(self, event: Any, records: list[Any]) -> None:
        """The records of one row event (``Write``/``Update``/``Delete``), appended to ``records``."""
        from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent

        src = self.source
        mapping = self._mapping(tuple(c.name for c in event.columns))
        if isinstance(event, DeleteRowsEvent):
            for r in event.rows:
                records.append((self._key(self._row(mapping, r["values"])), None))
            return
        update = isinstance(event, UpdateRowsEvent)
        for r in event.rows:
            row = self._row(mapping, r["after_values"] if update else r["values"])
            value = src.to_value(row)
            if value is None:
                continue  # a row left out (see RdsSource)
            key = {k: value[k] for k in src.key_fields}
            if update:
                old_key = self._key(self._row(mapping, r["before_values"]))
                if old_key != key:
                    records.append((old_key, None))  # the key changed: the old entity is gone
            records.append((key, value))
