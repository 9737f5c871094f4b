"""``S3Sink``: update topics into JSON Lines, Parquet or Avro objects with deterministic names."""

from __future__ import annotations

import io
import logging
import threading
from datetime import UTC, date, datetime, timedelta
from operator import attrgetter
from typing import Any, NamedTuple

from s3transfer.subscribers import BaseSubscriber

from connectors.api.sink import Sink
from connectors.api.sink_records import RecordFailure, SinkBatch, SinkRecord
from connectors.s3.config import S3SinkConfig
from connectors.s3.connection import S3Connection, s3_client
from connectors.s3.formats import ParquetSchemas, encode_avro, encode_jsonl, encode_parquet
from kernel.config.policies import BatchPolicy
from kernel.exceptions import FatalError, RetriableError, SetupError, SinkBackpressureError, SinkBlockedError

__all__ = ["S3Sink", "encode_avro", "encode_jsonl", "encode_parquet", "object_key"]

log = logging.getLogger(__name__)

EXTENSIONS = {"jsonl": "jsonl", "parquet": "parquet", "avro": "avro"}
_BUSY_CODES = {"SlowDown", "503", "RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequests"}
_FATAL_CODES = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"}
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


class S3Sink(Sink):
    """Write update topics to S3 objects: one object per batch (and date/schema group), named by first offset.

    Delivery guarantee: at least once, effectively once per object: an object's
    name is ``topic+partition+first_offset`` (:func:`object_key`), so writing a
    batch again after a crash overwrites the same object instead of adding a
    copy. Records keep their ``version`` and a ``deleted`` flag: the state of a
    key is its highest-version row across objects (a reader's merge), which an
    older update can never win.

    Idempotency key: the object name (topic, partition, first offset). Batch
    boundaries are set by ``rotate_records``/``rotate_bytes``/``rotate_interval_s``
    (the batch policy of this sink's partitions); a replay cut at another
    boundary (time or bytes) may write the tail of an object again in a new
    object, never lose one.

    Uploads: one s3transfer ``TransferManager`` per sink (from ``open`` to
    ``close``) uploads a batch's objects concurrently, at most
    ``max_concurrency`` requests at once, while the next objects are encoded;
    a batch is written once all its uploads succeeded, and fails whole
    otherwise. Objects of at least ``multipart_threshold_bytes`` go up as
    multipart uploads (parallel parts), aborted on failure; S3 shows an object
    only once complete. At start, this sink's multipart uploads older than
    ``stale_upload_s`` (left by a killed process) are aborted.

    Backpressure: ``SlowDown``/503 answers (after boto3's own adaptive retries).

    Formats: JSON Lines, Parquet (pyarrow; Arrow types from the Avro writer
    schema, :func:`encode_parquet`) or Avro container files (fastavro), rows
    ``{topic, partition, offset, timestamp_ms, key, version, deleted, value}``.
    Parquet and Avro objects hold records of one writer schema each.

    YAML: see :class:`~connectors.s3.config.S3SinkConfig`
    (its example is rendered in docs/config-reference.md).
    """

    # the base class holds any sink's config and connection; this sink's are these
    config: S3SinkConfig
    connection: S3Connection

    def __init__(self, config: Any, connection: Any, **kwargs: Any):
        super().__init__(config, connection, **kwargs)
        self.client: Any = None
        self._transfer: Any = None
        self._manager: Any = None  # s3transfer.manager.TransferManager, from open() to close()
        self._schemas = ParquetSchemas()

    def batch_policy(self, default: BatchPolicy) -> BatchPolicy:
        """One batch is one object: rotation by records, bytes and age only.

        A drained input does not cut an object (``flush_when_idle`` off, as Kafka
        Connect's S3 sink rotates only on ``flush.size`` and ``rotate.interval.ms``):
        cut at every pause of the input, a steady stream became thousands of small
        objects (the demo's archive: 6,363 objects of ~50 rows, most of the sink's CPU
        in per-object Parquet overhead).
        """
        return BatchPolicy(
            max_records=self.config.rotate_records,
            max_bytes=self.config.rotate_bytes,
            max_age_ms=int(self.config.rotate_interval_s * 1000),
            flush_when_idle=False,
        )

    def open(self) -> None:
        """Create the client, check (or create) the bucket, abort stale multipart uploads, start the uploader.

        Raises:
            SetupError: S3 cannot be reached.
            FatalError: the bucket is missing and ``create_bucket`` is off, or access is denied.
        """
        from boto3.s3.transfer import TransferConfig, create_transfer_manager
        from botocore.exceptions import ClientError

        self.client = s3_client(self.connection)
        self._transfer = TransferConfig(
            multipart_threshold=self.config.multipart_threshold_bytes,
            multipart_chunksize=self.config.multipart_threshold_bytes,
            max_concurrency=self.config.max_concurrency,
        )
        try:
            self.check()
        except FatalError:
            if not self.config.create_bucket:
                raise
            try:
                self.client.create_bucket(Bucket=self.config.bucket)
            except ClientError as exc:
                raise FatalError(f"sink {self.name!r}: cannot create bucket {self.config.bucket!r}: {exc}") from exc
        self.abort_stale_uploads()
        # one manager (and thread pool) for the sink's life: boto3's upload_fileobj builds one per object
        self._manager = create_transfer_manager(self.client, self._transfer)

    def check(self) -> None:
        """``HeadBucket``.

        Raises:
            SetupError: S3 does not answer or refuses our credentials.
            FatalError: the bucket does not exist.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client or s3_client(self.connection)
        try:
            client.head_bucket(Bucket=self.config.bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("403", *_FATAL_CODES - {"NoSuchBucket"}):
                raise SetupError(
                    f"sink {self.name!r}: S3 refused our credentials for bucket {self.config.bucket!r} ({code})",
                    "check the connection's keys",
                ) from exc
            raise FatalError(f"sink {self.name!r}: bucket {self.config.bucket!r} not usable ({code})") from exc
        except BotoCoreError as exc:
            raise SetupError(
                f"sink {self.name!r}: S3 {self.connection.endpoint_url or 'AWS'} did not answer: {exc}"
            ) from exc

    def abort_stale_uploads(self) -> int:
        """Abort this sink's multipart uploads begun more than ``stale_upload_s`` ago.

        Returns:
            How many were aborted.
        """
        from botocore.exceptions import ClientError

        cutoff = datetime.now(UTC) - timedelta(seconds=self.config.stale_upload_s)
        aborted = 0
        for topic in self.config.topics:
            prefix = f"{self.config.prefix}{topic}/partition="
            try:
                pages = self.client.get_paginator("list_multipart_uploads").paginate(
                    Bucket=self.config.bucket, Prefix=prefix
                )
                for page in pages:
                    for upload in page.get("Uploads", []):
                        if upload["Initiated"] <= cutoff:
                            self.client.abort_multipart_upload(
                                Bucket=self.config.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                            )
                            aborted += 1
            except ClientError as exc:
                log.warning("sink=%s cannot list multipart uploads under %s: %s", self.name, prefix, exc)
        if aborted:
            log.info("sink=%s aborted %d stale multipart upload(s)", self.name, aborted)
        return aborted

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

    def encode(self, obj: S3Object, records: list[SinkRecord] | None = None) -> bytes:
        """Encode an object's records (or ``records``, a subset of them) in the configured format.

        Raises:
            ValueError, TypeError, OverflowError: a value the format cannot represent.
        """
        records = obj.records if records is None else records
        if self.config.format == "jsonl":
            return encode_jsonl(records, obj.table if records is obj.records else None)
        if self.config.format == "parquet":
            return encode_parquet(records, obj.value_schema, obj.fingerprint, self._schemas,
                                  self.config.parquet_compression, obj.table if records is obj.records else None)
        return encode_avro(records, obj.value_schema)

    def _encode_or_isolate(self, obj: S3Object, failures: list[RecordFailure]) -> tuple[list[SinkRecord], bytes]:
        """The object's body; when a record cannot be encoded, the body of the others and that record's failure.

        Returns:
            ``(records encoded, body)``; no records (and an empty body) when none could be encoded.
        """
        try:
            return obj.records, self.encode(obj)
        except (ValueError, TypeError, OverflowError) as exc:
            # one bad record spoils the object: find it by encoding each alone
            good, bad = [], 0
            for record in obj.records:
                try:
                    self.encode(obj, [record])
                    good.append(record)
                except (ValueError, TypeError, OverflowError) as one:
                    bad += 1
                    failures.append(RecordFailure(record, type(one)(f"{record.where()}: {one}"), about_data=True))
            log.warning("sink=%s object=%s: %d record(s) not encodable: %s", self.name, obj.key, bad, exc)
            return good, self.encode(obj, good) if good else b""

    def _upload_error(self, key: str, exc: BaseException) -> Exception:
        """The sink error an upload's failure maps to (what the runtime does about it)."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, (ClientError, S3UploadFailedError)):
            code = exc.response.get("Error", {}).get("Code", "") if isinstance(exc, ClientError) else ""
            text = str(exc)
            if code in _BUSY_CODES or "SlowDown" in text or "503" in text:
                return SinkBackpressureError(2.0, f"sink {self.name!r}: S3 slow down on {key}")
            if code in _FATAL_CODES or any(c in text for c in _FATAL_CODES):
                # any object would get it (the bucket gone, access denied): the target's error, the sink
                # blocks and writes the batch again once the bucket or the policy is back
                return SinkBlockedError(f"cannot write s3://{self.config.bucket}/{key}: {text} (sink {self.name!r})")
            return RetriableError(f"sink {self.name!r}: upload of {key} failed: {text}")
        if isinstance(exc, BotoCoreError):
            return RetriableError(f"sink {self.name!r}: S3 unreachable uploading {key}: {exc}")
        return RetriableError(f"sink {self.name!r}: upload of {key} failed: {type(exc).__name__}: {exc}")

    def write(self, batch: SinkBatch) -> list[RecordFailure]:
        """Encode the batch's objects and upload them concurrently (overwriting same-named ones from a replay).

        Objects are encoded one after another in the calling thread while the
        sink's transfer manager uploads the ones already encoded: at most
        ``max_concurrency`` uploads of this batch are in flight (the manager's
        pool, shared by the batches written at once, also holds at most
        ``max_concurrency`` requests). ``write`` returns once every upload
        finished. A failed upload fails the whole batch (no further object is
        submitted, the submitted ones are awaited); the runtime writes it again,
        and the deterministic names make the objects already uploaded be
        overwritten, not duplicated.

        Returns:
            The records no format could encode (to the dead letter topic).

        Raises:
            SinkBackpressureError: S3 answered ``SlowDown``/503.
            RetriableError: S3 unreachable or another transient error.
            SinkBlockedError: the bucket is gone or access is denied (wins over the others when
                several uploads failed): the sink blocks, nothing is dead-lettered.
        """
        failures: list[RecordFailure] = []
        slots = threading.BoundedSemaphore(self.config.max_concurrency)
        failed = threading.Event()
        submitted: list[tuple[str, Any]] = []
        errors: list[tuple[str, BaseException]] = []
        try:
            for obj in self.objects(batch):
                records, body = self._encode_or_isolate(obj, failures)
                if not records:
                    continue
                slots.acquire()
                if failed.is_set():
                    slots.release()
                    break  # the batch fails anyway: upload nothing more
                future = self._manager.upload(
                    io.BytesIO(body), self.config.bucket, obj.key, subscribers=[_Release(slots, failed)]
                )
                submitted.append((obj.key, future))
                log.debug(
                    "sink=%s object=s3://%s/%s records=%d bytes=%d",
                    self.name,
                    self.config.bucket,
                    obj.key,
                    len(records),
                    len(body),
                )
        finally:
            for key, future in submitted:  # wait for all, even when encoding raised
                try:
                    future.result()
                except Exception as exc:  # noqa: BLE001 - mapped below, first by severity
                    errors.append((key, exc))
        if errors:
            mapped = [(self._upload_error(key, exc), exc) for key, exc in errors]
            rank = {FatalError: 0, SinkBlockedError: 0, SinkBackpressureError: 1}
            error, cause = min(mapped, key=lambda m: rank.get(type(m[0]), 2))
            raise error from cause
        return failures

    def close(self) -> None:
        """Wait for uploads in flight and stop the transfer manager's threads."""
        if self._manager is not None:
            self._manager.shutdown()
            self._manager = None


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


class _Release(BaseSubscriber):
    """Frees a write's upload slot when an upload is done, and flags the write when it failed."""

    def __init__(self, slots: threading.BoundedSemaphore, failed: threading.Event):
        self._slots = slots
        self._failed = failed

    def on_done(self, future: Any, **kwargs: Any) -> None:
        """Flag a failure, free the slot (s3transfer calls this on success, failure and cancel)."""
        try:
            future.result()
        except BaseException:  # noqa: BLE001 - only flagged here; write() raises it
            self._failed.set()
        finally:
            self._slots.release()
