"""S3Source against the real S3 server (s3proxy) and Kafka."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import threading
from typing import Any

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq

from connectors.runtime.standalone import SourceWorker, task_specs
from threes.config import pipeline_from_dict
from threes.testing.source import SourceContract, run_once, topic_state

SCHEMA = {
    "type": "record", "name": "item", "fields": [
        {"name": "id", "type": "long"},
        {"name": "name", "type": "string"},
        {"name": "amount", "type": ["null", "double"], "default": None},
        {"name": "day", "type": ["null", {"type": "int", "logicalType": "date"}], "default": None},
    ],
}
PARTS = 3


def _s3_connections(s3_conn: Any, secret: str | None = None) -> dict[str, Any]:
    return {"s3": {"type": "s3", "endpoint_url": s3_conn.endpoint_url, "region": s3_conn.region,
                   "access_key_id": s3_conn.access_key_id,
                   "secret_access_key": secret or s3_conn.secret_access_key.get_secret_value(), "path_style": True}}


def _csv(rows: list[dict[str, Any]]) -> bytes:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["id", "name", "amount", "day"])
    w.writeheader()
    for r in rows:
        w.writerow({**r, "day": r["day"].isoformat() if r["day"] else ""})
    return buf.getvalue().encode()


class TestS3SourceContract(SourceContract):
    """The source contract on CSV objects: entity i lives in ``part-{i % 3}.csv``; an emptied part is deleted."""

    def setup_system(self, ctx: dict[str, Any]) -> None:
        ctx["s3"] = ctx["request"].getfixturevalue("s3")
        ctx["s3_conn"] = ctx["request"].getfixturevalue("s3_conn")
        ctx["bucket"] = f"src-{ctx['unique']}"
        ctx["s3"].create_bucket(Bucket=ctx["bucket"])
        ctx["rows"] = {}
        tmp = ctx["request"].getfixturevalue("tmp_path")
        (tmp / "item.avsc").write_text(json.dumps(SCHEMA))
        ctx["schema_path"] = str(tmp / "item.avsc")

    def connections(self, ctx: dict[str, Any]) -> dict[str, Any]:
        return _s3_connections(ctx["s3_conn"])

    def bad_connections(self, ctx: dict[str, Any]) -> tuple[dict[str, Any], str]:
        secret = "wrong-secret-4711"
        return _s3_connections(ctx["s3_conn"], secret), secret

    def source_config(self, ctx: dict[str, Any]) -> dict[str, Any]:
        return {"name": ctx["name"], "type": "s3_source", "connection": "s3", "topic": ctx["topic"],
                "bucket": ctx["bucket"], "prefix": "items/", "format": "csv", "key": ["id"],
                "value_schema": ctx["schema_path"], "batch_records": 4}

    def make_row(self, i: int, version: int = 0) -> dict[str, Any]:
        return {"id": i, "name": f"n{i}v{version}", "amount": i * 1.5 + version if i % 5 else None,
                "day": dt.date(2020, 1, 1) + dt.timedelta(days=i)}

    def _write_parts(self, ctx: dict[str, Any], parts: set[int]) -> None:
        for p in parts:
            rows = [r for i, r in sorted(ctx["rows"].items()) if i % PARTS == p]
            key = f"items/part-{p}.csv"
            if rows:
                ctx["s3"].put_object(Bucket=ctx["bucket"], Key=key, Body=_csv(rows))
            else:
                ctx["s3"].delete_object(Bucket=ctx["bucket"], Key=key)

    def upsert(self, ctx: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        for r in rows:
            ctx["rows"][r["id"]] = r
        self._write_parts(ctx, {r["id"] % PARTS for r in rows})

    def delete(self, ctx: dict[str, Any], keys: list[tuple]) -> None:
        for (i,) in keys:
            ctx["rows"].pop(i, None)
        self._write_parts(ctx, {k[0] % PARTS for k in keys})

    def system_state(self, ctx: dict[str, Any]) -> dict[tuple, dict[str, Any]]:
        return {(i,): dict(r) for i, r in ctx["rows"].items()}


def test_deleted_object_yields_tombstones(s3: Any, s3_conn: Any, kafka: Any, kafka_conf: Any, unique: str,
                                          tmp_path: Any) -> None:
    bucket = f"del-{unique}"
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="x/a.jsonl", Body=b'{"code": "A1", "n": 1}\n{"code": "A2", "n": 2}\n')
    s3.put_object(Bucket=bucket, Key="x/b.jsonl", Body=b'{"code": "B1", "n": 3}\n')
    pipeline = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers}, "connections": _s3_connections(s3_conn),
        "sources": [{"name": f"del-{unique}", "type": "s3_source", "connection": "s3", "topic": f"state.{unique}",
                     "bucket": bucket, "prefix": "x/", "format": "jsonl", "key": ["code"]}],
    })
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    # the schema was inferred from the first object: n is a long
    assert topic_state(kafka_conf, f"state.{unique}") == {
        ("A1",): {"code": "A1", "n": 1}, ("A2",): {"code": "A2", "n": 2}, ("B1",): {"code": "B1", "n": 3}}
    s3.delete_object(Bucket=bucket, Key="x/a.jsonl")
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert s.tombstones == 2
    assert topic_state(kafka_conf, f"state.{unique}") == {("B1",): {"code": "B1", "n": 3}}


def test_upload_in_progress_is_not_read(s3: Any, s3_conn: Any, kafka: Any, kafka_conf: Any, unique: str,
                                        tmp_path: Any) -> None:
    bucket = f"mp-{unique}"
    s3.create_bucket(Bucket=bucket)
    (tmp_path / "s.avsc").write_text(json.dumps(SCHEMA))
    s3.put_object(Bucket=bucket, Key="in/0.csv", Body=_csv([{"id": 1, "name": "a", "amount": 1.0, "day": None}]))
    mp = s3.create_multipart_upload(Bucket=bucket, Key="in/1.csv")
    part = s3.upload_part(Bucket=bucket, Key="in/1.csv", UploadId=mp["UploadId"], PartNumber=1,
                          Body=_csv([{"id": 2, "name": "b", "amount": 2.0, "day": None}]))
    pipeline = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers}, "connections": _s3_connections(s3_conn),
        "sources": [{"name": f"mp-{unique}", "type": "s3_source", "connection": "s3", "topic": f"state.{unique}",
                     "bucket": bucket, "prefix": "in/", "format": "csv", "key": ["id"],
                     "value_schema": str(tmp_path / "s.avsc")}],
    })
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert sorted(topic_state(kafka_conf, f"state.{unique}")) == [(1,)]
    s3.complete_multipart_upload(Bucket=bucket, Key="in/1.csv", UploadId=mp["UploadId"],
                                 MultipartUpload={"Parts": [{"ETag": part["ETag"], "PartNumber": 1}]})
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert sorted(topic_state(kafka_conf, f"state.{unique}")) == [(1,), (2,)]


def test_parquet_and_avro_objects(s3: Any, s3_conn: Any, kafka: Any, kafka_conf: Any, unique: str) -> None:
    bucket = f"fmt-{unique}"
    s3.create_bucket(Bucket=bucket)
    when = dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC)
    table = pa.table({"tailnum": ["N1", "N2"], "seats": pa.array([100, None], pa.int32()),
                      "seen": pa.array([when, when], pa.timestamp("us", tz="UTC"))})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    s3.put_object(Bucket=bucket, Key="pq/planes.parquet", Body=buf.getvalue())
    avro_schema = {"type": "record", "name": "airline", "fields": [{"name": "carrier", "type": "string"},
                                                                   {"name": "name", "type": "string"}]}
    abuf = io.BytesIO()
    fastavro.writer(abuf, avro_schema, [{"carrier": "AA", "name": "American"}, {"carrier": "UA", "name": "United"}])
    s3.put_object(Bucket=bucket, Key="av/airlines.avro", Body=abuf.getvalue())
    pipeline = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers}, "connections": _s3_connections(s3_conn),
        "sources": [
            {"name": f"pq-{unique}", "type": "s3_source", "connection": "s3", "topic": f"state.pq.{unique}",
             "bucket": bucket, "prefix": "pq/", "format": "parquet", "key": ["tailnum"]},
            {"name": f"av-{unique}", "type": "s3_source", "connection": "s3", "topic": f"state.av.{unique}",
             "bucket": bucket, "prefix": "av/", "format": "avro", "key": ["carrier"]},
        ],
    })
    stats = run_once(pipeline)
    assert all(s.state == "caught_up" for s in stats.values()), {k: s.error for k, s in stats.items()}
    assert topic_state(kafka_conf, f"state.pq.{unique}") == {
        ("N1",): {"tailnum": "N1", "seats": 100, "seen": when}, ("N2",): {"tailnum": "N2", "seats": None, "seen": when}}
    assert topic_state(kafka_conf, f"state.av.{unique}") == {
        ("AA",): {"carrier": "AA", "name": "American"}, ("UA",): {"carrier": "UA", "name": "United"}}


def test_bad_row_names_object_and_row(s3: Any, s3_conn: Any, kafka: Any, kafka_conf: Any, unique: str,
                                      tmp_path: Any) -> None:
    from connectors.runtime.offsets import OffsetStore

    bucket = f"bad-{unique}"
    s3.create_bucket(Bucket=bucket)
    (tmp_path / "s.avsc").write_text(json.dumps(SCHEMA))
    body = b"id,name,amount,day\n1,a,1.5,\n2,b,not-a-number,\n3,c,2.5,\n"
    s3.put_object(Bucket=bucket, Key="b/x.csv", Body=body)
    name = f"bad-{unique}"
    pipeline = pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers}, "connections": _s3_connections(s3_conn),
        "sources": [{"name": name, "type": "s3_source", "connection": "s3", "topic": f"state.{unique}",
                     "bucket": bucket, "prefix": "b/", "format": "csv", "key": ["id"],
                     "value_schema": str(tmp_path / "s.avsc"), "batch_records": 1}],
    })
    (s,) = run_once(pipeline).values()
    assert s.state == "failed"
    for part in (name, f"s3://{bucket}/b/x.csv", "row 2", "'amount'"):
        assert part in s.error, s.error
    stored = OffsetStore(kafka_conf).load(name)
    assert stored["reading"]["key"] == "b/x.csv" and stored["reading"]["rows"] == 1 and stored["hwm"] is None
    assert sorted(topic_state(kafka_conf, f"state.{unique}")) == [(1,)]


def _csv_pipeline(kafka: Any, s3_conn: Any, name: str, topic: str, bucket: str, prefix: str, schema: Any,
                  batch_records: int = 10_000) -> Any:
    return pipeline_from_dict({
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers}, "connections": _s3_connections(s3_conn),
        "sources": [{"name": name, "type": "s3_source", "connection": "s3", "topic": topic, "bucket": bucket,
                     "prefix": prefix, "format": "csv", "key": ["id"], "value_schema": str(schema),
                     "batch_records": batch_records}],
    })


def _row(i: int, name: str = "x") -> dict[str, Any]:
    return {"id": i, "name": name, "amount": float(i), "day": None}


def test_unchanged_objects_are_skipped_by_etag_changed_ones_read(s3: Any, s3_conn: Any, kafka: Any, kafka_conf: Any,
                                                                 unique: str, tmp_path: Any) -> None:
    from connectors.runtime.offsets import OffsetStore

    bucket = f"etag-{unique}"
    s3.create_bucket(Bucket=bucket)
    (tmp_path / "s.avsc").write_text(json.dumps(SCHEMA))
    s3.put_object(Bucket=bucket, Key="e/a.csv", Body=_csv([_row(1), _row(2)]))
    s3.put_object(Bucket=bucket, Key="e/b.csv", Body=_csv([_row(3)]))
    name, topic = f"etag-{unique}", f"state.{unique}"
    pipeline = _csv_pipeline(kafka, s3_conn, name, topic, bucket, "e/", tmp_path / "s.avsc")
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert s.rows_read == 3
    stored = OffsetStore(kafka_conf).load(name)
    # the objects of the mark's second are known by their ETags; nothing else is listed in the position
    listed = {o["Key"]: o for o in s3.list_objects_v2(Bucket=bucket, Prefix="e/")["Contents"]}
    newest = max(o["LastModified"] for o in listed.values())
    assert stored["at_hwm"] == {k: o["ETag"] for k, o in listed.items() if o["LastModified"] == newest}

    # nothing changed: no object is read again (no GET), whatever the position holds
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert s.rows_read == 0

    # a replaced object (another ETag; maybe in the same second as the mark) is read again, the other one is not
    s3.put_object(Bucket=bucket, Key="e/a.csv", Body=_csv([_row(1, "new")]))
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert (s.produced - s.tombstones, s.tombstones) == (1, 1)  # a.csv's one row; key 2 left it
    assert topic_state(kafka_conf, topic) == {(1,): _row(1, "new"), (3,): _row(3)}  # key 2 left a.csv: tombstone


class _StopAfter(threading.Event):
    """A stop signal that fires once the runner produced ``records`` records (checked after every batch)."""

    def __init__(self, records: int) -> None:
        super().__init__()
        self.records = records
        self.runner: Any = None

    def is_set(self) -> bool:
        return super().is_set() or (self.runner is not None and self.runner.stats.produced >= self.records)


def test_a_read_resumes_mid_object(s3: Any, s3_conn: Any, kafka: Any, kafka_conf: Any, unique: str,
                                   tmp_path: Any) -> None:
    from connectors.runtime.offsets import OffsetStore

    bucket = f"mid-{unique}"
    s3.create_bucket(Bucket=bucket)
    (tmp_path / "s.avsc").write_text(json.dumps(SCHEMA))
    s3.put_object(Bucket=bucket, Key="m/big.csv", Body=_csv([_row(i) for i in range(1, 11)]))
    name, topic = f"mid-{unique}", f"state.{unique}"
    pipeline = _csv_pipeline(kafka, s3_conn, name, topic, bucket, "m/", tmp_path / "s.avsc", batch_records=2)

    # stopped after two batches of two rows: the position says 4 rows of the object are in the topic
    worker = SourceWorker(pipeline)
    (spec,) = task_specs(pipeline.sources)
    stop = _StopAfter(4)
    stop.runner = worker._runner(spec)
    stats = stop.runner.run(stop, once=True)
    assert stats.state == "stopped", stats.error
    stored = OffsetStore(kafka_conf).load(name)
    assert stored["reading"]["key"] == "m/big.csv" and stored["reading"]["rows"] == 4
    assert stored["hwm"] is None

    # the next run reads the same object (same ETag) from row 5 on
    (s,) = run_once(pipeline).values()
    assert s.state == "caught_up", s.error
    assert s.rows_read == 6
    assert sorted(topic_state(kafka_conf, topic)) == [(i,) for i in range(1, 11)]
    assert OffsetStore(kafka_conf).load(name)["reading"] is None
