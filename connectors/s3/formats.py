"""The S3 sink's file formats: envelopes as JSON Lines, Parquet or Avro object container files.

Every format writes one row per update, the envelope ``{topic, partition,
offset, timestamp_ms, key, version, deleted, value}`` (:func:`envelope`).
"""

from __future__ import annotations

import base64
import io
import logging
import uuid
from datetime import date, datetime
from decimal import Decimal
from operator import attrgetter
from typing import Any

from connectors.api.sink_records import SinkRecord

# a record's envelope fields, gathered into columns by one map each
_IS_DELETE, _ROW, _KEY = attrgetter("is_delete"), attrgetter("row"), attrgetter("key")
_OFFSET, _TIMESTAMP, _VERSION = attrgetter("offset"), attrgetter("timestamp_ms"), attrgetter("version")

log = logging.getLogger(__name__)


def _plain_schema(schema: Any) -> Any:
    """Drop fastavro's private keys (``__fastavro_parsed``...) to embed a parsed schema in another."""
    if isinstance(schema, dict):
        return {k: _plain_schema(v) for k, v in schema.items() if not k.startswith("__")}
    if isinstance(schema, list):
        return [_plain_schema(v) for v in schema]
    return schema


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _arrow_safe(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {k: _arrow_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_arrow_safe(v) for v in value]
    return value


def envelope(record: SinkRecord) -> dict[str, Any]:
    """One output row: where the update came from, its key and version, and the value (``None`` = delete)."""
    return {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "key": record.key_id,
        "version": record.version,
        "deleted": record.is_delete,
        "value": record.value,
    }


def encode_jsonl(records: list[SinkRecord], values: Any = None) -> bytes:
    """JSON Lines, one envelope per line (dates RFC 3339, decimals as text, bytes base64).

    With ``values``, the whole object is written in columns by polars' NDJSON writer
    (:func:`jsonl_from_columns`); without, each envelope by orjson. Both give the same bytes.

    Args:
        records: the object's records, of one topic and partition.
        values: the batch's values of these records' writer schema in columns, ready for JSON:
            a ``polars`` struct ``Series`` (``record.row`` indexes it) from
            :func:`schemas.documents.json_frame` with decimals as text; ``None`` serializes
            each value.

    Raises:
        TypeError: a value JSON cannot represent (orjson's ``JSONEncodeError`` is a ``TypeError``).
    """
    if values is not None:
        return jsonl_from_columns(records, values)
    import orjson

    dumps, option = orjson.dumps, orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS
    return b"".join(dumps(envelope(r), default=_json_default, option=option) for r in records)


def jsonl_from_columns(records: list[SinkRecord], values: Any) -> bytes:
    """The JSON Lines of ``records`` from their values in columns, one polars NDJSON write per object.

    The envelope's columns are gathered from the records (a list per field, no dict per
    record), the values taken by ``record.row`` from ``values`` (null for a tombstone).
    Keys follow :attr:`SinkRecord.key_id`: integer keys are cast to text in one call.

    Args:
        records: the object's records, of one topic and partition; every upsert has a row.
        values: a ``polars`` struct ``Series`` of JSON-ready values (see :func:`encode_jsonl`).

    Raises:
        ValueError: an upsert has no row in ``values``.
    """
    import polars as pl

    if not records:
        return b""
    n, first = len(records), records[0]
    deleted = pl.Series("deleted", list(map(_IS_DELETE, records)), pl.Boolean)
    rows = pl.Series("row", list(map(_ROW, records)), pl.Int64).set(deleted, None)
    if (rows < 0).any():
        raise ValueError("an upsert has no row in the columnar values")
    keys = list(map(_KEY, records))
    if set(map(type, keys)) == {int}:
        key = pl.Series("key", keys, pl.Int64).cast(pl.String)
    else:
        key = pl.Series("key", [r.key_id for r in records], pl.String)
    frame = pl.DataFrame(
        [
            pl.repeat(first.topic, n, dtype=pl.String, eager=True).alias("topic"),
            pl.repeat(first.partition, n, dtype=pl.Int32, eager=True).alias("partition"),
            pl.Series("offset", list(map(_OFFSET, records)), pl.Int64),
            pl.Series("timestamp_ms", list(map(_TIMESTAMP, records)), pl.Int64),
            key,
            pl.Series("version", list(map(_VERSION, records)), pl.Int64),
            deleted,
            values.gather(rows).alias("value"),
        ]
    )
    out = io.BytesIO()
    frame.write_ndjson(out)
    return out.getvalue()


def envelope_arrow_schema(value_type: Any) -> Any:
    """The Arrow schema of Parquet envelopes whose ``value`` column has type ``value_type`` (a struct).

    The columns and their types follow the Avro envelope of :func:`encode_avro`:
    ``topic`` string, ``partition`` int32, ``offset``/``timestamp_ms``/``version``
    int64, ``key`` string, ``deleted`` bool, ``value`` nullable (null for a tombstone).
    """
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("topic", pa.string(), nullable=False),
            pa.field("partition", pa.int32(), nullable=False),
            pa.field("offset", pa.int64(), nullable=False),
            pa.field("timestamp_ms", pa.int64(), nullable=False),
            pa.field("key", pa.string(), nullable=False),
            pa.field("version", pa.int64(), nullable=False),
            pa.field("deleted", pa.bool_(), nullable=False),
            pa.field("value", value_type, nullable=True),
        ]
    )


