"""S3Sink against the real S3 server (s3proxy), in its three formats."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import fastavro
import pyarrow.parquet as pq
import pytest

from connectors.s3.config import S3SinkConfig
from connectors.s3.connection import S3Connection
from connectors.s3.sink import S3Sink
from connectors.s3.sink_objects import object_key
from kernel.exceptions import FatalError, SinkBlockedError
from threes.testing.sink import SinkContract, batch, record


def make_config(bucket: str, fmt: str, **extra: Any) -> S3SinkConfig:
    return S3SinkConfig(
        name=f"s3-{bucket}",
        type="s3_sink",
        connection="s3",
        topics=["updates.items"],
        bucket=bucket,
        prefix="lake/",
        format=fmt,
        create_bucket=True,
        **extra,
    )


def read_rows(s3: Any, bucket: str, key: str) -> list[dict[str, Any]]:
    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    if key.endswith(".jsonl"):
        return [json.loads(line) for line in body.splitlines()]
    if key.endswith(".parquet"):
        return pq.read_table(io.BytesIO(body)).to_pylist()
    return list(fastavro.reader(io.BytesIO(body)))


def list_keys(s3: Any, bucket: str, prefix: str = "") -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


def s3_state(s3: Any, bucket: str, prefix: str = "") -> dict[str, tuple[int, dict[str, Any]]]:
    """The state a reader derives: per key, the row of highest version; deleted keys dropped."""
    best: dict[str, dict[str, Any]] = {}
    for key in list_keys(s3, bucket, prefix):
        for row in read_rows(s3, bucket, key):
            seen = best.get(row["key"])
            if seen is None or (row["version"], row["offset"]) > (seen["version"], seen["offset"]):
                best[row["key"]] = row
    return {k: (r["version"], r["value"]) for k, r in best.items() if not r["deleted"]}


@pytest.fixture
def bucket(s3: Any, unique: str) -> Iterator[str]:
    name = f"sink-{unique}"
    yield name
    for key in list_keys(s3, name) if name in [b["Name"] for b in s3.list_buckets()["Buckets"]] else []:
        s3.delete_object(Bucket=name, Key=key)


class S3Contract(SinkContract):
    fmt = "jsonl"

    @pytest.fixture
    def sink(self, s3_conn: S3Connection, bucket: str) -> Iterator[S3Sink]:
        s = S3Sink(make_config(bucket, self.fmt), s3_conn)
        s.open()
        yield s
        s.close()

    @pytest.fixture
    def bad_sink(self, s3_conn: S3Connection, bucket: str) -> S3Sink:
        from pydantic import SecretStr

        bad = s3_conn.model_copy(update={"secret_access_key": SecretStr("wrong")})
        return S3Sink(make_config(bucket, self.fmt), bad)

    def state(self, sink: S3Sink) -> dict[str, tuple[int, dict[str, Any]]]:
        return s3_state(sink.client, sink.config.bucket)

    def artifacts(self, sink: S3Sink) -> Any:
        return list_keys(sink.client, sink.config.bucket)

    def test_object_names_follow_topic_partition_first_offset(self, sink: S3Sink) -> None:
        sink.write(batch([record(k, 1, 100 + k, partition=3) for k in range(5)]))
        assert self.artifacts(sink) == [f"lake/updates.items/partition=3/updates.items+3+{100:020d}.{self.fmt}"]


class TestS3SinkJsonl(S3Contract):
    fmt = "jsonl"


class TestS3SinkParquet(S3Contract):
    fmt = "parquet"


class TestS3SinkAvro(S3Contract):
    fmt = "avro"

    def test_avro_value_keeps_the_writer_schema(self, sink: S3Sink) -> None:
        sink.write(batch([record(1, 1, 0), record(2, 1, 1, delete=True)]))
        key = self.artifacts(sink)[0]
        body = sink.client.get_object(Bucket=sink.config.bucket, Key=key)["Body"].read()
        reader = fastavro.reader(io.BytesIO(body))
        value_type = next(f for f in reader.writer_schema["fields"] if f["name"] == "value")["type"]
        assert value_type[0] == "null" and value_type[1]["name"] == "threes.test.Item"
        rows = list(reader)
        assert rows[0]["value"]["updated_at"].year == 2024 and rows[1]["value"] is None and rows[1]["deleted"]


def test_partition_by_date_and_multipart_upload(s3_conn: S3Connection, bucket: str, s3: Any) -> None:
    # 5 MiB threshold (the S3 minimum part size): this object goes up as a multipart upload
    sink = S3Sink(
        make_config(bucket, "jsonl", partition_by="updated_at", multipart_threshold_bytes=5 * 1024 * 1024), s3_conn
    )
    sink.open()
    recs = [record(k, 1 + k % 2, k) for k in range(4)]
    big = "x" * (6 * 1024 * 1024)
    recs[0].value["name"] = big
    recs[3].value["updated_at"] = recs[3].value["updated_at"].replace(day=2)
    sink.write(batch(recs))
    keys = list_keys(s3, bucket)
    assert keys == [
        object_key("lake/", "updates.items", 0, 0, "jsonl", "2024-05-01"),
        object_key("lake/", "updates.items", 0, 3, "jsonl", "2024-05-02"),
    ]
    assert "-" in s3.head_object(Bucket=bucket, Key=keys[0])["ETag"]  # a multipart ETag: <md5>-<parts>
    rows = read_rows(s3, bucket, keys[0])
    assert [r["offset"] for r in rows] == [0, 1, 2] and rows[0]["value"]["name"] == big
    assert [r["offset"] for r in read_rows(s3, bucket, keys[1])] == [3]
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    sink.close()


def test_stale_multipart_upload_is_aborted_at_open(s3_conn: S3Connection, bucket: str, s3: Any) -> None:
    s3.create_bucket(Bucket=bucket)
    ours = "lake/updates.items/partition=0/updates.items+0+00000000000000000000.jsonl"
    theirs = "elsewhere/file.bin"
    s3.create_multipart_upload(Bucket=bucket, Key=ours)
    s3.create_multipart_upload(Bucket=bucket, Key=theirs)
    sink = S3Sink(make_config(bucket, "jsonl", stale_upload_s=0.001), s3_conn)
    sink.open()
    left = [u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])]
    assert left == [theirs]
    s3.abort_multipart_upload(
        Bucket=bucket, Key=theirs, UploadId=s3.list_multipart_uploads(Bucket=bucket)["Uploads"][0]["UploadId"]
    )
    sink.close()


def test_missing_bucket_is_fatal_without_create_bucket(s3_conn: S3Connection, unique: str) -> None:
    sink = S3Sink(make_config(f"absent-{unique}", "jsonl").model_copy(update={"create_bucket": False}), s3_conn)
    with pytest.raises(FatalError, match="not usable"):
        sink.open()


def test_parquet_objects_of_a_batch_all_uploaded_with_one_schema(s3_conn: S3Connection, bucket: str, s3: Any) -> None:
    # 12 dt folders: 12 objects uploaded concurrently (max_concurrency 3); `note` all null in the odd days' objects
    sink = S3Sink(make_config(bucket, "parquet", partition_by="updated_at", max_concurrency=3), s3_conn)
    sink.open()
    recs = []
    for day in range(1, 13):
        for k in range(3):
            r = record(day * 10 + k, 1, len(recs))
            r.value["updated_at"] = r.value["updated_at"].replace(day=day)
            r.value["note"] = None if day % 2 else f"d{day}"
            recs.append(r)
    recs.append(record(999, 2, len(recs), delete=True))  # no date field: its Kafka date, day 1
    assert sink.write(batch(recs)) == []
    keys = list_keys(s3, bucket)
    assert len(keys) == 12
    tables = [pq.read_table(io.BytesIO(s3.get_object(Bucket=bucket, Key=k)["Body"].read())) for k in keys]
    assert all(t.schema == tables[0].schema for t in tables)
    rows = [row for t in tables for row in t.to_pylist()]
    assert sorted(r["offset"] for r in rows) == list(range(len(recs)))
    assert {r["key"]: r["value"] for r in rows if not r["deleted"]} == {str(r.key): r.value for r in recs[:-1]}
    sink.close()
    sink.close()  # closing twice is harmless


def test_a_failed_upload_fails_the_whole_batch(s3_conn: S3Connection, bucket: str, s3: Any) -> None:
    sink = S3Sink(make_config(bucket, "parquet", partition_by="updated_at"), s3_conn)
    sink.open()
    s3.delete_bucket(Bucket=bucket)  # every upload now fails with NoSuchBucket
    recs = [record(k, 1, k) for k in range(6)]
    for r in recs:
        r.value["updated_at"] = r.value["updated_at"].replace(day=1 + r.offset)
    with pytest.raises(SinkBlockedError, match="NoSuchBucket"):  # any object would fail: blocked, no dead letter
        sink.write(batch(recs))
    s3.create_bucket(Bucket=bucket)  # the retry of the same batch writes every object
    assert sink.write(batch(recs)) == [] and len(list_keys(s3, bucket)) == 6
    sink.close()
