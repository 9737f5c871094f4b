"""Reading the objects of an S3 source: listing, exactly the listed version (``If-Match``), rows by format.

Also the value schema inferred from the first object when the config names none (Avro's writer schema,
Parquet's Arrow schema, or the first rows of a CSV or JSON Lines object).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import tempfile
from collections.abc import Iterator
from typing import Any

from connectors.runtime.avro import avro_name, infer_record_schema
from connectors.s3.config import S3SourceConfig
from kernel.exceptions import ConfigError, FatalError, RetriableError

# the source's log lines keep the logger name they always had
log = logging.getLogger("connectors.s3.source")

_SPOOL_BYTES = 64 * 1024 * 1024  # objects up to this size are buffered in memory, larger ones on disk
_INFER_ROWS = 100


class ObjectChanged(Exception):
    """The object's ETag is no longer the listed one (HTTP 412 on If-Match)."""




class ObjectReads:
    """Listing, downloads and rows of the source's objects (a mixin of ``S3Source``)."""

    config: S3SourceConfig
    name: str  # the connector's
    client: Any  # a boto3 S3 client
    where: str  # ``s3://bucket/prefix``, for messages

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
                writer_schema = fastavro.reader(f).writer_schema
            if not isinstance(writer_schema, dict) or writer_schema.get("type") != "record":
                raise ConfigError(f"source {cfg.name!r}: s3://{cfg.bucket}/{key} holds {writer_schema!r} values, "
                                  "not records")
            schema = writer_schema
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
                raise ObjectChanged(key) from exc
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
                for record in fastavro.reader(f):
                    if not isinstance(record, dict):  # a file of primitive values: nothing to key a row by
                        raise FatalError(f"source {self.name!r}: s3://{self.config.bucket}/{key} holds "
                                         f"{type(record).__name__} values, not records")
                    yield record


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
