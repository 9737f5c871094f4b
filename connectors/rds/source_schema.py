"""The schemas of an RDS source: the table reflected (or the query's schema read), Avro schemas, row converters.

Also the cursor's ordering (by mode) and the task's share of the rows (``tasks``), and what becomes of a
``NaN``/``±Infinity`` decimal (see :class:`~connectors.rds.source.RdsSource`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Column, MetaData, Table, column, func, literal, text
from sqlalchemy.exc import NoSuchTableError, OperationalError

from connectors.rds.read_errors import db_reason
from connectors.rds.source_columnar import ColumnarPages, adbc_available, adbc_bindable
from connectors.rds.types import (
    ARROW_NATIVE_CONVERTERS,
    avro_name,
    avro_record_schema,
    converters_for_schema,
    drop_needless_converters,
    exact_mysql_time,
    make_row_converter,
)
from kernel.exceptions import ConfigError, RetriableError

# the source's log lines keep the logger name they always had
log = logging.getLogger("connectors.rds.source")


class TableSchemas(ColumnarPages):
    """Reflection, schemas, converters and ordering of the source's rows (a mixin of ``RdsSource``)."""

    def _open_table(self) -> None:
        cfg = self.config
        if cfg.table is None:  # the config model requires `table` in every mode but query
            raise ConfigError(f"source {cfg.name!r}: mode {cfg.mode!r} needs `table`")
        self.where = f'table "{cfg.schema_name + "." if cfg.schema_name else ""}{cfg.table}"'
        try:
            tbl = Table(cfg.table, MetaData(), schema=cfg.schema_name, autoload_with=self.engine)
        except NoSuchTableError as exc:
            raise ConfigError(
                f"source {cfg.name!r}: {self.where} does not exist (or is not visible to the user)"
            ) from exc
        except OperationalError as exc:
            raise RetriableError(f"source {cfg.name!r}: cannot reflect {self.where}: {db_reason(exc)}") from exc
        columns: list[Column[Any]] = list(tbl.columns)
        for c in columns:  # MySQL TIME beyond a day: never wrapped silently (see exact_mysql_time)
            c.type = exact_mysql_time(c.type)
        self._require_columns([c.name for c in columns])
        key_names = list(cfg.key or [c.name for c in tbl.primary_key.columns])
        if not key_names:
            raise ConfigError(f"source {cfg.name!r}: {self.where} has no primary key; set `key:` to its key column(s)")
        self.key_columns = key_names
        self.value_schema, converters = avro_record_schema(
            cfg.table,
            [(c.name, c.type, bool(c.nullable) and c.name not in key_names) for c in columns],
            where=self.where,
            doc=f"rows of {self.where}, read by source {cfg.name}",
            decimal_handling=cfg.decimal_handling,
        )
        key_schema, _ = avro_record_schema(
            f"{cfg.table}_key", [(k, tbl.c[k].type, False) for k in key_names], where=self.where,
            decimal_handling=cfg.decimal_handling,
        )
        self.key_schema = key_schema
        self._finish_open(columns, converters, {c.name: c for c in columns})

    def _open_query(self) -> None:
        from schemas import load_schema

        cfg = self.config
        self.where = f"query of source {cfg.name!r}"
        schema = load_schema(cfg.value_schema or "")
        fields = schema.get("fields", [])
        col_names = [f.get("sql.column", f["name"]) for f in fields]
        sub = text(cfg.query or "").columns(*[column(c) for c in col_names]).subquery("q")
        self._require_columns(col_names)
        missing = [k for k in cfg.key or [] if k not in col_names]
        if missing:
            raise ConfigError(f"source {cfg.name!r}: key column(s) {missing} are not fields of value_schema")
        self.key_columns = list(cfg.key or [])
        self.value_schema = schema
        key_fields = []
        for f in fields:
            if f.get("sql.column", f["name"]) in self.key_columns:
                types = f["type"] if isinstance(f["type"], list) else [f["type"]]
                non_null = [t for t in types if t != "null"]
                key_fields.append({"name": f["name"], "type": non_null[0] if len(non_null) == 1 else non_null})
        self.key_schema = {
            "type": "record",
            "name": f"{avro_name(cfg.name)}_key",
            "namespace": "threes.rds",
            "fields": key_fields,
        }
        columns = [sub.c[c] for c in col_names]
        self._finish_open(columns, converters_for_schema(schema), {c: sub.c[c] for c in col_names})

    def _require_columns(self, names: list[str]) -> None:
        cfg = self.config
        for option in ("incrementing_column", "timestamp_column"):
            wanted = getattr(cfg, option)
            if wanted and wanted not in names:
                raise ConfigError(f"source {cfg.name!r}: {option} {wanted!r} is not a column of {self.where}")
        for k in cfg.key or []:
            if k not in names:
                raise ConfigError(f"source {cfg.name!r}: key column {k!r} is not a column of {self.where}")

    def _finish_open(self, columns: list[Any], converters: list[Any], by_name: Mapping[str, Any]) -> None:
        cfg = self.config
        self.columns = columns
        self.field_names = [f["name"] for f in self.value_schema["fields"]]
        self.field_to_column = {f["name"]: f.get("sql.column", f["name"]) for f in self.value_schema["fields"]}
        column_to_field = {v: k for k, v in self.field_to_column.items()}
        self.key_fields = [column_to_field[k] for k in self.key_columns]
        self.key_cols = [by_name[k] for k in self.key_columns]
        converters = drop_needless_converters(converters, self.dialect)
        self.to_value = self._finite_decimals(make_row_converter(self.field_names, converters))
        self._arrow_schema = self._columnar_schema()
        index = {name: i for i, name in enumerate(self.field_names)}
        self._column_converters = [(index[f], fn) for f, fn in converters]
        key_conv = [(f, fn) for f, fn in converters if f in self.key_fields]
        self.to_key = make_row_converter(self.key_fields, key_conv)
        # ordering of the cursor: (timestamp, tie-breaker) or the key / incrementing column
        self.ts_col = by_name[cfg.timestamp_column] if cfg.timestamp_column else None
        self.inc_col = by_name[cfg.incrementing_column] if cfg.incrementing_column else None
        if cfg.mode == "incrementing":
            order = [_needed(self.inc_col, "incrementing_column", cfg.mode)]
        elif cfg.mode == "timestamp":
            order = [_needed(self.ts_col, "timestamp_column", cfg.mode), *self.key_cols]
        elif cfg.mode == "timestamp+incrementing":
            order = [_needed(self.ts_col, "timestamp_column", cfg.mode),
                     _needed(self.inc_col, "incrementing_column", cfg.mode)]
        else:  # bulk, query: a full scan paged by key
            order = list(self.key_cols)
        self.order_cols = order
        self.split = None
        if self.task_count > 1:
            if len(self.key_cols) != 1 or not _is_integer(self.key_cols[0].type):
                raise ConfigError(
                    f"source {cfg.name!r}: `tasks: {self.task_count}` splits rows by an integer key; "
                    f"{self.where} has the key {self.key_columns}"
                )
            k = self.key_cols[0]
            self.split = func.abs(k % literal(self.task_count)) == literal(self.task_id)
        positions = {id(c): i for i, c in enumerate(columns)}
        self.order_idx = [positions[id(c)] for c in order]
        native = all(fn in ARROW_NATIVE_CONVERTERS for _, fn in self._column_converters)
        self._use_adbc = self._arrow_schema is not None and native and adbc_available()
        if self._use_adbc and not all(adbc_bindable(c.type) for c in order):
            self._use_adbc = False
        self._adbc = None

    def _finite_decimals(self, convert: Any) -> Any:
        """``convert`` (row -> value dict), with ``NaN``/``±Infinity`` decimals made null or the row dropped.

        Returns:
            A converter returning the value dict, or ``None`` for a row to leave out (a
            non-finite value in a non-nullable field); ``convert`` itself when no field is
            a decimal. See the class docstring.
        """
        import decimal

        nullable_of: dict[str, bool] = {}
        for f in self.value_schema["fields"]:
            types = f["type"] if isinstance(f["type"], list) else [f["type"]]
            if any(isinstance(t, dict) and t.get("logicalType") == "decimal" for t in types):
                nullable_of[f["name"]] = "null" in types
        if not nullable_of:
            return convert
        fields = tuple(nullable_of.items())
        Decimal = decimal.Decimal

        def to_value(row: Any) -> dict[str, Any] | None:
            value = convert(row)
            for name, nullable in fields:
                v = value[name]
                if v.__class__ is Decimal and not v.is_finite():
                    if not self._non_finite(value, name, nullable):
                        return None
            return value

        return to_value

    def _non_finite(self, value: dict[str, Any], name: str, nullable: bool) -> bool:
        """Null the field (``True``), or say the row is left out (``False``), logging why."""
        key = {k: value[k] for k in self.key_fields}
        shown = value[name]
        if nullable:
            value[name] = None
            log.warning(
                "source=%s %s %s holds %s, which an Avro decimal cannot carry: the record is sent with it null",
                self.config.name, self.describe_key(key), self.describe_field(name), shown,
            )
            return True
        log.error(
            "source=%s %s %s holds %s, which an Avro decimal cannot carry, and is NOT NULL: the row is left out "
            "of the topic until it holds a number (cast it in a `mode: query` SELECT to send something else)",
            self.config.name, self.describe_key(key), self.describe_field(name), shown,
        )
        return False



def _needed(column: Column[Any] | None, option: str, mode: str) -> Column[Any]:
    """The column an option names, which ``mode`` orders by.

    Raises:
        ConfigError: the option is not set (the config model requires it in that mode).
    """
    if column is None:
        raise ConfigError(f"mode {mode!r} needs `{option}`")
    return column


def _is_integer(sql_type: Any) -> bool:
    from sqlalchemy import types as sqltypes

    return isinstance(sql_type, sqltypes.Integer)


