"""How an S3 sink's batch becomes objects: names by first offset, ``dt=`` folders, one writer schema each.

A batch gives one object per ``dt`` folder (``partition_by``) and, for Avro and Parquet, per writer schema;
each is named by its first offset (:func:`object_key`), so a replay overwrites instead of duplicating.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from operator import attrgetter
from typing import Any, NamedTuple

from connectors.api.sink_records import SinkBatch, SinkRecord
from connectors.s3.config import S3SinkConfig

EXTENSIONS = {"jsonl": "jsonl", "parquet": "parquet", "avro": "avro"}
_ROW = attrgetter("row")
_FINGERPRINT = attrgetter("value_fingerprint")


def object_key(prefix: str, topic: str, partition: int, first_offset: int, fmt: str, dt: str | None = None) -> str:
    """The object name of the records of ``topic[partition]`` starting at ``first_offset``.

    After Kafka Connect's S3 sink (``topic+partition+startOffset``): the name
    depends only on where the object starts, so a replay from the last commit
    writes the same names and overwrites, never duplicates. Offsets are
    zero-padded to 20 digits so names sort in offset order.

    Args:
        prefix: the sink's prefix (``""`` or ending in ``/``).
        topic: the update topic.
        partition: its partition.
        first_offset: the first offset in the object.
        fmt: ``jsonl``, ``parquet`` or ``avro``.
        dt: a ``YYYY-MM-DD`` date for a ``dt=...`` folder, or ``None``.

    Returns:
        The S3 key, e.g. ``orders/updates.orders/partition=0/updates.orders+0+00000000000000001000.parquet``.
    """
    folder = f"{prefix}{topic}/partition={partition}/"
    if dt:
        folder += f"dt={dt}/"
    return f"{folder}{topic}+{partition}+{first_offset:020d}.{EXTENSIONS[fmt]}"



class S3Object(NamedTuple):
    """One object of a batch.

    Attributes:
        key: its S3 key (:func:`object_key`).
        records: its records, in offset order.
        value_schema: their parsed value writer schema (``None`` when only tombstones, or JSON Lines).
        fingerprint: that schema's fingerprint (``None`` likewise).
        table: the batch's values of this writer schema in columns (``record.row`` indexes
            them), when the sync service decoded them so: for Parquet one
            ``pyarrow.StructArray``, for JSON Lines a ``polars`` struct ``Series`` ready for JSON
            (:meth:`S3Sink._json_values`); else ``None``.
    """

    key: str
    records: list[SinkRecord]
    value_schema: Any
    fingerprint: bytes | None
    table: Any = None



class BatchObjects:
    """The objects of a batch and the ``dt`` folder of each record (a mixin of ``S3Sink``)."""

    config: S3SinkConfig

    def _dt_columns(self, batch: SinkBatch) -> dict[bytes, list[str | None]]:
        """The ``dt`` of every row of the batch's columnar values, per writer fingerprint (one compute call each).

        The same rule as :meth:`_dt`: a timestamp's UTC date (a local timestamp's own date), a
        date, the first 10 characters of a string; ``None`` (the record's Kafka timestamp
        decides) for anything else or null.
        """
        import pyarrow as pa
        import pyarrow.compute as pc

        field = self.config.partition_by
        out: dict[bytes, list[str | None]] = {}
        for fp, table in batch.tables.items():
            if field not in table.column_names:
                continue
            column = table.column(field)
            typ = column.type
            if pa.types.is_timestamp(typ) or pa.types.is_date(typ):
                # Arrow keeps tz-aware timestamps in UTC: the cast gives the UTC date, like astimezone(UTC)
                days = pc.cast(column, pa.timestamp(typ.unit) if pa.types.is_timestamp(typ) else typ)
                text = pc.strftime(days, format="%Y-%m-%d")
            elif pa.types.is_string(typ) or pa.types.is_large_string(typ):
                text = pc.if_else(pc.greater_equal(pc.utf8_length(column), 10), pc.utf8_slice_codeunits(column, 0, 10),
                                  pa.scalar(None, pa.string()))
            else:
                continue
            out[fp] = text.to_pylist()
        return out

    def _dt(self, record: SinkRecord, columns: dict[bytes, list[str | None]] | None = None) -> str | None:
        field = self.config.partition_by
        if field is None:
            return None
        fingerprint = record.value_fingerprint
        if columns and record.row >= 0 and fingerprint is not None and (found := columns.get(fingerprint)) is not None:
            return found[record.row] or datetime.fromtimestamp(record.timestamp_ms / 1000.0, UTC).date().isoformat()
        value = record.value.get(field) if record.value else None
        if isinstance(value, datetime):
            return value.astimezone(UTC).date().isoformat() if value.tzinfo else value.date().isoformat()
        if isinstance(value, date):
            return value.isoformat()
        if isinstance(value, str) and len(value) >= 10:
            return value[:10]
        return datetime.fromtimestamp(record.timestamp_ms / 1000.0, UTC).date().isoformat()

    def objects(self, batch: SinkBatch) -> list[S3Object]:
        """Split a batch into objects: by ``dt`` folder and, for Avro and Parquet, by writer schema.

        A file has one schema, so a batch whose records change writer schema
        gives one object per schema (and ``dt`` folder); a tombstone joins the
        writer schema of the records before it (the first one of the batch when
        none is before it).

        Returns:
            The objects in order of their first record, each named by its first offset.
        """
        groups: dict[tuple[str | None, bytes | None], list[SinkRecord]] = {}
        schemas: dict[bytes | None, Any] = {None: None}
        by_schema = self.config.format in ("avro", "parquet")
        dt_columns = self._dt_columns(batch) if self.config.partition_by and batch.tables else None
        current: bytes | None = next((r.value_fingerprint for r in batch.records if r.value_fingerprint), None)
        if current is not None:
            schemas[current] = next(r.value_schema for r in batch.records if r.value_fingerprint == current)
        if not by_schema and self.config.partition_by is None:
            if batch.records:  # JSON Lines in no folders: the whole batch is one object
                groups[(None, None)] = list(batch.records)
        else:
            for record in batch.records:
                fp = None
                if by_schema:
                    if record.value_fingerprint is not None:
                        current = record.value_fingerprint
                        schemas[current] = record.value_schema
                    fp = current
                groups.setdefault((self._dt(record, dt_columns), fp), []).append(record)
        out = []
        structs: dict[bytes, Any] = {}  # the batch's values of a writer schema as one struct column
        json_values: dict[bytes, Any] = {}  # the batch's values of a writer schema, JSON-ready, as one struct
        for (dt, fp), records in groups.items():
            key = object_key(
                self.config.prefix, batch.topic, batch.partition, records[0].offset, self.config.format, dt
            )
            values = None
            if self.config.format == "jsonl":
                values = self._json_values(batch, records, json_values)
            if self.config.format == "parquet" and fp in batch.tables:
                values = structs.get(fp)
                if values is None:
                    table = batch.tables[fp]
                    values = structs[fp] = table.to_struct_array().combine_chunks()
            out.append(S3Object(key, records, schemas.get(fp), fp, values))
        return out

    @staticmethod
    def _json_values(batch: SinkBatch, records: list[SinkRecord], cache: dict[bytes, Any]) -> Any:
        """The batch's columnar values of ``records``' writer schema, ready for JSON (one struct ``Series``).

        A ``polars.Series`` named ``value`` whose NDJSON is what orjson writes for each value dict
        (:func:`schemas.documents.json_frame`, decimals as text), ``record.row`` indexing it;
        ``None`` when the upserts among ``records`` are not all of one writer schema decoded in
        columns, or a nested type needs a conversion (then each value is serialized on its own).
        """
        from schemas.documents import json_frame

        upserts = [r for r in records if not r.is_delete]
        if not upserts or min(map(_ROW, upserts)) < 0:
            return None
        fps = set(map(_FINGERPRINT, upserts))
        if len(fps) != 1:
            return None
        fp = fps.pop()
        if fp not in cache:
            table = batch.tables.get(fp)
            frame = json_frame(table, decimals="text") if table is not None else None
            cache[fp] = frame.to_struct("value") if frame is not None else None
        return cache[fp]
