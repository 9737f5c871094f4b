"""S3Source: rows of CSV, JSON Lines, Parquet or Avro objects under a bucket/prefix into a compacted topic.

Position: per object its ETag, how many rows were emitted, and whether it is
done; a crash resumes inside an object by skipping the rows already emitted.

* A **new** object is read from its first row.
* A **changed** object (another ETag) is read again from the first row; then
  reconciliation reads its keys once more and emits tombstones for the keys it
  held before and no longer holds. Which keys an object held is not stored
  anywhere but the state topic: every record carries the header
  ``threes.s3.object`` (the object key), and the live keys of the topic tagged
  with an object are the keys it last gave.
* A **deleted** object yields tombstones for its live keys
  (``tombstones_on_delete``, default on).
* **Half-written objects are never read**: S3 makes an object visible only when
  its upload completes (a multipart upload in progress is not listed), and the
  GET carries ``If-Match: <listed ETag>``, so an object replaced between listing
  and reading is skipped until the next listing (HTTP 412), never read mixed.
  ``min_age_s`` additionally waits for writers that replace an object in steps.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from connectors import clients
from connectors.config.models import S3Connection
from connectors.exceptions import ConfigError, FatalError, RetriableError
from connectors.runtime.avro import (
    CoercionError,
    avro_name,
    infer_record_schema,
    key_schema_from,
    record_coercer,
)
from connectors.runtime.base import SourceBatch, SourceSchemas, SourceTask, TopicState
from connectors.s3.config import S3SourceConfig

log = logging.getLogger(__name__)

OBJECT_HEADER = "threes.s3.object"
_SPOOL_BYTES = 64 * 1024 * 1024  # objects up to this size are buffered in memory, larger ones on disk
_INFER_ROWS = 100


class _ObjectChanged(Exception):
    """The object's ETag is no longer the listed one (HTTP 412 on If-Match)."""


