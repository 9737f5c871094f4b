"""JSON documents from columns: one JSON text per row of an Arrow table, written by polars.

Used by the sinks that write JSON (Elasticsearch documents, S3 JSON Lines) from the
sync service's columnar values (:mod:`schemas.columnar`). The per-record path
serializes each value dict with orjson (with elasticsearch-py's ``default``, or the
S3 sink's, for what orjson lacks). This module
writes the same JSON for a whole table at once (polars' NDJSON writer), after
converting in columns the types whose JSON the two would spell differently:

=================================  =====================================================
Arrow (from :mod:`schemas.arrow`)  JSON, as the client writes the Python value
=================================  =====================================================
``decimal128``                     number (the client's ``default`` gives ``float``), or text
``float32``                        number of the float64 it widens to (Python has no f32)
binary / fixed                     base64 text (``_json_safe`` of the sink)
``timestamp`` without time zone    ``YYYY-MM-DDTHH:MM:SS[.ffffff]`` (``isoformat``)
``timestamp`` in UTC               ``YYYY-MM-DDTHH:MM:SS[.ffffff]+00:00`` (``isoformat``)
``time32`` / ``time64``            ``HH:MM:SS[.ffffff]`` (``isoformat``)
=================================  =====================================================

Dates, numbers, strings, booleans and
nulls are written alike by both; NaN becomes ``null`` in both. A table with one
of the converted types nested inside a struct or a list is not converted
(:func:`documents` returns ``None``) and the sink takes the per-record path.
"""

from __future__ import annotations

from typing import Any, cast


def _kind(typ: Any) -> str | None:
    import pyarrow as pa

    if pa.types.is_decimal(typ):
        return "decimal"
    if pa.types.is_float32(typ) or pa.types.is_float16(typ):
        return "float32"
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ):
        return "binary"
    if pa.types.is_timestamp(typ):
        return "naive timestamp" if not typ.tz else "utc timestamp" if typ.tz in ("UTC", "+00:00") else None
    if pa.types.is_time(typ):
        return "time"
    return None


def _nested_needs_conversion(typ: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_struct(typ):
        return any(_kind(f.type) or _nested_needs_conversion(f.type) for f in typ)
    if pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ):
        return bool(_kind(typ.value_type) or _nested_needs_conversion(typ.value_type))
    return bool(pa.types.is_map(typ))


def json_frame(table: Any, decimals: str = "number") -> Any:
    """``table`` as a polars ``DataFrame`` whose NDJSON is what the client writes for its ``row`` dicts.

    Args:
        table: a ``pyarrow.Table`` typed by :mod:`schemas.arrow` (the sync service's columnar values).
        decimals: ``"number"`` (elasticsearch-py's ``default``: ``float``) or ``"text"``
            (``str(Decimal)``, what the S3 sink's JSON Lines write; Arrow's decimal to string
            follows the same to-scientific-string rule).

    Returns:
        A ``polars.DataFrame`` of ``table.num_rows`` rows, the columns of the table above
        converted (same names, same order); ``None`` when a column needs a conversion inside a
        nested type (the caller serializes per record).
    """
    import polars as pl

    if any(_nested_needs_conversion(f.type) for f in table.schema):
        return None
    if decimals == "text":
        import pyarrow as pa

        for i, field in enumerate(table.schema):
            if pa.types.is_decimal(field.type):
                table = table.set_column(i, field.name, table.column(i).cast(pa.string()))
    frame = cast(pl.DataFrame, pl.from_arrow(table, rechunk=False))  # a table gives a frame, never a series
    conversions = []
    for field in table.schema:
        kind = _kind(field.type)
        if kind is None:
            continue
        col = pl.col(field.name)
        if kind in ("decimal", "float32"):
            conversions.append(col.cast(pl.Float64))
        elif kind == "binary":
            conversions.append(col.cast(pl.Binary).bin.encode("base64"))
        else:
            whole = "%H:%M:%S" if kind == "time" else "%Y-%m-%dT%H:%M:%S"
            zone = "+00:00" if kind == "utc timestamp" else ""
            conversions.append(
                pl.when(col.dt.microsecond() == 0)
                .then(col.dt.to_string(whole + zone))
                .otherwise(col.dt.to_string(whole + ".%6f" + zone))
                .alias(field.name)
            )
    return frame.with_columns(conversions) if conversions else frame


def documents(table: Any, decimals: str = "number") -> list[bytes] | None:
    """One JSON document per row of ``table``, equal to what the client writes for ``row`` dicts.

    Args:
        table: a ``pyarrow.Table`` typed by :mod:`schemas.arrow` (the sync service's columnar values).
        decimals: as :func:`json_frame`.

    Returns:
        ``table.num_rows`` JSON texts (UTF-8, no newline), in row order; ``None`` when a
        column needs a conversion inside a nested type (the caller serializes per record).
    """
    frame = json_frame(table, decimals)
    if frame is None:
        return None
    if table.num_rows == 0:
        return []
    text: bytes = frame.write_ndjson().encode()
    lines = text.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines
