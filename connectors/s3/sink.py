"""``S3Sink``: update topics into JSON Lines, Parquet or Avro objects with deterministic names."""

from __future__ import annotations

import base64
import io
import logging
import uuid
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from connectors import clients
from connectors.config.models import BatchPolicy
from connectors.exceptions import FatalError, RetriableError, SetupError, SinkBackpressureError
from connectors.runtime.sink import RecordFailure, Sink, SinkBatch, SinkRecord

log = logging.getLogger(__name__)

EXTENSIONS = {"jsonl": "jsonl", "parquet": "parquet", "avro": "avro"}
_BUSY_CODES = {"SlowDown", "503", "RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequests"}
_FATAL_CODES = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"}


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
        "deleted": record.value is None,
        "value": record.value,
    }


def encode_jsonl(records: Iterable[SinkRecord]) -> bytes:
    """JSON Lines, one envelope per line (dates RFC 3339, decimals as text, bytes base64), with orjson.

    Raises:
        TypeError: a value JSON cannot represent (orjson's ``JSONEncodeError`` is a ``TypeError``).
    """
    import orjson

    dumps, option = orjson.dumps, orjson.OPT_APPEND_NEWLINE | orjson.OPT_NON_STR_KEYS
    return b"".join(dumps(envelope(r), default=_json_default, option=option) for r in records)


def encode_parquet(records: list[SinkRecord]) -> bytes:
    """Parquet (pyarrow, zstd), one row per envelope; ``value`` is a struct column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [envelope(r) for r in records]
    for row in rows:
        if row["value"] is not None:
            row["value"] = _arrow_safe(row["value"])
    table = pa.Table.from_pylist(rows)
    out = io.BytesIO()
    pq.write_table(table, out, compression="zstd")
    return out.getvalue()


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

    Atomicity: objects of at least ``multipart_threshold_bytes`` use boto3's
    transfer manager (multipart, parallel parts), which aborts the upload on
    failure; S3 shows an object only once complete. At start, this sink's
    multipart uploads older than ``stale_upload_s`` (left by a killed process)
    are aborted.

    Backpressure: ``SlowDown``/503 answers (after boto3's own adaptive retries).

    Formats: JSON Lines, Parquet (pyarrow) or Avro container files (fastavro),
    rows ``{topic, partition, offset, timestamp_ms, key, version, deleted, value}``.

    Example::

        - name: flights-archive
          type: s3_sink
          connection: s3
          topics: [updates.flights]
          bucket: lake
          prefix: flights/
          format: parquet
          rotate_records: 100000
          rotate_interval_s: 60
    """

    def __init__(self, config: Any, connection: Any, **kwargs: Any):
        super().__init__(config, connection, **kwargs)
        self.client: Any = None
        self._transfer: Any = None

    def batch_policy(self, default: BatchPolicy) -> BatchPolicy:
        """One batch is one object: rotation by records, bytes and age."""
        return BatchPolicy(
            max_records=self.config.rotate_records,
            max_bytes=self.config.rotate_bytes,
            max_age_ms=int(self.config.rotate_interval_s * 1000),
        )

    def open(self) -> None:
        """Create the client, check (or create) the bucket, abort stale multipart uploads of this sink.

        Raises:
            SetupError: S3 cannot be reached.
            FatalError: the bucket is missing and ``create_bucket`` is off, or access is denied.
        """
        from boto3.s3.transfer import TransferConfig
        from botocore.exceptions import ClientError

        self.client = clients.s3_client(self.connection)
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

    def check(self) -> None:
        """``HeadBucket``.

        Raises:
            SetupError: S3 does not answer or refuses our credentials.
            FatalError: the bucket does not exist.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        client = self.client or clients.s3_client(self.connection)
        try:
            client.head_bucket(Bucket=self.config.bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("403", *_FATAL_CODES - {"NoSuchBucket"}):
                raise SetupError(f"sink {self.name!r}: S3 refused our credentials for bucket "
                                 f"{self.config.bucket!r} ({code})", "check the connection's keys") from exc
            raise FatalError(f"sink {self.name!r}: bucket {self.config.bucket!r} not usable ({code})") from exc
        except BotoCoreError as exc:
            raise SetupError(f"sink {self.name!r}: S3 {self.connection.endpoint_url or 'AWS'} did not answer: "
                             f"{exc}") from exc

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

    def _dt(self, record: SinkRecord) -> str | None:
        field = self.config.partition_by
        if field is None:
            return None
        value = record.value.get(field) if record.value else None
        if isinstance(value, datetime):
            return value.astimezone(UTC).date().isoformat() if value.tzinfo else value.date().isoformat()
        if isinstance(value, date):
            return value.isoformat()
        if isinstance(value, str) and len(value) >= 10:
            return value[:10]
        return datetime.fromtimestamp(record.timestamp_ms / 1000.0, UTC).date().isoformat()

    def objects(self, batch: SinkBatch) -> list[tuple[str, list[SinkRecord], Any]]:
        """Split a batch into objects: by ``dt`` folder and, for Avro, by writer schema.

        Returns:
            ``(object key, records, value writer schema)`` per object, named by its first offset.
        """
        groups: dict[tuple[str | None, bytes | None], list[SinkRecord]] = {}
        schemas: dict[bytes | None, Any] = {None: None}
        current: bytes | None = next((r.value_fingerprint for r in batch.records if r.value_fingerprint), None)
        for record in batch.records:
            fp = None
            if self.config.format == "avro":
                if record.value_fingerprint is not None:
                    current = record.value_fingerprint
                    schemas[current] = record.value_schema
                fp = current  # a tombstone joins the schema group around it
            groups.setdefault((self._dt(record), fp), []).append(record)
        out = []
        for (dt, fp), records in groups.items():
            key = object_key(self.config.prefix, batch.topic, batch.partition, records[0].offset,
                             self.config.format, dt)
            out.append((key, records, schemas.get(fp)))
        return out

    def encode(self, records: list[SinkRecord], value_schema: Any) -> bytes:
        """Encode records in the configured format."""
        if self.config.format == "jsonl":
            return encode_jsonl(records)
        if self.config.format == "parquet":
            return encode_parquet(records)
        return encode_avro(records, value_schema)

    def write(self, batch: SinkBatch) -> list[RecordFailure]:
        """Encode and upload the batch's objects (overwriting same-named ones from a replay).

        Raises:
            SinkBackpressureError: S3 answered ``SlowDown``/503.
            RetriableError: S3 unreachable or another transient error.
            FatalError: the bucket is gone or access is denied.
        """
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        failures: list[RecordFailure] = []
        for key, records, schema in self.objects(batch):
            try:
                body = self.encode(records, schema)
            except (ValueError, TypeError, OverflowError) as exc:
                # one bad record spoils the object: find it by encoding each alone
                good = []
                for record in records:
                    try:
                        self.encode([record], schema)
                        good.append(record)
                    except (ValueError, TypeError, OverflowError) as one:
                        failures.append(RecordFailure(record, type(one)(f"{record.where()}: {one}")))
                if not good:
                    continue
                records, body = good, self.encode(good, schema)
                log.warning("sink=%s object=%s: %d record(s) not encodable: %s", self.name, key,
                            len(failures), exc)
            try:
                self.client.upload_fileobj(io.BytesIO(body), self.config.bucket, key, Config=self._transfer)
            except (ClientError, S3UploadFailedError) as exc:
                code = exc.response.get("Error", {}).get("Code", "") if isinstance(exc, ClientError) else ""
                text = str(exc)
                if code in _BUSY_CODES or "SlowDown" in text or "503" in text:
                    raise SinkBackpressureError(2.0, f"sink {self.name!r}: S3 slow down on {key}") from exc
                if code in _FATAL_CODES or any(c in text for c in _FATAL_CODES):
                    raise FatalError(f"sink {self.name!r}: cannot write s3://{self.config.bucket}/{key}: "
                                     f"{text}") from exc
                raise RetriableError(f"sink {self.name!r}: upload of {key} failed: {text}") from exc
            except BotoCoreError as exc:
                raise RetriableError(f"sink {self.name!r}: S3 unreachable uploading {key}: {exc}") from exc
            log.debug("sink=%s object=s3://%s/%s records=%d bytes=%d", self.name, self.config.bucket, key,
                      len(records), len(body))
        return failures
