"""The state of an :class:`~connectors.rds.source.RdsSource` task that its parts share, and its position.

The source's parts (:mod:`connectors.rds.source_schema`, :mod:`connectors.rds.source_columnar`,
:mod:`connectors.rds.source_reconcile`) are mixins of ``RdsSource``; :class:`RdsSourceBase` declares the
attributes they read and write (set by ``RdsSource.__init__`` and ``open``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Column, literal, select, tuple_

from connectors.api.source import SourceTask
from connectors.rds.config import RdsSourceConfig
from connectors.rds.connection import RdsConnection
from connectors.rds.types import to_json_value


class RdsSourceBase(SourceTask):
    """The attributes of an RDS source task, its position and how it names keys and fields in errors."""

    config: RdsSourceConfig
    connection: RdsConnection
    engine: Any
    dialect: str
    where: str  # e.g. ``table "public.orders"``, for messages
    cursor: list[Any] | None  # the order columns' values of the last row read
    ts_col: Column[Any] | None
    inc_col: Column[Any] | None
    order_cols: list[Column[Any]]
    order_idx: list[int]
    split: Any  # the task's share of the rows (a WHERE clause), or None
    columns: list[Any]
    key_columns: list[str]
    key_cols: list[Any]
    key_fields: list[str]
    field_names: list[str]
    field_to_column: dict[str, str]
    value_schema: dict[str, Any]
    key_schema: dict[str, Any]
    to_value: Callable[[Any], dict[str, Any] | None]
    to_key: Callable[[Any], dict[str, Any]]
    _arrow_schema: Any
    _column_converters: list[tuple[int, Any]]
    _adbc: Any
    _use_adbc: bool
    _scan_finished: bool
    _last_held_warning: float
    _cdc: Any

    def _position(self) -> dict[str, Any]:
        after = None if self.cursor is None else [to_json_value(v) for v in self.cursor]
        return {"mode": self.config.mode, "after": after}

    def _cursor_ts_ms(self) -> int | None:
        """The newest row's timestamp column in ``timestamp`` modes (its commit time), epoch ms; else ``None``.

        The worker stamps the batch's records with it (``threes.source_ts``), so
        freshness is measured from the row's update, not from when it was read.
        """
        if self.ts_col is None or self.cursor is None or self.config.mode == "incrementing":
            return None
        ts = self.cursor[0]
        if not isinstance(ts, dt.datetime):
            return None
        if ts.tzinfo is None:  # sessions run in UTC (utc_sessions): a naive timestamp is UTC
            ts = ts.replace(tzinfo=dt.UTC)
        return int(ts.timestamp() * 1000)

    def describe_key(self, key: Any) -> str:
        """E.g. ``table "public.orders" key {'id': 7}``."""
        shown = dict(key) if isinstance(key, Mapping) else key
        return f"{self.where} key {shown}"

    def origin(self) -> str:
        """The table read (``public.orders``), or ``query`` (``mode: query``)."""
        cfg = self.config
        if cfg.table is None:
            return "query"
        return f"{cfg.schema_name}.{cfg.table}" if cfg.schema_name else cfg.table

    def field_origin(self, field: str) -> str:
        """The column of a value field (``unit price`` for the field ``unit_price``)."""
        return str(self.field_to_column.get(field, field))

    def describe_field(self, field: str) -> str:
        """E.g. ``column "unit price"``."""
        return f'column "{self.field_to_column.get(field, field)}"'

    def _page_statement(self, bound: Any, limit: int | None) -> Any:
        stmt = select(*self.columns)
        if self.split is not None:
            stmt = stmt.where(self.split)
        if self.cursor is not None:
            if len(self.order_cols) == 1:
                c = self.order_cols[0]
                stmt = stmt.where(c > literal(self.cursor[0], c.type))
            else:
                stmt = stmt.where(
                    tuple_(*self.order_cols)
                    > tuple_(*[literal(v, c.type) for v, c in zip(self.cursor, self.order_cols, strict=True)])
                )
        if bound is not None and self.ts_col is not None:  # a bound is read only with a timestamp column
            stmt = stmt.where(self.ts_col < literal(bound, self.ts_col.type))
        return stmt.order_by(*self.order_cols).limit(limit)