class S3Source(SourceTask):
    """Rows of objects under ``s3://bucket/prefix`` into a compacted topic, keyed by ``key``.

    Delivery guarantee: at least once. An object's row count is stored only
    after the broker acknowledged the rows before it; a crash re-reads the
    object and skips the rows already counted.

    Idempotency key: the ``key`` field(s) of each row, as an Avro record; a
    re-read object produces the same keys and values again.

    Backpressure: rows are read in batches of ``batch_records``; while the
    producer's queue is full the worker stops reading (the GET stream waits).

    Example::

        sources:
          - name: regions
            type: s3_source
            connection: s3
            topic: state.regions
            bucket: reference
            prefix: regions/
            format: csv
            key: [region_id]
            tombstones_on_delete: true
    """

    config: S3SourceConfig
    connection: S3Connection
    source_header = OBJECT_HEADER

    def __init__(self, config: S3SourceConfig, connection: S3Connection, **kwargs: Any):
        super().__init__(config, connection, **kwargs)
        self.client: Any = None
        self.objects: dict[str, dict[str, Any]] = {}

    # -- open -----------------------------------------------------------------------------------------

    def open(self, position: Mapping[str, Any] | None) -> SourceSchemas:
        """Check the bucket, settle the value schema (config or first object), resume from ``position``.

        Raises:
            RetriableError: S3 cannot be reached.
            ConfigError: no such bucket, a key field not in the schema, or no object to infer a schema from.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        cfg = self.config
        self.where = f"s3://{cfg.bucket}/{cfg.prefix}"
        self.client = clients.s3_client(self.connection)
        try:
            self.client.head_bucket(Bucket=cfg.bucket)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchBucket"):
                raise ConfigError(f"source {cfg.name!r}: bucket {cfg.bucket!r} does not exist") from exc
            raise FatalError(f"source {cfg.name!r}: cannot access bucket {cfg.bucket!r}: {code or exc}") from exc
        except BotoCoreError as exc:
            raise RetriableError(f"source {cfg.name!r}: S3 not reachable: {exc}") from exc
        if cfg.value_schema:
            from schemas import load_schema

            schema = load_schema(cfg.value_schema)
        else:
            schema = self._infer_schema()
        self.value_schema = schema
        try:
            self.key_schema = key_schema_from(schema, cfg.key or [], cfg.name)
        except KeyError as exc:
            raise ConfigError(f"source {cfg.name!r}: key field {exc.args[0]!r} is not a field of the value schema "
                              f"(fields: {[f['name'] for f in schema.get('fields', [])]})") from exc
        self.key_fields = [f["name"] for f in self.key_schema["fields"]]
        self.coerce = record_coercer(schema, empty_is_null=cfg.format == "csv")
        self.objects = {k: dict(v) for k, v in ((position or {}).get("objects") or {}).items()}
        return SourceSchemas(key=self.key_schema, value=self.value_schema)

    def _infer_schema(self) -> dict[str, Any]:
        cfg = self.config
        listed = self._list()
        if not listed:
            raise ConfigError(f"source {cfg.name!r}: no object under {self.where} to infer the value schema from; "
                              "set `value_schema`")
        key, etag = listed[0]["Key"], listed[0]["ETag"]
        name = avro_name(cfg.name)
        if cfg.format == "avro":
            import fastavro

            with self._download(key, etag) as f:
                schema = fastavro.reader(f).writer_schema
        elif cfg.format == "parquet":
            import pyarrow.parquet as pq

            with self._download(key, etag) as f:
                schema = _arrow_schema_to_avro(pq.ParquetFile(f).schema_arrow, name)
        else:
            samples = []
            for row in self._rows(key, etag):
                samples.append(row)
                if len(samples) >= _INFER_ROWS:
                    break
            schema = infer_record_schema(name, samples, namespace="threes.s3",
                                         doc=f"rows of {self.where}, schema inferred from {key}")
        log.info("source=%s inferred value schema from s3://%s/%s: %s", cfg.name, cfg.bucket, key, json.dumps(schema))
        return schema

    # -- listing and reading ------------------------------------------------------------------------

    def _list(self) -> list[dict[str, Any]]:
        """Objects under the prefix, key order; folder markers (``.../``) left out."""
        from botocore.exceptions import BotoCoreError, ClientError

        out: list[dict[str, Any]] = []
        try:
            for page in self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.config.bucket, Prefix=self.config.prefix
            ):
                out.extend(o for o in page.get("Contents", []) if not o["Key"].endswith("/"))
        except (BotoCoreError, ClientError) as exc:
            raise RetriableError(f"source {self.name!r}: listing {self.where} failed: {exc}") from exc
        return sorted(out, key=lambda o: o["Key"])

    def _download(self, key: str, etag: str) -> Any:
        """The object's bytes in a seekable spooled file, exactly the listed version (If-Match)."""
        f = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)
        body = self._get(key, etag)
        for chunk in iter(lambda: body.read(1024 * 1024), b""):
            f.write(chunk)
        f.seek(0)
        return f

    def _get(self, key: str, etag: str) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self.client.get_object(Bucket=self.config.bucket, Key=key, IfMatch=etag)["Body"]
        except ClientError as exc:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status in (404, 412):
                raise _ObjectChanged(key) from exc
            raise RetriableError(f"source {self.name!r}: reading s3://{self.config.bucket}/{key} failed: {exc}") \
                from exc
        except BotoCoreError as exc:
            raise RetriableError(f"source {self.name!r}: reading s3://{self.config.bucket}/{key} failed: {exc}") \
                from exc

    def _rows(self, key: str, etag: str) -> Iterator[dict[str, Any]]:
        """Raw rows of one object, in file order."""
        fmt = self.config.format
        if fmt == "csv":
            text = io.TextIOWrapper(self._get(key, etag), encoding="utf-8-sig", newline="")
            yield from csv.DictReader(text, delimiter=self.config.csv_delimiter)
        elif fmt == "jsonl":
            text = io.TextIOWrapper(self._get(key, etag), encoding="utf-8")
            for n, line in enumerate(text, start=1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise FatalError(f"source {self.name!r}: s3://{self.config.bucket}/{key} line {n} is not "
                                         f"JSON: {exc.msg}") from exc
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            with self._download(key, etag) as f:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=self.config.batch_records):
                    yield from batch.to_pylist()
        else:
            import fastavro

            with self._download(key, etag) as f:
                yield from fastavro.reader(f)

    # -- poll -------------------------------------------------------------------------------------------

    def _position(self) -> dict[str, Any]:
        return {"objects": {k: dict(v) for k, v in self.objects.items()}}

    def poll(self) -> Iterator[SourceBatch]:
        """Read new and changed objects (resuming a half-read one); note deleted ones for reconciliation.

        Raises:
            RetriableError: S3 failed.
            FatalError: a row does not fit the value schema or lacks a key field (names object and row).
        """
        import time

        cfg = self.config
        listed = self._list()
        now = time.time()
        present = set()
        for obj in listed:
            key, etag = obj["Key"], obj["ETag"]
            present.add(key)
            if cfg.min_age_s and now - obj["LastModified"].timestamp() < cfg.min_age_s:
                continue
            prev = self.objects.get(key)
            if prev is not None and prev.get("etag") == etag:
                if prev.get("done"):
                    continue
                skip = int(prev.get("rows", 0))
                changed = bool(prev.get("changed"))
            else:
                skip = 0
                changed = prev is not None
            try:
                yield from self._read_object(key, etag, skip, changed)
            except _ObjectChanged:
                log.info("source=%s s3://%s/%s changed while being read; next cycle", self.name, cfg.bucket, key)
        for key, entry in self.objects.items():
            if key not in present and not entry.get("deleted"):
                entry["deleted"] = True
                entry["done"] = False
                yield SourceBatch([], self._position())

    def _read_object(self, key: str, etag: str, skip: int, changed: bool) -> Iterator[SourceBatch]:
        cfg = self.config
        headers = [(OBJECT_HEADER, key.encode())]
        entry = {"etag": etag, "rows": skip, "done": False, "changed": changed}
        self.objects[key] = entry
        records: list[Any] = []
        n = 0
        for n, row in enumerate(self._rows(key, etag), start=1):
            if n <= skip:
                continue
            records.append(self._record(row, key, n))
            if len(records) >= cfg.batch_records:
                entry["rows"] = n
                yield SourceBatch(records, self._position(), headers)
                records = []
        entry["rows"] = max(n, skip)
        # a changed object is done once reconciliation removed the keys it no longer holds
        entry["done"] = not changed
        yield SourceBatch(records, self._position(), headers)
        log.info("source=%s read s3://%s/%s rows=%d etag=%s%s", self.name, cfg.bucket, key, entry["rows"], etag,
                 " (changed)" if changed else "")

    def _record(self, row: Mapping[str, Any], key: str, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
        try:
            value = self.coerce(row)
        except CoercionError as exc:
            raise FatalError(f"source {self.name!r}: s3://{self.config.bucket}/{key} row {n}: {exc}") from exc
        k = {f: value[f] for f in self.key_fields}
        if any(v is None for v in k.values()):
            raise FatalError(f"source {self.name!r}: s3://{self.config.bucket}/{key} row {n}: key {k} has a null "
                             "field")
        return k, value

    # -- reconcile --------------------------------------------------------------------------------------

    def wants_reconcile(self) -> bool:
        """When an object changed or was deleted."""
        return any(e.get("changed") and e.get("done") is False or e.get("deleted") for e in self.objects.values())

    def reconcile(self, state: TopicState) -> Iterator[SourceBatch]:
        """Tombstones for keys a changed object no longer holds, and for every key of a deleted object.

        Raises:
            RetriableError: S3 failed.
        """
        by_object: dict[str, list[bytes]] = {}
        for kb, obj in state.live.items():
            if obj is not None:
                by_object.setdefault(obj, []).append(kb)
        for key in sorted(self.objects):
            entry = self.objects[key]
            if entry.get("deleted"):
                gone = by_object.get(key, []) if self.config.tombstones_on_delete else []
                del self.objects[key]
                yield SourceBatch([(kb, None) for kb in gone], self._position())
                log.info("source=%s object s3://%s/%s deleted: %d tombstones", self.name, self.config.bucket, key,
                         len(gone))
            elif entry.get("changed") and entry.get("done") is False:
                try:
                    current = {state.encode_key(k) for k, _v in
                               (self._record(row, key, n) for n, row in enumerate(self._rows(key, entry["etag"]), 1))}
                except _ObjectChanged:
                    continue  # changed again: the next cycle re-reads it and comes back here
                gone = [kb for kb in by_object.get(key, []) if kb not in current]
                entry["changed"] = False
                entry["done"] = True
                yield SourceBatch([(kb, None) for kb in gone], self._position())
                log.info("source=%s object s3://%s/%s changed: %d keys gone", self.name, self.config.bucket, key,
                         len(gone))

    def describe_key(self, key: Any) -> str:
        """E.g. ``s3://reference/regions/ key {'region_id': 'EU'}``."""
        return f"{self.where} key {dict(key) if isinstance(key, Mapping) else key!r}"


def _arrow_schema_to_avro(schema: Any, name: str) -> dict[str, Any]:
    """An Avro record schema from a Parquet file's Arrow schema (nullable fields as unions with null)."""
    import pyarrow as pa

    def avro_type(t: Any) -> Any:
        if pa.types.is_boolean(t):
            return "boolean"
        if pa.types.is_integer(t):
            return "int" if t.bit_width <= 32 and pa.types.is_signed_integer(t) else "long"
        if pa.types.is_floating(t):
            return "float" if t.bit_width == 32 else "double"
        if pa.types.is_decimal(t):
            return {"type": "bytes", "logicalType": "decimal", "precision": t.precision, "scale": t.scale}
        if pa.types.is_timestamp(t):
            return {"type": "long", "logicalType": "timestamp-micros" if t.tz else "local-timestamp-micros"}
        if pa.types.is_date(t):
            return {"type": "int", "logicalType": "date"}
        if pa.types.is_binary(t) or pa.types.is_large_binary(t):
            return "bytes"
        return "string"

    fields = []
    for f in schema:
        t = avro_type(f.type)
        field: dict[str, Any] = {"name": avro_name(f.name), "type": ["null", t] if f.nullable else t}
        if f.nullable:
            field["default"] = None
        if field["name"] != f.name:
            field["source.field"] = f.name
        fields.append(field)
    return {"type": "record", "name": name, "namespace": "threes.s3", "fields": fields}
