"""Config models of the S3 connectors."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kernel.config.models import SinkConnectorConfig, SourceConnectorConfig


class S3SourceConfig(SourceConnectorConfig):
    """``s3_source``: rows of objects under a bucket/prefix into a compacted topic.

    ``key`` (the row field(s) that identify an entity) is required. Without
    ``value_schema`` the schema comes from the data: a CSV header (every field a
    nullable string), a JSON Lines object's value types, a Parquet file's Arrow
    schema, an Avro file's writer schema - of the first object in key order,
    logged at start.

    Example::

        - name: airlines
          type: s3_source
          connection: s3
          topic: state.airlines
          bucket: reference
          prefix: airlines/
          format: csv
          key: [carrier]
    """

    implementation = "connectors.s3.source:S3Source"
    connection_type = "s3"

    type: Literal["s3_source"]
    bucket: str
    prefix: str = ""
    format: Literal["csv", "jsonl", "parquet", "avro"]
    csv_delimiter: str = Field(",", min_length=1, max_length=1)
    tombstones_on_delete: bool = Field(True, description="a deleted object yields tombstones for its keys")
    min_age_s: float = Field(
        0.0, ge=0, description="read an object only once its last change is this old (writers that rewrite in steps)"
    )

    @model_validator(mode="after")
    def _needs_key(self) -> S3SourceConfig:
        if not self.key:
            raise ValueError("s3_source needs `key`: the row field(s) identifying an entity")
        return self


class S3SinkConfig(SinkConnectorConfig):
    """``s3_sink``: update topics into objects named by topic, partition and first offset.

    Example::

        - name: flights-archive
          type: s3_sink
          connection: s3
          topics: [updates.flights]
          bucket: lake
          prefix: flights/
          format: parquet
          rotate_records: 100000
    """

    implementation = "connectors.s3.sink:S3Sink"
    connection_type = "s3"

    type: Literal["s3_sink"]
    bucket: str
    prefix: str = ""
    format: Literal["jsonl", "parquet", "avro"] = "parquet"
    parquet_compression: Literal["snappy", "zstd", "gzip", "lz4", "none"] = Field(
        "snappy",
        description="codec of Parquet column chunks; snappy (Spark's and pyarrow's default) costs about half "
        "of zstd per small object, zstd writes ~10-20 % smaller files",
    )
    partition_by: str | None = Field(None, description="date field for dt=YYYY-MM-DD/ prefixes")
    rotate_records: int = Field(100_000, ge=1)
    rotate_bytes: int = Field(64 * 1024 * 1024, ge=1)
    rotate_interval_s: float = Field(
        60.0,
        gt=0,
        description="an object is cut after this age, or at rotate_records / rotate_bytes; never because the "
        "input paused (batch.flush_when_idle does not apply to this sink)",
    )
    max_concurrency: int = Field(4, ge=1, le=64, description="upper bound of concurrent uploads")
    multipart_threshold_bytes: int = Field(
        8 * 1024 * 1024, ge=5 * 1024 * 1024, description="objects at least this big use a multipart upload"
    )
    create_bucket: bool = Field(False, description="create the bucket if it is missing")
    stale_upload_s: float = Field(
        900.0, gt=0, description="at start, abort this sink's multipart uploads begun longer ago than this"
    )
