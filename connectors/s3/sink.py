"""``S3Sink``: update topics into JSON Lines, Parquet or Avro objects with deterministic names."""

from __future__ import annotations

import io
import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from s3transfer.subscribers import BaseSubscriber

from connectors.api.sink import Sink
from connectors.api.sink_records import RecordFailure, SinkBatch, SinkRecord
from connectors.s3.config import S3SinkConfig
from connectors.s3.connection import S3Connection, s3_client
from connectors.s3.formats import ParquetSchemas, encode_avro, encode_jsonl, encode_parquet
from connectors.s3.sink_objects import BatchObjects, S3Object
from kernel.config.policies import BatchPolicy
from kernel.exceptions import FatalError, RetriableError, SetupError, SinkBackpressureError, SinkBlockedError

__all__ = ["S3Sink", "encode_avro", "encode_jsonl", "encode_parquet"]

log = logging.getLogger(__name__)

_BUSY_CODES = {"SlowDown", "503", "RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequests"}
_FATAL_CODES = {"NoSuchBucket", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"}


class S3Sink(BatchObjects, Sink):
    """Write update topics to S3 objects: one object per batch (and date/schema group), named by first offset.

    Delivery guarantee: at least once, effectively once per object: an object's
    name is ``topic+partition+first_offset`` (:func:`~connectors.s3.sink_objects.object_key`), so writing a
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
                except Exception as exc:  # mapped below, first by severity
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


class _Release(BaseSubscriber):
    """Frees a write's upload slot when an upload is done, and flags the write when it failed."""

    def __init__(self, slots: threading.BoundedSemaphore, failed: threading.Event):
        self._slots = slots
        self._failed = failed

    def on_done(self, future: Any, **kwargs: Any) -> None:
        """Flag a failure, free the slot (s3transfer calls this on success, failure and cancel)."""
        try:
            future.result()
        except BaseException:  # only flagged here; write() raises it
            self._failed.set()
        finally:
            self._slots.release()