class ParquetSchemas:
    """The Parquet envelope schema of each value writer schema, computed once per fingerprint.

    Thread-safe: two threads computing the same entry at once store equal schemas.
    """

    def __init__(self) -> None:
        self._by_fingerprint: dict[bytes, tuple[Any, bool]] = {}

    def get(self, fingerprint: bytes | None, value_schema: Any) -> tuple[Any, bool]:
        """``(Arrow schema or None, values need _arrow_safe)`` for records of one writer schema.

        ``None`` (infer the types from the values) when there is no writer schema
        (an object of tombstones only) or it has no faithful Arrow type
        (:class:`schemas.arrow.UnsupportedAvroType`).
        """
        if fingerprint is None or value_schema is None:
            return None, True
        found = self._by_fingerprint.get(fingerprint)
        if found is None:
            from schemas.arrow import UnsupportedAvroType, arrow_type, has_uuid

            try:
                found = (envelope_arrow_schema(arrow_type(value_schema)), has_uuid(value_schema))
            except UnsupportedAvroType as exc:
                log.warning(
                    "writer schema %s has no faithful Arrow type (%s): Parquet types inferred per object",
                    fingerprint.hex(),
                    exc,
                )
                found = (None, True)
            self._by_fingerprint[fingerprint] = found
        return found


_SCHEMAS = ParquetSchemas()

# Dictionary encoding pays from about a thousand rows: below that its dictionary pages cost more time and bytes
# than the repeated values they replace, above it the object is smaller and faster to write (the demo's flights).
DICTIONARY_MIN_ROWS = 1_000


def encode_parquet(
    records: list[SinkRecord],
    value_schema: Any = None,
    fingerprint: bytes | None = None,
    schemas: ParquetSchemas | None = None,
    compression: str = "snappy",
    values: Any = None,
) -> bytes:
    """Parquet (pyarrow; dictionary encoding from ``DICTIONARY_MIN_ROWS`` rows), one row per envelope.

    With the records' Avro writer schema, the Arrow schema is derived from it
    (:mod:`schemas.arrow`, the mapping of Spark's ``spark-avro`` and Kafka
    Connect's Parquet format) and cached per ``fingerprint``: every object of
    one writer schema then has the same Parquet schema, and no type inference
    runs. Without one (an object of tombstones only), or when the writer schema
    has no faithful Arrow type (a union of several non-null types, a recursive
    record), the types are inferred from this object's values (a column that
    is all null here is then typed ``null``). ``value`` is a struct column, null
    for a tombstone.

    Each object is converted on its own: converting a whole batch once and
    taking each object's rows from it (``Table.take``) is no faster, and would
    delay the first upload until the whole batch is converted.

    Args:
        records: the object's records; values of one writer schema (or tombstones).
        value_schema: their parsed fastavro writer schema, or ``None``.
        fingerprint: its fingerprint (the cache key), or ``None``.
        schemas: the cache to use (a module-wide one by default).
        compression: the column chunks' codec (``snappy``, ``zstd``, ``gzip``, ``lz4``, ``none``).
            zstd costs more CPU per small object than snappy (a zstd context per column chunk).
        values: the batch's values of this writer schema already decoded in columns, as one
            ``pyarrow.StructArray`` typed by :mod:`schemas.arrow` (``record.row`` is each
            upsert's row there), taken as the ``value`` column without any Python object
            per value; ``None`` builds it from ``record.value``.

    Returns:
        The Parquet file's bytes.

    Raises:
        ValueError, TypeError, OverflowError: a value Arrow cannot represent (pyarrow's
            ``ArrowInvalid``/``ArrowTypeError`` are such errors).
    """
    import pyarrow as pa

    schema, needs_safe = (schemas or _SCHEMAS).get(fingerprint, value_schema)
    if values is not None and schema is not None:
        return _parquet_file(_envelope_table(records, values, schema), compression, len(records))
    rows = [envelope(r) for r in records]
    if needs_safe:
        for row in rows:
            if row["value"] is not None:
                row["value"] = _arrow_safe(row["value"])
    return _parquet_file(pa.Table.from_pylist(rows, schema=schema), compression, len(records))


def _parquet_file(table: Any, compression: str, records: int) -> bytes:
    """``table`` (of ``records`` rows) as a Parquet file: dictionary encoding from ``DICTIONARY_MIN_ROWS`` rows."""
    import pyarrow.parquet as pq

    out = io.BytesIO()
    pq.write_table(table, out, compression=compression, use_dictionary=records >= DICTIONARY_MIN_ROWS)
    return out.getvalue()


def _envelope_table(records: list[SinkRecord], values: Any, schema: Any) -> Any:
    """The Parquet envelope table of ``records`` from their values in columns (see :func:`encode_parquet`).

    Raises:
        ValueError: ``values`` is not of the schema's value type, or an upsert has no row in it.
    """
    import pyarrow as pa

    value_type = schema.field("value").type
    if values.type != value_type:
        raise ValueError(f"columnar values have type {values.type}, the envelope wants {value_type}")
    rows = [None if r.is_delete else r.row for r in records]
    if any(row is not None and row < 0 for row in rows):
        raise ValueError("an upsert has no row in the columnar values")
    # one take of the struct column: the object's rows, nulls for its tombstones
    from schemas.arrow_conform import null_rows_filled

    value = null_rows_filled(values.take(pa.array(rows, pa.int64())))
    columns = [
        pa.array([r.topic for r in records], pa.string()),
        pa.array([r.partition for r in records], pa.int32()),
        pa.array([r.offset for r in records], pa.int64()),
        pa.array([r.timestamp_ms for r in records], pa.int64()),
        pa.array([r.key_id for r in records], pa.string()),
        pa.array([r.version for r in records], pa.int64()),
        pa.array([r.is_delete for r in records], pa.bool_()),
        value,
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def encode_avro(records: list[SinkRecord], value_schema: Any) -> bytes:
    """An Avro object container file (deflate) of envelopes; ``value`` uses the records' writer schema."""
    import fastavro

    value_type: Any = ["null", _plain_schema(value_schema)] if value_schema is not None else "null"
    schema = {
        "type": "record",
        "name": "Update",
        "namespace": "threes.s3",
        "fields": [
            {"name": "topic", "type": "string"},
            {"name": "partition", "type": "int"},
            {"name": "offset", "type": "long"},
            {"name": "timestamp_ms", "type": "long"},
            {"name": "key", "type": "string"},
            {"name": "version", "type": "long"},
            {"name": "deleted", "type": "boolean"},
            {"name": "value", "type": value_type},
        ],
    }
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(schema), (envelope(r) for r in records), codec="deflate")
    return out.getvalue()
