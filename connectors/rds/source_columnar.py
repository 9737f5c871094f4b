"""Column-wise pages of an RDS source (PostgreSQL): Arrow tables, read through ADBC when its driver is installed.

A page whose values do not fit the schema's Arrow types goes record by record, so errors name the column.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from connectors.api.source import SourceBatch
from connectors.rds.reading import adbc_connect, arrow_pages, prefetched
from connectors.rds.source_state import RdsSourceBase
from connectors.rds.types import decimal_text
from connectors.runtime.columnar import ColumnarEncoder, ColumnarUnsupported
from kernel.exceptions import FatalError, RetriableError

# the source's log lines keep the logger name they always had
log = logging.getLogger("connectors.rds.source")


class ColumnarPages(RdsSourceBase):
    """The Arrow schema of pages, pages as Arrow tables, ADBC reads (a mixin of ``RdsSource``)."""

    def _columnar_schema(self) -> Any:
        """The Arrow schema of column-wise batches, or ``None`` to yield one dict per row.

        Column-wise on PostgreSQL (ADBC's Arrow types, or psycopg's exact Python
        types, see :func:`~connectors.rds.reading.stream_rows`) when the columnar
        encoder writes every field; other dialects and other types keep the
        per-record path.
        """
        if self.dialect != "postgresql":
            return None
        try:
            encoder = ColumnarEncoder(self.value_schema, bytes(10), self.key_schema, bytes(10))
        except ColumnarUnsupported as exc:
            log.info("source=%s encodes record by record: %s", self.config.name, exc)
            return None
        return encoder.arrow_schema

    def _columns(self, rows: list[Any]) -> Any:
        """One page as an Arrow table (``None`` when a value does not convert: the page goes record by record)."""
        import pyarrow as pa

        columns: list[Any] = list(zip(*rows, strict=True))
        for i, fn in self._column_converters:
            columns[i] = [None if v is None else fn(v) for v in columns[i]]
        try:
            arrays = [pa.array(col, type=f.type) for col, f in zip(columns, self._arrow_schema, strict=True)]
            return pa.Table.from_arrays(arrays, schema=self._arrow_schema)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            # e.g. more fractional digits than the decimal's scale: the per-record path names the column
            log.debug("source=%s a page goes record by record: %s", self.config.name, exc)
            return None

    def _arrow_batches(self, stmt: Any) -> Iterator[SourceBatch]:
        """Pages read as Arrow through ADBC (PostgreSQL), one column-wise batch each, the next read meanwhile.

        A page whose columns do not convert to the value schema's Arrow types (a
        ``numeric`` value with more digits than its scale, ``NaN``) becomes one
        dict per row, so the per-record path reports the column as it always did.

        Raises:
            RetriableError: the connection failed.
            FatalError: the database rejected the query.
        """
        import adbc_driver_manager

        cfg = self.config
        try:
            if self._adbc is None:
                self._adbc = adbc_connect(self.connection.sqlalchemy_url(), self.connection.connect_timeout_s)
            pages = arrow_pages(self._adbc, stmt, cfg.batch_records)
            for raw, table in prefetched((raw, self._conform(raw)) for raw in pages):
                last = _python_rows(raw.slice(raw.num_rows - 1), self._arrow_schema)[0]
                self.cursor = [last[i] for i in self.order_idx]
                if table is not None:
                    yield SourceBatch([], self._position(), columns=table, source_ts_ms=self._cursor_ts_ms())
                    continue
                records: list[Any] = []
                for row in _python_rows(raw, self._arrow_schema):
                    v = self.to_value(row)
                    if v is not None:  # None: a row left out (a NaN in a NOT NULL decimal)
                        records.append(({k: v[k] for k in self.key_fields}, v))
                yield SourceBatch(records, self._position(), source_ts_ms=self._cursor_ts_ms())
        except adbc_driver_manager.Error as exc:
            self._close_adbc()
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if isinstance(exc, (adbc_driver_manager.OperationalError, adbc_driver_manager.InterfaceError)):
                raise RetriableError(f"source {cfg.name!r}: reading {self.where} failed: {reason}") from exc
            raise FatalError(f"source {cfg.name!r}: reading {self.where} failed: {reason}") from exc

    def _conform(self, raw: Any) -> Any:
        """A page from ADBC in the value schema's Arrow types (``None`` when a value does not convert)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        texts = {i for i, fn in self._column_converters if fn is decimal_text}
        try:
            arrays = []
            for i, f in enumerate(self._arrow_schema):
                col = _storage(raw.column(i))
                if i in texts:
                    col = _numeric_text(col)
                arrays.append(col if col.type == f.type else pc.cast(col, f.type))
            return pa.Table.from_arrays(arrays, schema=self._arrow_schema)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            log.debug("source=%s a page goes record by record: %s", self.config.name, exc)
            return None

    def _close_adbc(self) -> None:
        if self._adbc is not None:
            try:
                self._adbc.close()
            except Exception as exc:  # a broken connection may fail to close
                log.debug("source=%s closing the ADBC connection: %s", self.config.name, exc)
            self._adbc = None



def adbc_available() -> bool:
    """Whether ADBC's PostgreSQL driver is installed (pages are then read as Arrow, see :meth:`RdsSource.poll`)."""
    import importlib.util

    return importlib.util.find_spec("adbc_driver_postgresql") is not None


def adbc_bindable(sql_type: Any) -> bool:
    """Whether a cursor column's values bind as ADBC parameters exactly (integers, text, dates, date-times)."""
    from sqlalchemy import types as sqltypes

    if isinstance(sql_type, sqltypes.Enum):
        return False
    return isinstance(sql_type, (sqltypes.Integer, sqltypes.String, sqltypes.DateTime, sqltypes.Date))


def _storage(column: Any) -> Any:
    """An extension-typed column (ADBC's ``numeric`` is an opaque text type) as its storage."""
    import pyarrow as pa

    if isinstance(column.type, pa.BaseExtensionType):  # pa.OpaqueType is no pa.ExtensionType
        return pa.chunked_array([c.storage for c in column.chunks], type=column.type.storage_type)
    return column


def _numeric_text(column: Any) -> Any:
    """ADBC's text of ``numeric`` values as PostgreSQL writes them (``inf`` as ``Infinity``...).

    ``inf``/``-inf``/``nan`` become ``Infinity``/``-Infinity``/``NaN``, what
    :func:`~connectors.rds.types.decimal_text` writes for psycopg's rows; numbers are already PostgreSQL's exact text.
    """
    import pyarrow.compute as pc

    column = pc.replace_substring_regex(column, pattern="^(-?)[iI][nN][fF]$", replacement="\\1Infinity")
    return pc.replace_substring_regex(column, pattern="^[nN][aA][nN]$", replacement="NaN")


def _python_rows(raw: Any, schema: Any) -> list[tuple[Any, ...]]:
    """A page from ADBC as row tuples of the values psycopg would return (``numeric`` as ``Decimal``)."""
    import decimal

    import pyarrow as pa

    columns = []
    for i, f in enumerate(schema):
        values = _storage(raw.column(i)).to_pylist()
        if pa.types.is_decimal(f.type):
            values = [None if v is None or isinstance(v, decimal.Decimal) else decimal.Decimal(v) for v in values]
        columns.append(values)
    return list(zip(*columns, strict=True))


